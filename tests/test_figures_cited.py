"""Every figure the README and the results pages of docs/ quote is the one in its result file.

FIGURES maps each number printed in a checked section to a result file under benchmarks/results/, a
path into its JSON (or into the JSON lines of a GPU visit's ``.log``, where a reading was kept only there)
and the rounding it is printed with (the printed digits, after ``scale``). A number in
a checked section that FIGURES does not map, and that is not one of the section's SETTINGS (a printed
setting, reference or name, not a measurement), fails the test: a new figure cannot be added unchecked,
and a result file rewritten by a later run fails every figure that no longer matches it.
"""

from __future__ import annotations

import collections
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class Figure:
    """One printed number: ``text`` as printed in ``page``'s ``section`` (a heading; "" for the whole page),
    equal to the value at ``path`` in ``file`` times ``scale``, rounded to the decimals ``text`` prints.
    ``path``: keys and list indices joined by slashes; ``key=value`` (``&`` between several) picks the list
    item whose keys have these values. A ``.log`` file is the list of the JSON objects its lines print."""

    page: str
    section: str
    text: str
    file: str
    path: str
    scale: float = 1.0


# the sections whose numbers are checked: page -> headings ("" = the whole page)
CHECKED = {
    "README.md": ("Results",),
    "docs/results.md": ("",),
    "docs/decoding.md": ("Speed", "`translate`"),
    "docs/serving.md": ("Load",),
    "docs/parsing.md": ("Result",),
    "docs/table3.md": ("",),
    "docs/reliability.md": ("",),
    "docs/exports.md": ("CTranslate2", "Hugging Face transformers and ONNX"),
    "docs/scaling.md": ("Measured on one H100", "Measured on one H200 (issue 47, 2026-11-29)",
                        "Measured on one H200 (issue 47, 2026-12-04)"),
    "docs/training.md": ("Your own data", "After the paper"),
}

# numbers in checked sections that are settings, references or names, not measurements: (page, regular
# expression); "*" for every page. A page's own phrases must still be printed there.
SETTINGS: list[tuple[str, str]] = [
    # sizes written with a unit's suffix: vocabularies, step budgets, corpora, and §5.1's 25k tokens a batch
    ("*", r"\d+[kK](?:\s+|-)(?:joint\s+)?(?:BPE|sentencepiece|sentences|steps|word|token|tokens)\b"), ("*", r"~?25k\b"),
    ("*", r"\d+\s+CPU\s+cores"), ("*", r"\d+\s+threads"), ("*", r"beam\s+\d+"), ("*", r"batch\s+\d+"),
    ("*", r"α\s+\d\.\d"), ("*", r"d_model\s+\d+"), ("*", r"d_ff\s+\d+"), ("*", r"\d\+\d\s+layers"),
    ("*", r"Table\s+\d"), ("*", r"eq\.\s+\(\d\)"), ("*", r"et\s+al\.,?\s+\(?\d{4}"), ("*", r"test20\d\d"),
    ("*", r"wsj_\d+(–\d+)?"), ("*", r"[A-E]\d\b"), ("*", r"(average\s+of\s+)?the\s+last\s+\d+(\s+checkpoints)?"),
    ("*", r"[\d,]+\s+lines\s+at\s+a\s+time"), ("*", r"\d+\s+minutes"), ("*", r"\d+-minute"), ("*", r"[\d,]+-token\s+batches"),
    ("*", r"[Dd]ropout(\s+of)?\s+\d\.\d"), ("*", r"smoothing\s+\d\.\d"), ("*", r"seed\s+\d\b"), ("*", r"UTF-(8|16)"),
    ("*", r"AVX2"), ("*", r"AVX512-BF16"), ("*", r"\b20\d\d-\d\d-\d\d\b"), ("*", r"rank\s+\d+\b"),
    ("docs/decoding.md", r"\+\s+50\s+pieces"), ("docs/decoding.md", r"0-based"), ("docs/decoding.md", r"\d-best"),
    ("docs/decoding.md", r"Vilar\s+2018"), ("docs/decoding.md", r"and\s+16\s+pieces\s+more"),
    ("docs/table3.md", r"t\(0\.975,\s+n−1\)\s+·\s+s\s+·\s+√\(1\s+\+\s+1/n\)"),
    ("docs/table3.md", r"n\s+=\s+5\s+seeds"),
    ("docs/table3.md", r"~1\.55e-3"),  # eq. (3)'s peak at d_model 128, warmup 400, × 0.35
    ("docs/exports.md", r"1e-[456]"), ("docs/exports.md", r"\+\s+50"), ("docs/exports.md", r"\(5\s+\+\s+\|Y\|\)\s+/\s+6"),
    ("docs/exports.md", r"PAD\s+0,\s+EOS\s+1,\s+UNK\s+2"), ("docs/exports.md", r"id\s+0"),
    ("docs/exports.md", r"-1e4"), ("docs/exports.md", r"its\s+default,\s+1,"),
    ("docs/exports.md", r"up\s+to\s+40%"), ("docs/exports.md", r"§3\.5"),
    ("docs/exports.md", r"1,024\s+(positions|pieces)"),  # the exports' position tables (export.huggingface_model)
    ("docs/results.md", r"~8,192\s+tokens"), ("docs/results.md", r"smoothing\s+0\.1"),
    ("docs/results.md", r"β2\s+0\.9+8?"), ("docs/results.md", r"within\s+0\.5"),
    ("docs/results.md", r"every\s+50\s+updates"), ("docs/results.md", r"gain\s+(1/√2|1)\b"), ("docs/results.md", r"the\s+41\.5\s+the\s+issue"),
    ("docs/table3.md", r"19\s+rows\s+×\s+2\s+metrics\s+=\s+38\s+readings"), ("docs/table3.md", r"256-wide"),
    ("docs/scaling.md", r"gpu_visit_20\d\d-\d\d-\d\db?"), ("docs/scaling.md", r"[Ii]ssue\s+47"),
    ("docs/scaling.md", r"torch\s+2\.11"), ("docs/scaling.md", r"CUDA\s+13\.0"), ("docs/scaling.md", r"16-byte"),
    ("docs/scaling.md", r"the\s+40%\s+assumed"),  # the Cost section's assumed MFU
    ("docs/scaling.md", r"steps\s+\(200\)"),  # gpu.py's --curve default
    ("docs/scaling.md", r"[Gg]oals,\s+30%(\s+for\s+base)?\s+and\s+45%"),  # issue 47's MFU goals
    ("docs/scaling.md", r"8\s+micro-batches\s+of\s+~3,125\s+tokens"),
    ("docs/scaling.md", r"8\s+GPUs\s+×\s+3,125\s+tokens"),
    ("docs/scaling.md", r"N\s+=\s+\d+"), ("docs/scaling.md", r"8\s+·\s+2\^\(k/N\)"), ("docs/scaling.md", r"2\^-20"),
    ("docs/scaling.md", r"k\s+\+\s+1"), ("docs/scaling.md", r"max\(0,"),
    # another project's report (modelscope/FunASR#3704), not a measurement here
    ("docs/scaling.md", r"FunASR#3704"), ("docs/scaling.md", r"0\.44\s+s\s+forward\s+and\s+0\.55\s+s\s+backward"),
    # predicted, not measured: no result file holds them
    ("docs/scaling.md", r"about\s+−0\.75\s+ms"), ("docs/scaling.md", r"\(~1\.5–3\s+ms\)"),
    # the Cost section's estimates (`transformer params --cost`), which no result file holds
    ("docs/scaling.md", r"21\.3\s+GiB\s+estimated"), ("docs/scaling.md", r"\(12\.6\s+against"),
    # derived by arithmetic from result files' values and stored in none of them
    ("docs/scaling.md", r"not\s+0\.67\s+h"), ("docs/scaling.md", r"not\s+6\.8\s+h"),  # 24.1 / 81.5 ms × steps
    ("docs/scaling.md", r"take\s+1\.8\s+h"), ("docs/scaling.md", r"steps\s+8\.8\s+h"),  # 65.3 / 106.1 ms × steps
    ("docs/scaling.md", r"\(3×\s+fp32's\s+rate"), ("docs/scaling.md", r"5\.4×\s+for\s+big"),  # bf16 / fp32 tokens/s
    ("docs/scaling.md", r"by\s+~8%\s+between"),  # 64.3 against 59.6 ms, the 2026-11-29 visit's two calls
    ("docs/scaling.md", r"~1,200\s+kernels"),  # 1,176 and 1,168 kernels a compiled base step, rounded
    # the ×8 rows' step times less one batch's (698.5 − 64.3, 755.1 − 108.4 ms) × 20 steps / 27 new shapes
    ("docs/scaling.md", r"~0\.47–0\.48\s+s\s+per\s+new\s+shape"),
    ("docs/scaling.md", r"6\.7\s+ms\s+\(memory-efficient\)"), ("docs/scaling.md", r"cuDNN's\s+7\.9"),
    ("docs/scaling.md", r"10\.9\s+ms\s+against"),  # gpu_attention.json's sites summed
    ("docs/scaling.md", r"1\.0\s+h\s+on\s+one\s+H200"), ("docs/scaling.md", r"steps\s+6\.6\s+h"),  # ms × steps
    ("docs/scaling.md", r"base's\s+30\.8"), ("docs/scaling.md", r"big's\s+69\.4"),  # the step the MFU goals allow
    ("docs/scaling.md", r"1\.6%\s+apart"),  # 36.9 against 36.3 ms
    ("docs/scaling.md", r"1\.24×\s+\(base\)\s+and\s+1\.45×"),  # gpu_attention.json: cuDNN's ms / efficient's
    ("docs/scaling.md", r"~0\.25\s+ms\s+a\s+launch"),  # the custom operators' idle ms a step / 30 launches
    ("docs/scaling.md", r"by\s+37%\s+and\s+41%"),  # SASS instruction counts in gpu_visit_2026-12-04b/README.md
    ("docs/scaling.md", r"0\.92\s+ms\s+of\s+base's\s+step"),  # the two ReLU kernels' ms summed
    ("docs/scaling.md", r"5\.3%\s+and\s+3\.5%\s+more"), ("docs/scaling.md", r"~5%\s+more"),  # positions_vs_none − 1
    ("docs/scaling.md", r"idle\s+only\s+3\.6\s+ms"),  # step ms − kernel ms
    ("docs/scaling.md", r"~40\s+up\s+to\s+256\s+tokens"),  # the buckets 8 · 2^(k/8) below 256: 5 doublings × 8
    ("docs/training.md", r"WMT\s+2014"), ("docs/training.md", r"2\s+cores"),
    ("docs/training.md", r"0\.5,\s+1,000\s+updates"),  # the bf16-stream runs' lr_scale and length
    ("docs/training.md", r"gained\s+2%"),  # derived: 36.9 → 36.1 ms (gpu_train_headline.json)
]

def figures(page: str, section: str, file: str, *printed: tuple[str, str], scale: float = 1.0) -> list[Figure]:
    """The figures of one result file printed in one section: (text, path) pairs."""
    return [Figure(page, section, text, file, path, scale) for text, path in printed]


def quality_table(page: str, section: str) -> list[Figure]:
    """The Multi30k results table, as the README and docs/results.md print it."""
    return (figures(page, section, "multi30k_en_de.json", ("40.56", "tok_lc_bleu"), ("40.15", "sacrebleu"),
                    ("64.34", "chrf"), ("91.5", "train_minutes"), ("8,600", "steps"))
            + figures(page, section, "multi30k_en_de_wu2021.json", ("40.42", "tok_lc_bleu"), ("40.0", "sacrebleu"),
                      ("64.47", "chrf"), ("112.6", "cpu_time/budget_minutes"), ("8,000", "cpu_time/budget_updates"),
                      ("100", "cpu_time/updates_timed"))
            + figures(page, section, "multi30k_en_de_quick.json", ("37.87", "tok_lc_bleu"), ("37.5", "sacrebleu"),
                      ("60.7", "chrf"), ("10.0", "train_minutes"), ("2,255", "steps"))
            + figures(page, section, "multi30k_en_fr.json", ("61.44", "tok_lc_bleu"), ("60.37", "sacrebleu"),
                      ("75.81", "chrf"), ("97.4", "train_minutes"), ("8,600", "steps"))
            + figures(page, section, "published.json",
                      ("41.02", "wu2021_transformer_tiny_multi30k_en_de_test2016/tok_lc_bleu")))


def quick_candidates(file: str, *rows: tuple[str, str, str]) -> list[Figure]:
    """docs/results.md's table of the quick start's candidates: (name, updates, val BLEU) rows of one file."""
    return figures("docs/results.md", "", file, *[(text, f"candidates/name={name}/{key}") for name, steps, bleu in rows
                                                  for text, key in ((steps, "steps"), (bleu, "val_tok_lc_bleu"))])


SPEED = (("1.191", "ratios/train_vs_fairseq"), ("1.874", "ratios/translate_b64_vs_fairseq"),
         ("0.719", "ratios/translate_b64_vs_ctranslate2"), ("0.338", "ratios/translate_b1_vs_ctranslate2"),
         ("1.48", "int8/vs_ctranslate2_int8"), ("1.113", "ratios/train_vs_fairseq_min_max/0"),
         ("1.403", "ratios/train_vs_fairseq_min_max/1"), ("1.718", "ratios/train_bf16_vs_fp32"),
         ("1.581", "ratios/train_bf16_vs_fp32_min_max/0"), ("1.885", "ratios/train_bf16_vs_fp32_min_max/1"),
         ("0.649", "length_norm/b64_vs_ctranslate2"),
         ("0.69", "ratios/translate_b64_vs_ctranslate2_rounds/0"),
         ("0.812", "ratios/translate_b64_vs_ctranslate2_rounds/1"),
         ("0.329", "ratios/translate_b1_vs_ctranslate2_rounds/0"),
         ("0.342", "ratios/translate_b1_vs_ctranslate2_rounds/1"))

# docs/scaling.md's measured sections: one H100, then issue 47's visits to one H200
H100, H200_1, H200_2 = ("Measured on one H100", "Measured on one H200 (issue 47, 2026-11-29)",
                        "Measured on one H200 (issue 47, 2026-12-04)")

FIGURES: list[Figure] = [
    *quality_table("README.md", "Results"),
    *figures("README.md", "Results", "multi30k_en_de_wu2021.json",
             *[(t, f"replication/run={run}/test_theirs/tok_lc_bleu") for t, run in (
                 ("39.67", "wu_ls0.1"), ("38.61", "wu_ls0.1_seed2"), ("36.44", "wu_ls0"), ("36.73", "wu_ls0_seed2"),
                 ("39.87", "wu_ls0.1_lctok"), ("39.96", "wu_fork"), ("39.55", "wu_fork_seed2"))],
             ("40.03", "replication/run=wu_fork/test_theirs_lenpen/tok_lc_bleu"),
             ("39.70", "replication/run=wu_fork_seed2/test_theirs_lenpen/tok_lc_bleu"),
             ("38.54", "seed_band/low"), ("41.10", "seed_band/high"), ("38.90", "seed_band_lenpen/low"),
             ("41.21", "seed_band_lenpen/high"),
             ("40.36", "replication/run=wu_fork_qkv_seed6/test_theirs_lenpen/tok_lc_bleu"),
             ("39.32", "replication/run=wu_fork_lctok/test_theirs_lenpen/tok_lc_bleu"),
             ("40.74", "replication/run=wu_fork_qkv_seed5/test_theirs_lenpen/tok_lc_bleu"),
             ("40.34", "replication/run=wu_fork_qkv/test_theirs_lenpen/tok_lc_bleu"),
             ("40.29", "replication/run=wu_fork_qkv_seed2/test_theirs_lenpen/tok_lc_bleu"),
             ("40.53", "replication/run=wu_fork_qkv_seed3/test_theirs_lenpen/tok_lc_bleu"),
             ("39.35", "replication/run=wu_fork_qkv_seed4/test_theirs_lenpen/tok_lc_bleu"),
             ("40.65", "replication/run=wu_fork_epochs/test_theirs_lenpen/tok_lc_bleu"),
             ("39.52", "replication/run=wu_fork_epochs_seed2/test_theirs_lenpen/tok_lc_bleu"),
             ("40.22", "replication/run=wu_fork_epochs/test_theirs/tok_lc_bleu"),
             ("39.83", "replication/run=wu_fork_epochs_seed2/test_theirs/tok_lc_bleu")),
    *figures("README.md", "Results", "multi30k_en_de_wu2021.json", ("95", "seed_band/level"), scale=100),
    *figures("README.md", "Results", "multi30k_en_de_wu2021.json",
             ("0.94", "readings/first_run=wu_fork_epochs/vs_published_lenpen"),
             ("0.75", "readings/first_run=wu_fork_qkv/vs_published_lenpen"),
             ("0.28", "replication/run=wu_fork_qkv_seed5/vs_published_lenpen"),
             ("0.66", "replication/run=wu_fork_qkv_seed6/vs_published_lenpen"), scale=-1.0),
    *figures("README.md", "Results", "published.json",
             *[("41.02", "wu2021_transformer_tiny_multi30k_en_de_test2016/tok_lc_bleu")] * 4),
    *figures("README.md", "Results", "speed.json", *SPEED),
    *figures("README.md", "Results", "tried/speed_eee8c0c.json", ("1.253", "ratios/train_vs_fairseq")),
    *figures("README.md", "Results", "tried/speed_9d8bb88.json", ("1.123", "ratios/train_vs_fairseq")),
    *figures("README.md", "Results", "tried/speed_14acdcb.json", ("2.31", "ratios/train_bf16_vs_fp32")),
    *figures("README.md", "Results", "tried/speed_c012fb5.json", ("2.33", "ratios/train_bf16_vs_fp32")),
    *figures("README.md", "Results", "speed.json", ("318", "translate/ours_int8_b64/sents_per_s"),
             ("215", "translate/ctranslate2_int8_b64/sents_per_s"), ("315", "translate/ctranslate2_b64/sents_per_s")),
    *figures("docs/exports.md", "CTranslate2", "speed.json", ("990", "greedy_agreement/ctranslate2_identical"),
             ("1,000", "greedy_agreement/sentences")),
    *figures("docs/exports.md", "Hugging Face transformers and ONNX", "export.json",
             ("100.0", "greedy_identical/transformers"), ("99.9", "beam_identical/transformers"),
             ("96.1", "beam_alpha0.6_identical/transformers"), ("95.6", "beam_alpha0.6_identical/ctranslate2_from_hf"),
             scale=100.0),
    *figures("docs/exports.md", "Hugging Face transformers and ONNX", "export.json",
             ("34.0", "tok_lc_bleu/transformers/greedy"), ("34.12", "tok_lc_bleu/transformers/beam4_alpha0"),
             ("34.64", "tok_lc_bleu/transformers/beam4_alpha0.6"), ("34.47", "tok_lc_bleu/ours/beam4_alpha0.6"),
             ("282.3", "sentences_per_s/onnxruntime/greedy"), ("218.3", "sentences_per_s/ours/greedy")),
    *quality_table("docs/results.md", ""),
    *figures("docs/results.md", "", "multi30k_en_de_wu2021.json", ("8,000", "cpu_time/budget_updates"),
             *[(t, f"replication/run={run}/test_theirs/tok_lc_bleu") for t, run in (
                 ("36.44", "wu_ls0"), ("36.73", "wu_ls0_seed2"), ("39.67", "wu_ls0.1"), ("38.61", "wu_ls0.1_seed2"),
                 ("39.27", "wu_ls0.1_adam98"))],
             ("4,550", "replication/run=wu_ls0/steps"), ("5,800", "replication/run=wu_ls0_seed2/steps"),
             ("41.50", "picked/val_tok_lc_bleu"),
             ("39.96", "replication/run=wu_fork/test_theirs/tok_lc_bleu"), ("40.11", "replication/run=wu_fork/val_theirs"),
             ("5,450", "replication/run=wu_fork/steps"), ("15", "seed_band/n"), ("39.82", "seed_band/mean"),
             ("0.58", "seed_band/sd"), ("38.54", "seed_band/low"), ("41.10", "seed_band/high"),
             ("40.05", "seed_band_lenpen/mean"), ("0.50", "seed_band_lenpen/sd"), ("38.90", "seed_band_lenpen/low"),
             ("41.21", "seed_band_lenpen/high"),
             ("40.36", "replication/run=wu_fork_qkv_seed6/test_theirs_lenpen/tok_lc_bleu"),
             ("41.52", "replication/run=wu_fork_qkv_seed6/val_theirs_lenpen"),
             ("40.34", "replication/run=wu_fork_qkv_seed6/test_theirs/tok_lc_bleu"),
             ("6,018", "replication/run=wu_fork_qkv_seed6/steps"),
             ("5.50", "replication/run=wu_fork_qkv_seed6/valid_ppl"),
             ("40.74", "replication/run=wu_fork_qkv_seed5/test_theirs_lenpen/tok_lc_bleu"),
             ("41.91", "replication/run=wu_fork_qkv_seed5/val_theirs_lenpen"),
             ("40.72", "replication/run=wu_fork_qkv_seed5/test_theirs/tok_lc_bleu"),
             ("5,782", "replication/run=wu_fork_qkv_seed5/steps"),
             ("40.27", "readings/first_run=wu_fork_qkv/test_theirs_lenpen"),
             ("5.48", "replication/run=wu_fork_qkv_seed5/valid_ppl"),
             ("40.34", "replication/run=wu_fork_qkv/test_theirs_lenpen/tok_lc_bleu"),
             ("40.64", "replication/run=wu_fork_qkv/val_theirs_lenpen"),
             ("40.12", "replication/run=wu_fork_qkv/test_theirs/tok_lc_bleu"),
             ("6,767", "replication/run=wu_fork_qkv/steps"), ("5.53", "replication/run=wu_fork_qkv/valid_ppl"),
             ("40.29", "replication/run=wu_fork_qkv_seed2/test_theirs_lenpen/tok_lc_bleu"),
             ("41.15", "replication/run=wu_fork_qkv_seed2/val_theirs_lenpen"),
             ("40.14", "replication/run=wu_fork_qkv_seed2/test_theirs/tok_lc_bleu"),
             ("5,963", "replication/run=wu_fork_qkv_seed2/steps"),
             ("5.39", "replication/run=wu_fork_qkv_seed2/valid_ppl"),
             ("40.53", "replication/run=wu_fork_qkv_seed3/test_theirs_lenpen/tok_lc_bleu"),
             ("40.83", "replication/run=wu_fork_qkv_seed3/val_theirs_lenpen"),
             ("40.58", "replication/run=wu_fork_qkv_seed3/test_theirs/tok_lc_bleu"),
             ("6,633", "replication/run=wu_fork_qkv_seed3/steps"),
             ("5.49", "replication/run=wu_fork_qkv_seed3/valid_ppl"),
             ("39.35", "replication/run=wu_fork_qkv_seed4/test_theirs_lenpen/tok_lc_bleu"),
             ("41.44", "replication/run=wu_fork_qkv_seed4/val_theirs_lenpen"),
             ("39.16", "replication/run=wu_fork_qkv_seed4/test_theirs/tok_lc_bleu"),
             ("5,293", "replication/run=wu_fork_qkv_seed4/steps"),
             ("5.54", "replication/run=wu_fork_qkv_seed4/valid_ppl"),
             ("40.11", "gap/runs/run=wu_fork_qkv_seed4/precision_mean"),
             ("0.981", "gap/runs/run=wu_fork_qkv_seed4/length_ratio"),
             ("40.29", "gap/runs/run=wu_fork_qkv_seed2/precision_mean"),
             ("40.98", "gap/runs/run=wu_fork_qkv_seed5/precision_mean"),
             ("40.09", "readings/first_run=wu_fork_epochs/test_theirs_lenpen"),
             ("40.65", "replication/run=wu_fork_epochs/test_theirs_lenpen/tok_lc_bleu"),
             ("39.52", "replication/run=wu_fork_epochs_seed2/test_theirs_lenpen/tok_lc_bleu"),
             ("5.60", "replication/run=wu_ls0.1_adam98/valid_ppl"),
             ("5.70", "replication/run=wu_fork_epochs/valid_ppl"),
             ("5.75", "replication/run=wu_fork_epochs_seed2/valid_ppl"),
             ("40.65", "replication/run=wu_fork_epochs/test_theirs_lenpen/tok_lc_bleu"),
             ("39.52", "replication/run=wu_fork_epochs_seed2/test_theirs_lenpen/tok_lc_bleu"),
             ("8,000", "replication/run=wu_fork_lctok/steps"),
             ("39.32", "replication/run=wu_fork_lctok/test_theirs_lenpen/tok_lc_bleu"),
             ("39.61", "replication/run=wu_fork_lctok/val_theirs_lenpen"),
             ("39.23", "replication/run=wu_fork_lctok/test_theirs/tok_lc_bleu"),
             ("39.87", "replication/run=wu_ls0.1_lctok/test_theirs/tok_lc_bleu"),
             ("6,767", "replication/run=wu_fork_epochs/steps"), ("5,896", "replication/run=wu_fork_epochs_seed2/steps"),
             ("40.65", "replication/run=wu_fork_epochs/test_theirs_lenpen/tok_lc_bleu"),
             ("39.52", "replication/run=wu_fork_epochs_seed2/test_theirs_lenpen/tok_lc_bleu"),
             ("40.39", "replication/run=wu_fork_epochs/val_theirs_lenpen"),
             ("41.14", "replication/run=wu_fork_epochs_seed2/val_theirs_lenpen"),
             ("40.09", "readings/first_run=wu_fork_epochs/test_theirs_lenpen"),
             ("40.22", "replication/run=wu_fork_epochs/test_theirs/tok_lc_bleu"),
             ("39.83", "replication/run=wu_fork_epochs_seed2/test_theirs/tok_lc_bleu"),
             *[(t, f"replication/run={run}/test_theirs/tok_lc_bleu") for t, run in (
                 ("39.55", "wu_fork_seed2"), ("39.96", "wu_fork"), ("39.55", "wu_fork_seed2"))],
             ("40.29", "replication/run=wu_fork_seed2/val_theirs"), ("40.29", "replication/run=wu_fork_seed2/val_theirs"),
             ("40.11", "replication/run=wu_fork/val_theirs"), ("5,900", "replication/run=wu_fork_seed2/steps"),
             ("40.03", "replication/run=wu_fork/test_theirs_lenpen/tok_lc_bleu"),
             ("39.70", "replication/run=wu_fork_seed2/test_theirs_lenpen/tok_lc_bleu"),
             ("40.51", "replication/run=wu_fork/val_theirs_lenpen"),
             ("40.42", "replication/run=wu_fork_seed2/val_theirs_lenpen"),
             ("39.87", "replication/run=wu_ls0.1_lctok/test_theirs/tok_lc_bleu"),
             ("39.40", "replication/run=wu_ls0.1_lctok/val_theirs"), ("39.67", "replication/run=wu_ls0.1/test_theirs/tok_lc_bleu"),
             ("38.61", "replication/run=wu_ls0.1_seed2/test_theirs/tok_lc_bleu"),
             ("40.83", "replication/run=wu_ls0.1/val_theirs"), ("39.15", "replication/run=wu_ls0.1_seed2/val_theirs"),
             ("7,300", "replication/run=wu_ls0.1_lctok/steps"),
             ("41.74", "picked/val_per_seed/0"), ("41.26", "picked/val_per_seed/1"),
             ("40.83", "runs/name=wu_ls0.1/val/theirs/tok_lc_bleu"),
             ("41.35", "runs/name=pre_ls0.1/val/average_last5_b5_a1.0/tok_lc_bleu"), ("40.42", "tok_lc_bleu"),
             ("39.15", "replication/run=wu_ls0.1_seed2/val_theirs"), ("0.58", "seed_band/sd"),
             ("8,000", "cpu_time/budget_updates"), ("112.6", "cpu_time/budget_minutes"),
             ("100", "cpu_time/updates_timed")),
    *figures("docs/results.md", "", "multi30k_en_de_wu2021.json", ("1.06", "replication/run=wu_fork/vs_published"),
             ("1.06", "replication/run=wu_fork/vs_published"),
             ("2.41", "replication/run=wu_ls0.1_seed2/vs_published"),
             ("1.47", "replication/run=wu_fork_seed2/vs_published"),
             ("1.47", "replication/run=wu_fork_seed2/vs_published"),
             ("0.37", "replication/run=wu_fork_epochs/vs_published_lenpen"),
             ("0.94", "readings/first_run=wu_fork_epochs/vs_published_lenpen"),
             ("1.35", "replication/run=wu_ls0.1/vs_published"),
             ("1.70", "replication/run=wu_fork_lctok/vs_published_lenpen"),
             ("0.37", "replication/run=wu_fork_epochs/vs_published_lenpen"),
             ("0.68", "replication/run=wu_fork_qkv/vs_published_lenpen"),
             ("0.75", "readings/first_run=wu_fork_qkv/vs_published_lenpen"),
             ("0.28", "replication/run=wu_fork_qkv_seed5/vs_published_lenpen"),
             ("0.66", "replication/run=wu_fork_qkv_seed6/vs_published_lenpen"),
             ("0.99", "replication/run=wu_fork/vs_published_lenpen"),
             ("1.32", "replication/run=wu_fork_seed2/vs_published_lenpen"), scale=-1.0),
    *figures("docs/results.md", "", "multi30k_en_de_wu2021.json", ("40.34", "gap/precision_mean/mean"),
             ("41.03", "gap/published/precision_mean"), ("0.994", "gap/length_ratio/mean"),
             ("0.999", "gap/published/length_ratio"), ("41.24", "gap/runs/run=wu_fork_epochs/precision_mean"),
             ("0.986", "gap/runs/run=wu_fork_epochs/length_ratio"), ("39.52", "gap/precision_mean/min"),
             ("41.24", "gap/precision_mean/max"), ("0.981", "gap/length_ratio/min"), ("1.006", "gap/length_ratio/max")),
    *figures("docs/results.md", "", "multi30k_en_de_wu2021.json", ("95", "seed_band/level"), scale=100),
    *figures("docs/results.md", "", "published.json",
             *[("41.02", "wu2021_transformer_tiny_multi30k_en_de_test2016/tok_lc_bleu")] * 13),
    *figures("docs/results.md", "", "table3.json", ("0.86", "base_band/dev_bleu/sd")),
    *figures("docs/results.md", "", "multi30k_en_de.json", ("8,600", "candidates/name=pre_ff256_wu/steps")),
    *figures("docs/results.md", "", "multi30k_en_fr.json", ("8,600", "candidates/name=pre_ff256_wu/steps")),
    *figures("docs/results.md", "", "tried/multi30k_en_de_p_drop_0.2.json", ("39.74", "tok_lc_bleu")),
    *figures("docs/results.md", "", "tried/multi30k_en_de_p_drop_attn_relu_0.1.json", ("40.22", "tok_lc_bleu")),
    *figures("docs/results.md", "", "tried/multi30k_en_de_p_drop_attn_relu_0.1_run2.json", ("40.3", "tok_lc_bleu")),
    *figures("docs/results.md", "", "multi30k_en_de.json",
             ("41.19", "candidates/name=pre_ff256_wu/val_tok_lc_bleu"),
             ("40.97", "candidates/name=pre_ff512_lr2/val_tok_lc_bleu"),
             ("37.55", "candidates/name=post_ff256_lr0.5/val_tok_lc_bleu"),
             ("37.03", "candidates/name=pre_ff512_lr2_sw0.1/val_tok_lc_bleu"),
             ("40.86", "decoding_candidates/average_last=5&beam=4/val_tok_lc_bleu"),
             ("40.75", "decoding_candidates/average_last=10&beam=4/val_tok_lc_bleu"),
             ("40.75", "decoding_candidates/average_last=1&beam=4/val_tok_lc_bleu")),
    *figures("docs/results.md", "", "tried/multi30k_en_de_a03c4c1.json", ("40.03", "tok_lc_bleu"),
             ("41.43", "decoding_candidates/average_last=3&beam=5/val_tok_lc_bleu"),
             ("41.42", "decoding_candidates/average_last=3&beam=4/val_tok_lc_bleu")),
    *figures("docs/results.md", "", "multi30k_en_de_quick.json",
             ("36.31", "candidates/name=pre_ff512_lr1.0/val_tok_lc_bleu"),
             ("36.12", "candidates/name=pre_ff256_lr1.0/val_tok_lc_bleu"),
             ("37.3", "decoding_candidates/average_last=1&beam=4/val_tok_lc_bleu"),
             ("36.66", "decoding_candidates/average_last=5&beam=4/val_tok_lc_bleu"),
             ("37.87", "tok_lc_bleu")),
    *quick_candidates("tried/multi30k_en_de_quick_fp32.json", ("pre_ff512_lr0.5", "933", "24.78"),
                      ("pre_ff512_lr1.0", "920", "27.53"), ("pre_ff512_lr2.0", "973", "23.85"),
                      ("pre_ff256_lr1.0", "1,144", "30.16"), ("pre_ff256_lr2.0", "1,142", "25.39")),
    *quick_candidates("multi30k_en_de_quick.json", ("pre_ff512_lr0.5", "2,194", "34.82"),
                      ("pre_ff512_lr1.0", "2,165", "36.31"), ("pre_ff512_lr2.0", "2,208", "32.3"),
                      ("pre_ff256_lr1.0", "2,316", "36.12"), ("pre_ff256_lr2.0", "2,309", "32.56")),
    *figures("docs/results.md", "", "tried/multi30k_en_de_quick_fp32.json", ("33.09", "tok_lc_bleu")),
    *figures("docs/results.md", "", "tried/fresh_clone_06e2ae4.json", ("1,388", "quickstart/updates")),
    *figures("docs/results.md", "", "multi30k_en_fr.json",
             ("59.56", "candidates/name=pre_ff256_wu/val_tok_lc_bleu"),
             ("52.58", "candidates/name=post_ff256_lr0.5/val_tok_lc_bleu"),
             ("60.28", "decoding_candidates/average_last=10&beam=4/val_tok_lc_bleu"),
             ("60.22", "decoding_candidates/average_last=10&beam=5/val_tok_lc_bleu"),
             ("59.93", "decoding_candidates/average_last=3&beam=5/val_tok_lc_bleu"),
             ("5,863", "train_tokens_per_s")),
    *figures("docs/results.md", "", "tried/multi30k_en_fr_e6a711b.json", ("61.27", "tok_lc_bleu"),
             ("61.6", "train_minutes"), ("8,759", "train_tokens_per_s")),
    *figures("docs/decoding.md", "`translate`", "decoding_features.json",
             ("6e-6", "score_matches_beam"), ("888", "constraints"), ("7.12", "constraints_bleu_delta"),
             ("146.7", "constrained_sents_per_s"), ("210.8", "plain_sents_per_s"), ("1,100", "ensemble_runs/steps"),
             ("33.42", "ensemble_bleu"), ("33.38", "single_bleus/0/tok_lc_bleu"),
             ("32.5", "single_bleus/1/tok_lc_bleu")),
    *figures("docs/decoding.md", "`translate`", "constraint_kept.json", ("40", "sentences"),
             ("18", "after/beams/4/lower"), ("40", "after/beams/4/sentences"), ("27", "before/beams/4/lower"),
             ("8", "after/beams/8/lower"), ("39", "after/beams/8/sentences"), ("21", "before/beams/8/lower")),
    *figures("docs/decoding.md", "Speed", "bf16_decode.json", ("0.874", "bf16_vs_fp32/batch 1"),
             ("1.042", "bf16_vs_fp32/batch 64"), ("163.1", "speed_sents_per_s/batch 64/fp32/min"),
             ("186.4", "speed_sents_per_s/batch 64/fp32/max"), ("178.6", "speed_sents_per_s/batch 64/bf16/min"),
             ("195.9", "speed_sents_per_s/batch 64/bf16/max"), ("33.4", "speed_sents_per_s/batch 1/int8/median"),
             ("212.5", "speed_sents_per_s/batch 64/int8/median"), ("28.5", "speed_sents_per_s/batch 1/fp32/median"),
             ("173.1", "speed_sents_per_s/batch 64/fp32/median"), ("35.28", "quality/bf16/tok_lc_bleu"),
             ("35.32", "quality/fp32/tok_lc_bleu"), ("78", "quality/bf16/outputs_differing_from_fp32"),
             ("1,000", "sentences")),
    *figures("docs/decoding.md", "Speed", "tried/bf16_decode_43672cf.json", ("0.862", "bf16_vs_fp32/batch 1"),
             ("1.197", "bf16_vs_fp32/batch 64")),
    *figures("docs/decoding.md", "Speed", "cpu_decode.json", ("1.54", "models/quick/batches/1/speedup"),
             ("1.28", "models/quick/batches/64/speedup"),
             ("0.262", "models/quick/ctranslate2/ratios/translate_b1_vs_ctranslate2"),
             ("0.506", "models/quick/ctranslate2/ratios/translate_b64_vs_ctranslate2"),
             ("1.63", "models/quick/ctranslate2/ratios/int8_b64_vs_ctranslate2_int8"),
             ("88.52", "models/quick/ctranslate2/runs/ours_int8_b1/sents_per_s"),
             ("82.38", "models/quick/ctranslate2/runs/ours_b1/sents_per_s")),
    *figures("docs/decoding.md", "Speed", "gpu_decode.json", ("1.34", "models/quick/batches/1/speedup"),
             ("1.18", "models/quick/batches/64/speedup"), ("1.16", "models/small/batches/1/speedup"),
             ("1.21", "models/small/batches/64/speedup")),
    *figures("docs/decoding.md", "Speed", "speed.json", *SPEED,
             ("1.191", "ratios/train_vs_fairseq"),  # printed twice: beside eee8c0c's reading too
             ("2,639", "train/ours/tokens_per_s"), ("2,517", "train/ours/min"), ("2,799", "train/ours/max"),
             ("2,216", "train/fairseq/tokens_per_s"), ("1,995", "train/fairseq/min"),
             ("2,261", "train/fairseq/max"), ("3", "train/ours/runs"), ("4,535", "train/ours_bf16/tokens_per_s"),
             ("4,426", "train/ours_bf16/min"), ("4,744", "train/ours_bf16/max"), ("176.1", "matmul_peak_gflops"),
             ("226.41", "translate/ours_b64/sents_per_s"), ("120.84", "translate/fairseq_b64/sents_per_s"),
             ("314.88", "translate/ctranslate2_b64/sents_per_s"), ("48.04", "translate/ours_b1/sents_per_s"),
             ("20.99", "translate/fairseq_b1/sents_per_s"), ("142.13", "translate/ctranslate2_b1/sents_per_s"),
             ("318.18", "translate/ours_int8_b64/sents_per_s"), ("59.25", "translate/ours_int8_b1/sents_per_s"),
             ("214.92", "translate/ctranslate2_int8_b64/sents_per_s"),
             ("15.25", "translate/ctranslate2_int8_b1/sents_per_s"),
             ("204.44", "translate/ours_length_norm_b64/sents_per_s"),
             ("43.26", "translate/ours_length_norm_b1/sents_per_s"), ("0.304", "length_norm/b1_vs_ctranslate2"),
             ("0.903", "length_norm/b64_vs_gnmt"), ("31.66", "translate/ours_length_norm_b64/bleu"),
             ("1.874", "ratios/translate_b64_vs_fairseq"), ("1.76", "ratios/translate_b64_vs_fairseq_rounds/0"),
             ("1.938", "ratios/translate_b64_vs_fairseq_rounds/1"),
             ("1.433", "int8/vs_ctranslate2_int8_rounds/0"), ("1.48", "int8/vs_ctranslate2_int8_rounds/1"),
             ("0.647", "length_norm/b64_vs_ctranslate2_rounds/0"),
             ("0.712", "length_norm/b64_vs_ctranslate2_rounds/1"),
             ("0.3", "length_norm/b1_vs_ctranslate2_rounds/0"), ("0.342", "length_norm/b1_vs_ctranslate2_rounds/1"),
             ("0.877", "length_norm/b64_vs_gnmt_rounds/0"), ("0.962", "length_norm/b64_vs_gnmt_rounds/1"),
             ("1.31", "top_stop/b64_vs_bound_rounds/0"), ("1.408", "top_stop/b64_vs_bound_rounds/1"),
             ("0.935", "top_stop/b64_vs_ctranslate2_rounds/0"), ("1.063", "top_stop/b64_vs_ctranslate2_rounds/1"),
             ("31.67", "translate/ctranslate2_b64/bleu"), ("31.67", "translate/fairseq_b64/bleu"),
             ("31.54", "translate/ours_b64/bleu"),
             ("4.6", "user_model/seconds/ours/median"), ("1.68", "user_model/seconds/ctranslate2/median"),
             ("0.365", "user_model/ratios/exact_vs_ctranslate2"), ("1.24", "user_model/startup_s/ours"),
             ("0.09", "user_model/startup_s/ctranslate2"), ("4.2", "user_model/seconds/ours_top_stop/median"),
             ("0.4", "user_model/ratios/top_stop_vs_ctranslate2"), ("4.42", "user_model/seconds/ours/min"),
             ("4.67", "user_model/seconds/ours/max"), ("1.66", "user_model/seconds/ctranslate2/min"),
             ("1.72", "user_model/seconds/ctranslate2/max"), ("39.53", "user_model/bleu/ours_top_stop"),
             ("39.61", "user_model/bleu/ours"), ("1.322", "top_stop/b64_vs_bound"),
             ("0.95", "top_stop/b64_vs_ctranslate2"), ("31.51", "translate/ours_top_stop_b64/bleu"),
             ("990", "greedy_agreement/ctranslate2_identical"), ("988", "greedy_agreement/fairseq_identical"),
             ("1,000", "greedy_agreement/sentences")),
    # printed twice on the page: the table and a paragraph
    *figures("docs/decoding.md", "Speed", "speed.json", ("15.25", "translate/ctranslate2_int8_b1/sents_per_s"),
             ("142.13", "translate/ctranslate2_b1/sents_per_s"), ("31.54", "translate/ours_b64/bleu")),
    *figures("docs/decoding.md", "Speed", "tried/speed_e467d81.json", ("1.156", "ratios/train_vs_fairseq"),
             ("0.677", "ratios/translate_b64_vs_ctranslate2"), ("0.301", "ratios/translate_b1_vs_ctranslate2"),
             ("0.674", "ratios/translate_b64_vs_ctranslate2_rounds/0"),
             ("0.74", "ratios/translate_b64_vs_ctranslate2_rounds/1"),
             ("0.293", "ratios/translate_b1_vs_ctranslate2_rounds/0"),
             ("0.399", "ratios/translate_b1_vs_ctranslate2_rounds/1"), ("1.414", "int8/vs_ctranslate2_int8"),
             ("222.56", "translate/ctranslate2_int8_b64/sents_per_s"),
             ("314.74", "translate/ours_int8_b64/sents_per_s")),
    *figures("docs/decoding.md", "Speed", "tried/speed_2d0d444.json", ("1.677", "ratios/translate_b64_vs_fairseq"),
             ("0.713", "ratios/translate_b64_vs_ctranslate2"), ("0.307", "ratios/translate_b1_vs_ctranslate2"),
             ("1.725", "int8/vs_ctranslate2_int8"), ("180.13", "translate/ctranslate2_int8_b64/sents_per_s"),
             ("310.76", "translate/ours_int8_b64/sents_per_s"),
             ("180.13", "translate/ctranslate2_int8_b64/sents_per_s")),  # printed twice
    *figures("docs/decoding.md", "Speed", "tried/speed_529ba0e.json", ("1.16", "ratios/train_vs_fairseq"),
             ("1.8", "ratios/translate_b64_vs_fairseq"), ("0.662", "ratios/translate_b64_vs_ctranslate2"),
             ("0.369", "ratios/translate_b1_vs_ctranslate2"), ("1.29", "int8/vs_ctranslate2_int8"),
             ("255.25", "translate/ctranslate2_int8_b64/sents_per_s"),
             ("1.10", "ratios/train_vs_fairseq_min_max/0"), ("1.19", "ratios/train_vs_fairseq_min_max/1"),
             ("172.6", "matmul_peak_gflops"), ("5.1", "user_model/seconds/ours/median"),
             ("2.24", "user_model/seconds/ctranslate2/median"), ("0.438", "user_model/ratios/exact_vs_ctranslate2"),
             ("1.79", "user_model/seconds/ctranslate2/min"), ("2.25", "user_model/seconds/ctranslate2/max")),
    *figures("docs/decoding.md", "Speed", "tried/speed_9d8bb88.json",
             ("0.289", "ratios/translate_b1_vs_ctranslate2"), ("0.765", "ratios/translate_b64_vs_ctranslate2"),
             ("1.41", "int8/vs_ctranslate2_int8")),
    *figures("docs/decoding.md", "Speed", "ct2_backend.json", ("0.09", "int8_over_fp32_b1/picked"),
             ("229.05", "runs/picked_int8_b1_t1/sents_per_s"), ("11.9", "int8_b1_one_over_two_threads"),
             ("1.46", "int8_over_fp32_b1/picked_one_thread"), ("4.87", "runs/mkl_forced_int8_b1/sents_per_s")),
    *figures("docs/decoding.md", "Speed", "tried/speed_565a818.json", ("1.153", "ratios/train_vs_fairseq")),
    *figures("docs/decoding.md", "Speed", "tried/speed_14acdcb.json", ("1.139", "ratios/train_vs_fairseq"),
             ("1.104", "ratios/train_vs_fairseq_min_max/0"), ("1.192", "ratios/train_vs_fairseq_min_max/1"),
             ("2,991", "train/fairseq/tokens_per_s"), ("2.31", "ratios/train_bf16_vs_fp32"),
             ("2.239", "ratios/train_bf16_vs_fp32_min_max/0"), ("2.389", "ratios/train_bf16_vs_fp32_min_max/1"),
             ("180.7", "matmul_peak_gflops")),
    *figures("docs/decoding.md", "Speed", "tried/speed_c012fb5.json", ("1.164", "ratios/train_vs_fairseq"),
             ("207.5", "matmul_peak_gflops")),
    *figures("docs/decoding.md", "Speed", "tried/speed_4ce5185.json", ("1.217", "ratios/train_vs_fairseq"),
             ("1.054", "ratios/train_vs_fairseq_min_max/0"), ("1.37", "ratios/train_vs_fairseq_min_max/1"),
             ("159.4", "matmul_peak_gflops")),
    *figures("docs/decoding.md", "Speed", "tried/speed_eee8c0c.json", ("1.253", "ratios/train_vs_fairseq"),
             ("1.182", "ratios/train_vs_fairseq_min_max/0"), ("1.353", "ratios/train_vs_fairseq_min_max/1"),
             ("1.253", "ratios/train_vs_fairseq"), ("2,410", "train/ours/tokens_per_s"),
             ("2,410", "train/ours/tokens_per_s"), ("1,924", "train/fairseq/tokens_per_s"),
             ("1,924", "train/fairseq/tokens_per_s"), ("142.9", "matmul_peak_gflops"),
             ("142.9", "matmul_peak_gflops"), ("1.7", "ratios/train_bf16_vs_fp32")),
    *figures("docs/decoding.md", "Speed", "tried/speed_f5bdf0a.json", ("1.189", "ratios/train_vs_fairseq"),
             ("1.043", "ratios/train_vs_fairseq_min_max/0"), ("1.329", "ratios/train_vs_fairseq_min_max/1"),
             ("153.3", "matmul_peak_gflops"), ("153.3", "matmul_peak_gflops"), ("2,317", "train/ours/tokens_per_s"),
             ("1,948", "train/fairseq/tokens_per_s")),
    *figures("docs/decoding.md", "Speed", "batching.json",
             ("1.034", "corpora/0/rows/1/positions_vs_ours")),
    *figures("docs/decoding.md", "Speed", "speed.json", ("69", "train/ours/mfu"), ("58", "train/fairseq/mfu"),
             scale=100),
    *figures("README.md", "Results", "reliability.json", ("48", "faults_survived"), ("48", "faults_injected"),
             ("0", "lines_lost"), ("4", "foreign_files_refused"), ("4", "foreign_files"), ("0", "cli_tracebacks"),
             ("391", "cli_cases")),
    # only what a passing run always gives: the suite rewrites the file on every run, CI's included
    *figures("docs/reliability.md", "", "reliability.json", ("48", "faults_survived"), ("48", "faults_injected"),
             ("0", "lines_lost"), ("0", "partial_checkpoints_seen"), ("4", "foreign_files_refused"),
             ("4", "foreign_files"), ("0", "cli_tracebacks"), ("391", "cli_cases")),
    # in MB: the answer's byte count moves by a byte or so between runs (its floats' printed digits)
    *figures("docs/reliability.md", "", "reliability.json", ("7.4", "attention_worst_response_bytes"), scale=1e-6),
    *figures("README.md", "Results", "table3.json", ("2.6", "base_band/dev_bleu/half_width"),
             ("0.52", "base_band/dev_ppl/half_width"), ("1,200", "scale/updates")),
    *figures("docs/table3.md", "", "table3.json", ("1,200", "scale/updates"), ("3,600", "scale/big_updates"),
             ("4", "scale/factor"), ("31.37", "base_band/dev_bleu/min"), ("33.62", "base_band/dev_bleu/max"),
             ("0.86", "base_band/dev_bleu/sd"), ("7.869", "base_band/dev_ppl/min"), ("8.266", "base_band/dev_ppl/max"),
             ("0.17", "base_band/dev_ppl/sd"), ("2.6", "base_band/dev_bleu/half_width"),
             ("0.52", "base_band/dev_ppl/half_width"), ("1.9", "expected_false_findings"),
             ("32.68", "rows/row=base&seed=1/dev_bleu"), ("32.78", "base_band/dev_bleu/mean"),
             ("8.266", "rows/row=base&seed=1/dev_ppl"), ("8.085", "base_band/dev_ppl/mean"),
             ("1.48", "readings/row=C4/dev_ppl_delta"),
             ("1.476", "readings/row=D1/dev_ppl_delta"), ("0.741", "readings/row=D4/dev_ppl_delta"),
             ("1.692", "readings/row=C5/dev_ppl_delta"),
             ("0.759", "readings/row=C3/dev_ppl_delta"), ("0.596", "readings/row=D3/dev_ppl_delta")),
    # printed as a size ("worse by 2.81") or with a typographic minus sign (−1.391): the value is negative
    *figures("docs/table3.md", "", "table3.json", ("2.81", "readings/row=C4/dev_bleu_delta"),
             ("0.705", "readings/row=big/dev_ppl_delta"), ("0.59", "readings/row=big/paper_ppl_delta"),
             ("3.32", "readings/row=C5/dev_bleu_delta"), scale=-1),
    *figures("docs/table3.md", "", "table3_gpu.json", ("18.877", "readings/row=C5/dev_bleu_delta"),
             ("15.757", "readings/row=A1/dev_bleu_delta"), ("1.391", "readings/row=C4/dev_ppl_delta"),
             ("0.131", "readings/row=D1/dev_ppl_delta"), scale=-1),
    *figures("docs/table3.md", "", "table3.json", ("95", "base_band/level"), scale=100),
    # printed twice: in the rule and where a reading is set against it, or in the GPU comparison
    *figures("docs/table3.md", "", "table3.json", ("4", "scale/factor"), ("2.6", "base_band/dev_bleu/half_width"),
             ("1,200", "scale/updates"), ("0.596", "readings/row=D3/dev_ppl_delta"),
             ("0.52", "base_band/dev_ppl/half_width"), ("1.48", "readings/row=C4/dev_ppl_delta")),
    *figures("docs/table3.md", "", "table3.json", ("2.81", "readings/row=C4/dev_bleu_delta"),
             ("0.705", "readings/row=big/dev_ppl_delta"), scale=-1),
    *figures("docs/table3.md", "", "table3_gpu.json", ("2", "scale/factor"), ("2", "scale/factor")),
    *figures("docs/table3.md", "", "table3_pilot.json", ("32.68", "curves/pre/curve/2/dev_bleu"),
             ("11.65", "curves/post/curve/2/dev_bleu"), ("1.4", "curves/pre/lr_scale"),
             ("0.35", "curves/post/lr_scale"), ("1,200", "updates")),
    *figures("docs/table3.md", "", "table3_gpu.json", ("28.847", "base_band/dev_bleu/mean"),
             ("2.205", "readings/row=C3/dev_ppl_delta"), ("0.75", "readings/row=D3/dev_ppl_delta"),
             ("0.89", "readings/row=D4/dev_ppl_delta"), ("3.703", "readings/row=C4/dev_bleu_delta"),
             ("3.537", "readings/row=big/dev_ppl_delta"),
             ("2", "scale/factor")),
    *figures("README.md", "Results", "tried/fresh_clone_ac7c1cb.json", ("8,556", "quickstart/tokens_per_s"),
             ("1,338", "quickstart/updates"), ("35.36", "quickstart/tok_lc_bleu"), ("10", "quickstart/train_minutes")),
    *figures("README.md", "Results", "fresh_clone.json", ("2,976", "quickstart/tokens_per_s"),
             ("467", "quickstart/updates"), ("24.56", "quickstart/tok_lc_bleu")),
    *figures("README.md", "Results", "tried/fresh_clone_1d1668e.json", ("5,356", "quickstart/tokens_per_s"),
             ("837", "quickstart/updates"), ("32.05", "quickstart/tok_lc_bleu")),
    *figures("README.md", "Results", "tried/quick_speed_ab_88d2d74.json", ("150", "updates"),
             ("3,780", "mean_tokens_per_s/1d1668e"), ("3,749", "mean_tokens_per_s/88d2d74")),
    *figures("README.md", "Results", "multi30k_en_de_quick.json", ("13,273", "train_tokens_per_s")),
    *figures("README.md", "Results", "tried/fresh_clone_efbde6c.json", ("633", "quickstart/updates"),
             ("28.2", "quickstart/tok_lc_bleu")),
    *figures("README.md", "Results", "parsing.json", ("74.98", "f1"), ("60.0", "train_minutes"),
             ("16,064", "steps")),
    *figures("README.md", "Results", "gpu_visit_2026-12-04/gpu_train_headline.json",
             ("36.9", "rows/model=base&mode=bf16+compile/step_ms"),
             ("649,013", "rows/model=base&mode=bf16+compile/tgt_tokens_per_s"),
             ("79.5", "rows/model=big&mode=bf16+compile/step_ms"),
             ("301,482", "rows/model=big&mode=bf16+compile/tgt_tokens_per_s")),
    *figures("README.md", "Results", "gpu_visit_2026-12-04/gpu_train_headline.json",
             ("25.0", "rows/model=base&mode=bf16+compile/mfu"), ("39.3", "rows/model=big&mode=bf16+compile/mfu"),
             scale=100),
    *figures("docs/parsing.md", "Result", "parsing.json", ("60.0", "train_minutes"), ("16,064", "steps"),
             ("79.38", "dev/average_last10/f1"), ("79.07", "dev/average_last5/f1"),
             ("78.07", "dev/last/f1"), ("74.98", "f1"), ("74.04", "precision"), ("75.95", "recall"),
             ("73.73", "test_unconstrained/f1")),
    *figures("docs/parsing.md", "Result", "parsing.json", ("42.7", "test_unconstrained/well_formed_before_repair"),
             scale=100),
    *figures("docs/serving.md", "Load", "serve_load.json", ("1,000", "requests"), ("50", "clients"),
             ("102.53", "batched/requests_per_s"), ("21.0", "unbatched/requests_per_s"), ("4.88", "batching_gain"),
             ("463", "batched/p50_ms"), ("764", "batched/p99_ms")),
    # docs/scaling.md: the H100 run, then issue 47's three H200 visits (a visit's readings kept only in its
    # logs are read from them: train_cut_at_560s.log's objects are before's rows and profiles, 0-9, then after's)
    *figures("docs/scaling.md", H100, "gpu_train.json",
             *[(t, f"rows/model={model}&mode={mode}/{key}") for model, mode, *row in (
                 ("base", "fp32", "242.9", "98,857", "16.69"), ("base", "bf16", "80.5", "298,294", "15.71"),
                 ("base", "bf16+compile", "65.3", "367,399", "15.45"), ("big", "fp32", "702.5", "34,174", "27.46"),
                 ("big", "bf16", "128.9", "186,222", "23.98"), ("big", "bf16+compile", "106.1", "225,864", "23.45"))
               for t, key in zip(row, ("step_ms", "tgt_tokens_per_s", "peak_memory_gib"))],
             ("23.45", "rows/model=big&mode=bf16+compile/peak_memory_gib"),  # printed again: the estimates
             ("15.45", "rows/model=base&mode=bf16+compile/peak_memory_gib")),
    *figures("docs/scaling.md", H100, "gpu_train.json",
             *[(t, f"rows/model={model}&mode={mode}/mfu") for t, model, mode in (
                 ("3.8", "base", "fp32"), ("11.5", "base", "bf16"), ("14.1", "base", "bf16+compile"),
                 ("4.5", "big", "fp32"), ("24.3", "big", "bf16"), ("29.5", "big", "bf16+compile"))], scale=100),
    *figures("docs/scaling.md", H100, "fused_loss.json", ("6.7", "rows/base/fused/ms"),
             ("16.4", "rows/base/operators/ms"), ("2.46", "rows/base/speedup"), ("11.1", "rows/big/fused/ms"),
             ("20.3", "rows/big/operators/ms"), ("1.83", "rows/big/speedup"), ("1.2", "rows/base/fused/peak_extra_gib"),
             ("4.2", "rows/base/operators/peak_extra_gib")),
    *figures("docs/scaling.md", H100, "gpu_visit_2026-11-29/fused_loss.log",
             ("7.8", "d_model=512/fused/ms"), ("12.0", "d_model=1024/fused/ms")),
    *figures("docs/scaling.md", H200_1, "gpu_visit_2026-11-29/train_cut_at_560s.log",
             ("64.3", "0/step_ms"), ("50.9", "10/step_ms"), ("9.6", "0/peak_memory_gib"), ("7.6", "10/peak_memory_gib"),
             ("57.4", "2/step_ms"), ("46.5", "12/step_ms"), ("10.1", "2/peak_memory_gib"),
             ("8.1", "12/peak_memory_gib"), ("108.4", "4/step_ms"), ("95.8", "14/step_ms"),
             ("17.3", "4/peak_memory_gib"), ("15.3", "14/peak_memory_gib"),
             ("95.6", "6/step_ms"), ("18.2", "6/peak_memory_gib")),
    *figures("docs/scaling.md", H200_1, "gpu_visit_2026-11-29/train_cut_at_560s.log",
             ("35k", "model=base&mode=bf16 ×8/tgt_tokens_per_s"), ("33k", "model=big&mode=bf16 ×8/tgt_tokens_per_s")),
    *figures("docs/scaling.md", H200_1, "gpu_visit_2026-11-29/train_cut_at_560s.log",
             ("14.4", "0/mfu"), ("18.2", "10/mfu"), ("16.1", "2/mfu"), ("19.9", "12/mfu"), ("28.9", "4/mfu"),
             ("32.7", "14/mfu"), ("32.7", "6/mfu"), scale=100),
    *figures("docs/scaling.md", H200_1, "gpu_visit_2026-11-29/big_compile.json",
             ("81.0", "rows/model=big&mode=bf16+compile/step_ms"),
             ("16.2", "rows/model=big&mode=bf16+compile/peak_memory_gib"),
             ("7.6", "profiles/model=big/kernel_ms_per_step/layernorm")),
    *figures("docs/scaling.md", H200_1, "gpu_visit_2026-11-29/big_compile.json",
             ("38.6", "rows/model=big&mode=bf16+compile/mfu"), ("95", "profiles/model=big/gpu_busy"), scale=100),
    *figures("docs/scaling.md", H200_1, "gpu_visit_2026-12-04b/gpu_attention.json",
             ("4.2", "models/base/sites/dec_self/flash/ms_per_step"),
             ("3.3", "models/base/sites/dec_self/cudnn/ms_per_step"), ("11.2", "models/base/ms_per_step/cudnn"),
             ("9.0", "models/base/ms_per_step/efficient")),
    *figures("docs/scaling.md", H200_2, "gpu_visit_2026-12-04/gpu_train_curve.json",
             ("60.8", "before/rows/model=base&mode=bf16/step_ms"), ("44.9", "rows/model=base&mode=bf16/step_ms"),
             ("9.6", "before/rows/model=base&mode=bf16/peak_memory_gib"),
             ("6.7", "rows/model=base&mode=bf16/peak_memory_gib"), ("200", "curve/steps")),
    *figures("docs/scaling.md", H200_2, "gpu_visit_2026-12-04/gpu_train_curve.json",
             ("20.7", "rows/model=base&mode=bf16/mfu"), scale=100),
    *figures("docs/scaling.md", H200_2, "gpu_visit_2026-12-04/gpu_train_compile_pair.log",
             ("54.8", "model=base/step_ms"), ("10.1", "model=base/peak_memory_gib"), ("95.8", "model=big/step_ms"),
             ("18.2", "model=big/peak_memory_gib")),
    *figures("docs/scaling.md", H200_2, "gpu_visit_2026-12-04/gpu_train_headline.json",
             *[(t, f"rows/model={model}&mode={mode}/{key}") for model, mode, *row in (
                 ("base", "bf16+compile", "36.9", "7.3"), ("base", "bf16+cudagraphs", "36.1", "7.3"),
                 ("big", "bf16+compile", "79.5", "14.9"), ("big", "bf16+cudagraphs", "79.1", "14.9"))
               for t, key in zip(row, ("step_ms", "peak_memory_gib"))],
             ("33.3", "profiles/model=base/kernel_ms_total"), ("74.8", "profiles/model=big/kernel_ms_total"),
             ("3.7", "profiles/model=base/top_kernels/0/ms_per_step"),
             # printed again where the CUDA graphs' gain is read
             *[(t, f"rows/model={model}&mode={mode}/step_ms") for t, model, mode in (
                 ("36.9", "base", "bf16+compile"), ("36.1", "base", "bf16+cudagraphs"),
                 ("79.5", "big", "bf16+compile"), ("79.1", "big", "bf16+cudagraphs"))]),
    *figures("docs/scaling.md", H200_2, "gpu_visit_2026-12-04/gpu_train_headline.json",
             ("25.0", "rows/model=base&mode=bf16+compile/mfu"), ("25.5", "rows/model=base&mode=bf16+cudagraphs/mfu"),
             ("39.3", "rows/model=big&mode=bf16+compile/mfu"), ("39.5", "rows/model=big&mode=bf16+cudagraphs/mfu"),
             ("90", "profiles/model=base/gpu_busy"), ("94", "profiles/model=big/gpu_busy"), scale=100),
    *figures("docs/scaling.md", H200_2, "fused_loss.json",
             ("71", "kernel_alone/share_of_copy"), scale=100),
    *figures("docs/scaling.md", H200_2, "fused_loss.json",
             ("2.9", "kernel_alone/kernel_gb_s"), scale=1e-3),  # TB/s
    *figures("docs/scaling.md", H200_2, "gpu_visit_2026-12-04b/gpu_train_headline.log",
             ("36.3", "mode=bf16+compile/step_ms"), ("65", "mode=bf16+compile+kernel/step_ms")),
    *figures("docs/scaling.md", H200_2, "gpu_visit_2026-12-04b/gpu_layernorm_kernel.log",
             ("152", "1/base/kernel/kernel_us"), ("207", "2/base/compiled/kernel_us")),
    *figures("docs/scaling.md", H200_2, "shape_buckets.json",
             ("4,096", "max_tokens"), ("21", "rows/per_doubling=8/shapes"), ("27", "rows/per_doubling=16/shapes"),
             ("83", "rows/per_doubling=0/shapes"), ("116", "rows/per_doubling=0/batches")),
    *figures("docs/scaling.md", H200_2, "shape_buckets.json",
             ("8.8", "rows/per_doubling=8/padding_fraction"), ("7.2", "rows/per_doubling=16/padding_fraction"),
             ("3.9", "rows/per_doubling=0/padding_fraction"), scale=100),
    *figures("docs/training.md", "Your own data", "batching.json", ("4,096", "corpora/0/rows/0/max_tokens"),
             ("116", "corpora/0/rows/0/batches"), ("126", "corpora/0/rows/1/batches"),
             ("127", "corpora/0/rows/2/batches"),
             ("120", "corpora/2/rows/1/batches"), ("2,048", "corpora/2/rows/1/max_tokens")),
    *figures("docs/training.md", "Your own data", "batching.json", ("3.9", "corpora/0/rows/0/padding_fraction"),
             ("7.1", "corpora/0/rows/1/padding_fraction"), ("6.8", "corpora/0/rows/2/padding_fraction"),
             ("8.4", "corpora/2/rows/1/padding_fraction"), scale=100),
    *figures("docs/training.md", "After the paper", "selection/multi30k_en_de_quick/pre_ff256_lr1.0.json",
             ("2,316", "steps"), ("13,639", "train_tokens_per_s"), ("36.12", "val_tok_lc_bleu")),
    *figures("docs/training.md", "After the paper", "tried/selection/multi30k_en_de_quick_fp32/pre_ff256_lr1.0.json",
             ("1,144", "steps"), ("6,735", "train_tokens_per_s"), ("30.16", "val_tok_lc_bleu")),
    *figures("docs/training.md", "After the paper", "tried/fresh_clone_06e2ae4.json",
             ("8,173", "quickstart/tokens_per_s")),
    *figures("docs/training.md", "After the paper", "speed.json", ("1.7", "ratios/train_bf16_vs_fp32")),
    *figures("docs/training.md", "After the paper", "tried/speed_14acdcb.json", ("2.3", "ratios/train_bf16_vs_fp32")),
    *figures("docs/training.md", "After the paper", "bf16_stream_multi30k.json",
             ("3.557", "final_valid_nll/fp32_stream/seed1"), ("3.492", "final_valid_nll/fp32_stream/seed2"),
             ("3.569", "final_valid_nll/bf16_stream/seed1"), ("3.489", "final_valid_nll/bf16_stream/seed2")),
]


def read_path(data: object, path: str) -> object:
    for part in path.split("/"):
        if isinstance(data, list):
            if "=" in part:
                wanted = dict(term.split("=", 1) for term in part.split("&"))
                data = next(item for item in data if all(str(item.get(k)) == v for k, v in wanted.items()))
            else:
                data = data[int(part)]
        else:
            data = data[part]
    return data


@cache
def result(file: str) -> dict | list:
    """A result file's JSON; for a run's ``.log``, the JSON objects its lines print, in order (a line that is
    one object, after a label or not: ``base {...}``)."""
    text = (RESULTS / file).read_text(encoding="utf-8")
    if file.endswith(".log"):
        return [json.loads(m.group(1)) for m in re.finditer(r"^(?:\w+ )?(\{.*\})[ \t]*$", text, re.M)]
    return json.loads(text)


def section_text(page_text: str, heading: str) -> str:
    """The text under ``heading`` (any level) up to the next heading of the same or a higher level, with
    code blocks, inline code, link targets and images removed: numbers there are commands and paths."""
    if heading:
        match = re.search(rf"^(#+) {re.escape(heading)}\s*$", page_text, re.M)
        assert match, f"no heading {heading!r}"
        level = len(match.group(1))
        end = re.compile(rf"^#{{1,{level}}} ", re.M).search(page_text, match.end())
        page_text = page_text[match.end():end.start() if end else len(page_text)]
    text = re.sub(r"```.*?```", " ", page_text, flags=re.S)
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"^\s*\d+\.\s", " ", text, flags=re.M)  # list numbering
    return re.sub(r"`[^`]*`", " ", text)


# a number: not part of a word, a version (0.12.3.1) or a section reference (§6.1)
# a number, with its unit's suffix where one is glued to it ("35k", "63.1M"): a figure so written was skipped
NUMBER = re.compile(r"(?<![\w.§])\d[\d,]*(?:\.\d+)?(?:e-?\d+)?(?:[kKM](?![\w]|\.\d))?(?![\w]|\.\d)")


def numbers(text: str) -> list[tuple[int, int, str]]:
    found = [(m.start(), m.group().rstrip(",")) for m in NUMBER.finditer(text)]  # "4," in "beam 4, batch 64"
    return [(start, start + len(number), number) for start, number in found]


def unmapped(text: str, figures: list[str], settings: list[str]) -> list[str]:
    """The numbers in ``text`` that are neither inside one of the setting phrases nor a mapped figure;
    each entry of ``figures`` maps one occurrence of its text, so a number printed twice needs two."""
    covered = [(m.start(), m.end()) for pattern in settings for m in re.finditer(pattern, text)]
    left = collections.Counter(figures)
    out = []
    for start, end, number in numbers(text):
        if any(a <= start and end <= b for a, b in covered):
            continue
        if left[number]:
            left[number] -= 1
        else:
            out.append(number)
    return out


SUFFIX = {"k": 1e3, "K": 1e3, "M": 1e6}  # "35k": 35,296 in thousands, rounded as printed


def printed_value(figure: Figure) -> float:
    return float(figure.text.replace(",", "").rstrip("kKM"))


def matches(figure: Figure) -> tuple[bool, object]:
    value = read_path(result(figure.file), figure.path)
    unit = SUFFIX.get(figure.text[-1], 1.0)
    mantissa, _, exponent = figure.text.rstrip("kKM").partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    if exponent:  # printed in scientific notation: compare as many significant digits
        return float(f"{float(value) * figure.scale:.{decimals}e}") == printed_value(figure), value
    return round(float(value) * figure.scale / unit, decimals) == printed_value(figure), value


def page_text(page: str) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f"{f.page}:{f.text}:{f.file}:{f.path}")
def test_each_figure_is_its_result_files(figure: Figure):
    assert figure.section in CHECKED[figure.page], f"{figure.page}: section {figure.section!r} is not checked"
    assert figure.text in [n for _, _, n in numbers(section_text(page_text(figure.page), figure.section))], \
        f"{figure.page} ({figure.section or 'page'}) no longer prints {figure.text}: remove its FIGURES entry"
    ok, value = matches(figure)
    assert ok, f"{figure.page} prints {figure.text}, {figure.file} {figure.path} holds {value} (× {figure.scale})"


@pytest.mark.parametrize("page", sorted(CHECKED))
def test_every_number_in_a_checked_section_is_mapped(page: str):
    text = page_text(page)
    for section in CHECKED[page]:
        body = section_text(text, section)
        figures = [f.text for f in FIGURES if (f.page, f.section) == (page, section)]
        settings = [pattern for p, pattern in SETTINGS if p in (page, "*")]
        left = unmapped(body, figures, settings)
        assert not left, (f"{page} ({section or 'page'}): {left} are not in tests/test_figures_cited.py's FIGURES "
                          "(a measured figure: map it to its result file) or SETTINGS (a setting or a name)")


def test_every_setting_phrase_is_still_printed():
    for page, pattern in SETTINGS:
        if page != "*":
            body = " ".join(section_text(page_text(page), s) for s in CHECKED[page])
            assert re.search(pattern, body), f"{page} no longer prints {pattern!r}: remove it from SETTINGS"


def test_a_wrong_or_unmapped_figure_is_caught():
    """The checks can fail: a number not in the table, a figure that differs from its file in its last
    digit, and a setting phrase that covers only its own span."""
    text = "Training is 1.16× fairseq; beam 4 and 2.5 sentences/s."
    assert unmapped(text, ["1.16"], [r"beam \d+"]) == ["2.5"]
    assert unmapped(text, ["1.16", "2.5"], []) == ["4"]
    assert unmapped(text + " 1.16 again", ["1.16", "2.5"], [r"beam \d+"]) == ["1.16"]  # printed twice, mapped once
    # a kept run's file (1.161), which no later measurement rewrites
    good = Figure("README.md", "Results", "1.16", "tried/speed_529ba0e.json", "ratios/train_vs_fairseq")
    assert matches(good)[0]
    assert not matches(Figure("README.md", "Results", "1.17", "tried/speed_529ba0e.json", "ratios/train_vs_fairseq"))[0]
    assert read_path({"rows": [{"row": "A1", "x": 3}, {"row": "A1", "x": 4, "y": 1}]}, "rows/row=A1&y=1/x") == 4
    assert section_text("# A\none 1\n## B\ntwo `2` [x](y3.md)\n# C\nthree 3\n", "A") == "\none 1\n## B\ntwo   [x]\n"
    # a figure with its unit's suffix is a number too (a changed "35k" passed unseen), read in its unit
    assert unmapped("at 99k target tokens/s", [], []) == ["99k"]
    assert matches(Figure("docs/scaling.md", "", "35k", "gpu_visit_2026-11-29/train_cut_at_560s.log",
                          "model=base&mode=bf16 ×8/tgt_tokens_per_s"))[0]
    assert not matches(Figure("docs/scaling.md", "", "36k", "gpu_visit_2026-11-29/train_cut_at_560s.log",
                              "model=base&mode=bf16 ×8/tgt_tokens_per_s"))[0]


@pytest.mark.parametrize("page", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
                                  *sorted(str(p.relative_to(ROOT)) for p in RESULTS.rglob("*.md"))])
def test_every_relative_link_resolves(page: str):
    """The README, docs/ and the result pages link each other: a moved or renamed file, or a result page
    kept under tried/ with its sibling links unchanged, breaks no link; a link to a section of a page
    names a heading the page has (as GitHub makes its anchor), so a renamed section breaks none either."""
    text = re.sub(r"```.*?```", " ", page_text(page), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (ROOT / page).parent / file if file else ROOT / page
        assert path.exists(), f"{page} links {target}, which does not exist"
        if anchor and path.suffix == ".md":
            body = re.sub(r"```.*?```", " ", path.read_text(encoding="utf-8"), flags=re.S)
            anchors = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                       for h in re.findall(r"^#+ (.*)$", body, flags=re.M)}
            assert anchor in anchors, f"{page} links {target}: {path.name} has no such section"
