"""The exports against our own decoding: transformers' generate, ONNX Runtime and CTranslate2 converted from
the transformers export, beside ours and our own CTranslate2 export, on one run and test2016.

    python benchmarks/export.py [--run RUN] [--sentences 1000] [--batch 64]

For each engine and decoding (greedy; beam 4 with α 0; beam 4 with α 0.6): the fraction of lines
identical to ours, tokenized lowercased BLEU and sacreBLEU, and sentences/s (decoding only, models
loaded and run once on one batch first, ``torch.get_num_threads()`` threads everywhere). Every engine decodes the same batches: at most
``--batch`` sentences of one source length each. Ours limits each output to |source + EOS| + 50;
generate and CTranslate2 take one limit per batch, and in such a batch it is every sentence's own, so a
sentence that runs to its limit is cut where ours cuts it. α: ours is GNMT's ((5 + |Y|) / 6)^α, theirs
length^α, so at α 0.6 the beams may differ (reported, not a target). Writes
benchmarks/results/export.json and .md; run it alone on the machine (it is timed).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import sacrebleu
import torch

from transformer.checkpoint import list_checkpoints, load_checkpoint
from transformer.config import load_config
from transformer.evaluate import sacrebleu_scores, tok_lc_bleu
from transformer.export import HF_LN_EPS, export_ctranslate2, export_huggingface, export_onnx
from transformer.request import DecodeRequest
from transformer.translator import Translator

from common import ROOT, Split, recipe_run, trained_run
from provenance import add_results_option, git, results_folder, write_result

DECODINGS = {"greedy": (1, 0.0), "beam4_alpha0": (4, 0.0), "beam4_alpha0.6": (4, 0.6)}
ENGINES = ("transformers", "onnxruntime", "ctranslate2_from_hf", "ctranslate2_ours")


def batches(lengths: list[int], size: int) -> list[list[int]]:
    """Line indices in batches of at most ``size``, each of one source length (in pieces)."""
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_length.setdefault(n, []).append(i)
    return [group[i:i + size] for _, group in sorted(by_length.items()) for i in range(0, len(group), size)]


def in_batches(lines: list[str], groups: list[list[int]], translate) -> list[str]:
    """``translate`` (lines -> lines) over each batch, the outputs back in the lines' order."""
    out = [""] * len(lines)
    for group in groups:
        for i, hyp in zip(group, translate([lines[i] for i in group])):
            out[i] = hyp
    return out


class Engines:
    """Each engine's translate(lines, beam, alpha) -> lines, over the same batches."""

    def __init__(self, run: Path, folder: Path, batch: int, offset: int) -> None:
        from ctranslate2 import Translator as CT2
        from ctranslate2.converters import TransformersConverter
        from optimum.onnxruntime import ORTModelForSeq2SeqLM
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        log = lambda m: None  # noqa: E731
        hf_dir = export_huggingface(run, folder / "hf", log=log)
        self.tok = AutoTokenizer.from_pretrained(hf_dir)
        self.models = {"transformers": AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval(),
                       "onnxruntime": ORTModelForSeq2SeqLM.from_pretrained(export_onnx(run, folder / "onnx", log=log))}
        threads = torch.get_num_threads()
        from_hf = TransformersConverter(str(hf_dir)).convert(str(folder / "ct2_from_hf"))
        self.ct2 = {"ctranslate2_from_hf": CT2(from_hf, device="cpu", intra_threads=threads),
                    "ctranslate2_ours": CT2(str(export_ctranslate2(run, folder / "ct2_ours", log=log)), device="cpu",
                                            intra_threads=threads)}
        self.batch, self.offset = batch, offset

    def translate(self, engine: str, chunk: list[str], beam: int, alpha: float) -> list[str]:
        """One batch's translations."""
        ids = self.tok(chunk)["input_ids"]  # our ids, EOS appended
        limit = max(map(len, ids)) + self.offset  # outputs, EOS included (ours: per sentence; here per batch)
        if engine in self.models:
            batch = self.tok(chunk, return_tensors="pt", padding=True)
            with torch.inference_mode():
                outputs = self.models[engine].generate(**batch, num_beams=beam, length_penalty=alpha,
                                                       do_sample=False, max_length=limit + 1)  # + the start symbol
            return self.tok.batch_decode(outputs, skip_special_tokens=True)
        # the converted model takes the tokenizer's EOS; our export adds it itself; neither counts EOS
        eos = engine == "ctranslate2_from_hf"
        tokens = [self.tok.convert_ids_to_tokens(i if eos else i[:-1]) for i in ids]
        results = self.ct2[engine].translate_batch(tokens, beam_size=beam, length_penalty=alpha,
                                                   max_decoding_length=limit - 1, max_batch_size=self.batch)
        return [self.tok.convert_tokens_to_string(r.hypotheses[0]) for r in results]


def timed(fn) -> tuple[list[str], float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, help="run folder (default: the quick recipe's, from "
                        "benchmarks/results/multi30k_en_de_quick.json)")
    parser.add_argument("--sentences", type=int, default=1000, help="first N sentences of test2016")
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch, every engine")
    add_results_option(parser, "export.json / .md")
    args = parser.parse_args()
    results = results_folder(parser, args.results)
    run = trained_run(args.run or recipe_run("en_de_quick"), "; train the quick recipe, or pass --run")
    cfg = load_config(str(run / "config.toml"))
    test = Split(cfg, "test", args.sentences)
    ours = Translator(run, log=lambda m: None, device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        engines = Engines(run, Path(tmp), args.batch, cfg.decode.max_len_offset)
        groups = batches([len(ours.tokenizer.encode(line)) for line in test.src], args.batch)
        result: dict = {"identical": {}, "tok_lc_bleu": {}, "sacrebleu": {}, "sentences_per_s": {}}
        for name, (beam, alpha) in DECODINGS.items():
            request = DecodeRequest(beam_size=beam, alpha=alpha, batch_size=args.batch)
            warm = [test.src[i] for i in groups[len(groups) // 2]]  # one batch each, untimed: first-call setup
            ours.translate(warm, request)
            for engine in ENGINES:
                engines.translate(engine, warm, beam, alpha)
            want, seconds = timed(lambda: in_batches(test.src, groups, lambda b: ours.translate(b, request)))
            rows = {"ours": (want, seconds)}
            for engine in ENGINES:
                rows[engine] = timed(lambda: in_batches(
                    test.src, groups, lambda b: engines.translate(engine, b, beam, alpha)))
            for engine, (hyps, seconds) in rows.items():
                if engine != "ours":
                    same = sum(a == b for a, b in zip(hyps, want)) / len(want)
                    result["identical"].setdefault(engine, {})[name] = round(same, 4)
                result["tok_lc_bleu"].setdefault(engine, {})[name] = round(tok_lc_bleu(hyps, test.tok_ref, test.lang), 2)
                result["sacrebleu"].setdefault(engine, {})[name] = round(sacrebleu_scores(hyps, test.ref)["bleu"], 2)
                result["sentences_per_s"].setdefault(engine, {})[name] = round(len(hyps) / seconds, 1)
            print(name, {e: result["identical"].get(e, {}).get(name) for e in ENGINES},
                  {e: result["sentences_per_s"][e][name] for e in rows}, flush=True)
    hf = ("transformers", "onnxruntime", "ctranslate2_from_hf")
    result |= {
        "greedy_identical": {e: result["identical"][e]["greedy"] for e in hf},
        "beam_identical": {e: result["identical"][e]["beam4_alpha0"] for e in hf},
        "beam_alpha0.6_identical": {e: result["identical"][e]["beam4_alpha0.6"] for e in hf},
        "run": os.path.relpath(run, ROOT),
        "run_steps": load_checkpoint(list_checkpoints(run)[-1], with_state=False).meta["step"],
        "ln_eps": cfg.model.ln_eps, "hf_ln_eps": HF_LN_EPS, "sentences": len(test.src), "batch": args.batch,
        "batches": len(groups),
        "threads": torch.get_num_threads(), "commit": git("rev-parse", "--short", "HEAD"),
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     **{m: importlib.metadata.version(m) for m in ("transformers", "onnxruntime", "ctranslate2",
                                                                   "optimum", "optimum-onnx")},
                     "sacrebleu": sacrebleu.__version__},
    }
    write_result(results, "export", result, markdown)
    print(json.dumps({k: result[k] for k in ("greedy_identical", "beam_identical", "beam_alpha0.6_identical")}))


def markdown(r: dict) -> str:
    engines = ["ours", *ENGINES]
    rows = "\n".join(
        f"| {e} | " + " | ".join(
            f"{r['identical'][e][d] * 100:.1f}%" if e != "ours" else "–" for d in DECODINGS) + " | "
        + " | ".join(f"{r['tok_lc_bleu'][e][d]}" for d in DECODINGS) + " | "
        + " | ".join(f"{r['sentences_per_s'][e][d]}" for d in DECODINGS) + " |" for e in engines)
    drift = ("" if r["ln_eps"] == r["hf_ln_eps"] else
             f" The run was trained with LayerNorm ε {r['ln_eps']:g}; transformers' Marian and Pegasus fix it at "
             f"{r['hf_ln_eps']:g}, and CTranslate2's converter keeps theirs, so the three exported engines compute "
             "a slightly different function from ours; our own CTranslate2 export keeps the run's ε.")
    return f"""# The exports against our own decoding

`{r['command']}` — {r['date']}, commit {r['commit']}, {r['machine']}, {r['threads']} threads; versions
{', '.join(f'{k} {v}' for k, v in r['versions'].items())}.

Run `{r['run']}` ({r['run_steps']} updates), first {r['sentences']} sentences of test2016, the same
{r['batches']} batches for every engine (at most {r['batch']} sentences, each of one source length). transformers, onnxruntime and ctranslate2_from_hf decode `transformer export --format
huggingface` (onnxruntime through `--format onnx`, CTranslate2 through `ct2-transformers-converter`'s
converter); ctranslate2_ours is `transformer export --format ctranslate2`.{drift}

| engine | identical to ours: greedy | beam 4, α 0 | beam 4, α 0.6 | tok. lc BLEU: greedy | beam 4, α 0 | beam 4, α 0.6 | sentences/s: greedy | beam 4, α 0 | beam 4, α 0.6 |
|---|---|---|---|---|---|---|---|---|---|
{rows}

Ours stops each sentence at its source length + 50 pieces, the others at one limit per batch: in
batches of one source length the two are the same. At α 0.6 ours divides by GNMT's ((5 + |Y|) / 6)^α,
the others by |Y|^α.
"""


if __name__ == "__main__":
    main()
