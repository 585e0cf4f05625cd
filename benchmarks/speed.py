"""Training and translation speed, side by side with fairseq and CTranslate2 on this machine.

    python benchmarks/speed.py [--run runs/speed_small] [--train-runs 3] [--train-updates 250]
                               [--user-run RUN_DIR] [--no-peers] [--only SECTION]

The setup of ../shared/peers, run by this script itself so that every number comes from one run on
one machine: Multi30k EN→DE, one joint sentencepiece BPE of 8,000 pieces, the `small` preset
("bench-small": 3+3 layers, d_model 256, d_ff 1024, 4 heads, shared embeddings, post-norm), batches
of at most 4096 tokens per side, 2 threads, fp32.

Every measured process, ours and the peers', is a process of its own started with the same
settings: 2 threads, glibc's malloc told to keep freed memory (MALLOC_MMAP_THRESHOLD_ and
MALLOC_TRIM_THRESHOLD_, the values transformer/runtime.py sets in our own processes), and in the
Python ones (ours, fairseq) denormal floats flushed to zero, as our trainer does. CTranslate2's
threads are its own: it gets the environment, not the flush (its C++ threads cannot be reached).

1. Peak: the fp32 matmul FLOP/s torch reaches here (2048³ `torch.mm`, median of 11).
2. Training: --train-runs runs of each system, alternating (ours, ours in bf16, fairseq, ours, ...),
   each --train-updates updates from scratch (log every 10). A run's target tokens/s is the median over
   its 10-update intervals after update 30; reported: every run's, and the median with min and max. MFU =
   tokens/s × training FLOPs per target token (`flops_per_token` at the data's mean lengths) / peak
   (fp32's: none for the bf16 row). `ours_bf16` (train.precision = "bf16", what "auto" picks on a CPU
   with bf16 units) is measured against our fp32, not against fairseq, which trains in fp32 on a CPU.
   With --only train, 1 and 2 alone, written into speed.json in place of its training figures (the
   other figures stay as measured; `remeasured` holds the commit and date of the new ones): a check of
   the trainer's speed without the hour the rest needs.
3. Translation of test2016 (1,000 sentences; the first --b1-sentences at batch 1), beam 4, α 0.6,
   maximum length input + 50, with the weights of one model of ours (--run, trained for
   --train-minutes when it does not exist) in every system: ours (fp32, int8 dynamic quantization,
   fp32 with OpenNMT-py's stopping rule `--early-stop top`, and fp32 ranking finished hypotheses
   as the peers do, `--length-norm length`), CTranslate2 fp32 and int8
   (`transformer export`), fairseq (the weights converted into a fairseq checkpoint whose learned
   position table holds our sinusoids; shown to compute what ours does by its greedy outputs on
   test2016, counted). The timings go in --repeat rounds: a round times each system once, in a process
   of its own (model loaded outside the timing) after one untimed pass, so that the machine's drift
   reaches every system alike. A system's rate is its best round's; each ratio also gets its range
   over the rounds (`..._rounds`: round i against round i). Every system must return as many sentences
   as it was given. fairseq and CTranslate2 normalise by length^α, we by GNMT's ((5+|Y|)/6)^α unless
   told `--length-norm length`. With --only translate, 3 alone (after training --run if it has no
   model yet), in the same way.
4. The model users train (--user-run: the Multi30k EN→DE recipe, d_model 128, 4+4 layers, pre-norm),
   translated as a user runs each system, whole processes timed from start to exit on test2016's
   1,000 sentences: `transformer translate` (the paper's search, and `--early-stop top`) against a
   short CTranslate2 script (sentencepiece in, `translate_batch`, sentencepiece out) on the same
   averaged weights; and each one's start-up: the same command on an empty input. Median of 3,
   interleaved. With --only user, 4 alone.

fairseq (fairseq-fixed 0.12.3.1 with torch 2.13.0 CPU) lives in its own virtual environment, built on
first use under $TRANSFORMER_PEER_VENV (default ~/.cache/transformer-bench/fairseq); CTranslate2
comes with our `[dev]` / `[export]` extra. Neither is a dependency of the package.

Writes benchmarks/results/speed.json and speed.md. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import sacrebleu
import torch

from transformer.checkpoint import list_checkpoints, load_checkpoint
from transformer.config import Config, load_config
from transformer.data import read_lines
from transformer.prepare import resolve_data_path
from transformer.export import export_ctranslate2
from transformer.model import flops_per_token, sinusoidal_positions
from transformer.tokenizer import EOS_ID, UNK_ID, Tokenizer
from transformer.train import train
from transformer.vocabulary import open_vocabulary

from common import ROOT, recipe_run
from provenance import RESULTS, add_results_option, code_state, results_folder, write_result, write_whole

HERE = Path(__file__).resolve().parent
PEER_VENV = Path(os.environ.get("TRANSFORMER_PEER_VENV", Path.home() / ".cache" / "transformer-bench" / "fairseq"))
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
# what every measured process gets (see the docstring); the malloc values are runtime.keep_freed_memory's
PROCESS_ENV = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
               "MALLOC_TRIM_THRESHOLD_": str((1 << 31) - 1)}
SMALL = ['data.train_src="multi30k/train.en.gz"', 'data.train_tgt="multi30k/train.de.gz"',
         'data.valid_src="multi30k/val.en.gz"', 'data.valid_tgt="multi30k/val.de.gz"', "train.threads=2",
         "train.log_every=10", "train.eval_every=1000000", "train.save_every=0", "train.save_minutes=0",
         "decode.average_last=1",
         # a short warmup so the translation model of a short run is a real one (peers: 30.6 BLEU in 30 min)
         "train.warmup_steps=400", "train.lr_scale=0.32"]
FAIRSEQ_MODEL = ["--arch", "transformer", "--encoder-layers", "3", "--decoder-layers", "3",
                 "--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
                 "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
                 "--decoder-attention-heads", "4", "--activation-fn", "relu", "--dropout", "0.1",
                 "--attention-dropout", "0.0", "--activation-dropout", "0.0"]
FAIRSEQ_OPTIM = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--optimizer", "adam",
                 "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9", "--clip-norm", "0.0", "--lr", "1e-3",
                 "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000", "--warmup-init-lr", "1e-7",
                 "--max-tokens", "4096", "--cpu", "--num-workers", "0", "--seed", "1", "--log-format", "simple",
                 "--log-interval", "10"]
DECODE = {"beam": 4, "alpha": 0.6, "max_len_offset": 50}
# the options of one section alone (--only refuses another section's), and their defaults
SECTION_OPTIONS = {"train": ("train_runs", "train_updates"), "translate": ("train_minutes", "b1_sentences", "repeat"),
                   "user": ("user_run",)}
# the peers each section measures against: (name, key in versions); fairseq only where it was run
SECTION_PEERS = {"train": (("fairseq", "fairseq"),),
                 "translate": (("fairseq", "fairseq"), ("CTranslate2", "ctranslate2")),
                 "user": (("CTranslate2", "ctranslate2"),)}
DEFAULTS = {"train_minutes": 15.0, "train_runs": 3, "train_updates": 250, "b1_sentences": 200, "repeat": 3}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(cmd: list[str], out: Path | None = None, env: dict | None = None) -> str:
    """Runs a command with the measured processes' settings; its output goes to ``out`` (and is
    returned). Fails loudly with the output's tail."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **PROCESS_ENV, **(env or {})})
    text = proc.stdout + proc.stderr
    if out:
        out.write_text(text, encoding="utf-8")
    if proc.returncode:
        raise RuntimeError(f"{' '.join(map(str, cmd[:3]))} ... failed ({proc.returncode}):\n{text[-3000:]}")
    return text


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


# ---------------------------------------------------------------------------------------------- setup
def fairseq_venv() -> Path:
    """The peer environment's bin/ folder, built on first use (~5 minutes: fairseq compiles)."""
    bin_dir = PEER_VENV / "bin"
    if (bin_dir / "fairseq-train").exists():
        return bin_dir
    log(f"building the fairseq environment in {PEER_VENV} (once)")
    sh([sys.executable, "-m", "venv", str(PEER_VENV)])
    pip = [str(bin_dir / "python"), "-m", "pip", "install", "-q"]
    sh(pip + ["torch==2.13.0"])
    sh(pip + ["numpy<2", "cffi", "cython", "setuptools", "wheel", "hydra-core==1.3.2", "omegaconf==2.3.0",
              "regex", "sacrebleu", "tqdm", "bitarray", "scikit-learn", "packaging", "sentencepiece", "safetensors"])
    # --no-deps: its torchaudio requirement would pull another torch; built against the torch above
    sh(pip + ["--no-deps", "--no-build-isolation", "fairseq-fixed==0.12.3.1"], env={"MAX_JOBS": "2"})
    return bin_dir


def matmul_peak(n: int = 2048, reps: int = 11) -> float:
    """fp32 GFLOP/s of torch.mm on n×n matrices (2n³ FLOPs), median of ``reps``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times) / 1e9


def write_pieces(tok: Tokenizer, out: Path) -> dict[str, float]:
    """Piece files of every split for fairseq, the fairseq dictionary, and mean lengths (with EOS)."""
    out.mkdir(parents=True, exist_ok=True)
    vocab = tok.vocabulary()
    means = {}
    for split, name in SPLITS.items():
        for lang in ("en", "de"):
            lines = read_lines(resolve_data_path(f"multi30k/{name}.{lang}.gz"))
            ids = tok.encode_batch(lines)
            (out / f"{split}.{lang}").write_text("".join(" ".join(vocab[i] for i in s) + "\n" for s in ids),
                                                 encoding="utf-8")
            if split == "test":  # the batch-1 subset
                (out / f"test1.{lang}").write_text("".join(" ".join(vocab[i] for i in s) + "\n" for s in ids[:200]),
                                                   encoding="utf-8")
            if split == "train":
                means[lang] = sum(len(s) + 1 for s in ids) / len(ids)
    # fairseq adds <s> <pad> </s> <unk> itself; every other piece keeps our order (id = ours + 1)
    (out / "dict.txt").write_text("".join(f"{p} 1\n" for p in vocab[3:]), encoding="utf-8")
    return means


def interval_median(rates: list[tuple[int, float]], skip: int = 30) -> tuple[float, int]:
    """Median of per-interval tokens/s for intervals ending after update ``skip``; and their count."""
    kept = [r for step, r in rates if step > skip]
    if not kept:
        raise RuntimeError("no training intervals after warm-up were logged")
    return statistics.median(kept), len(kept)


# ---------------------------------------------------------------------------------------------- training
def rates_of(metrics: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["tokens_per_s"]) for r in map(json.loads, metrics.open()) if "tokens_per_s" in r]


def train_ours(run: Path, updates: int, precision: str = "fp32") -> list[tuple[int, float]]:
    """One timed run of our trainer from scratch, as a user starts it; its logged 10-update rates."""
    shutil.rmtree(run, ignore_errors=True)
    sets = [x for o in SMALL + [f"train.max_steps={updates}", f'train.precision="{precision}"'] for x in ("--set", o)]
    sh([sys.executable, "-m", "transformer", "train", "small", "--out", str(run), "--quiet", *sets],
       run.parent / f"{run.name}.log")
    return rates_of(run / "metrics.jsonl")


def train_fairseq(bin_dir: Path, data_bin: Path, work: Path, updates: int, name: str) -> list[tuple[int, float]]:
    """One timed fairseq-train run from scratch (through fairseq_worker.py); its logged 10-update rates."""
    text = sh([str(bin_dir / "python"), str(HERE / "fairseq_worker.py"), "train", str(data_bin), *FAIRSEQ_MODEL,
               "--share-all-embeddings", *FAIRSEQ_OPTIM, "--max-update", str(updates), "--no-save",
               "--disable-validation", "--save-dir", str(work / "unused")], work / f"{name}.log")
    rates = []
    for line in text.splitlines():
        m = re.search(r"wps=([\d.]+).*num_updates=(\d+)", line)
        if m and "train_inner" in line:
            rates.append((int(m.group(2)), float(m.group(1))))
    return rates


def train_speed(bin_dir: Path | None, data_bin: Path, work: Path, runs: int, updates: int, flops: float,
                peak: float) -> tuple[dict, dict]:
    """Alternating runs of equal length: ours, ours in bf16, fairseq, ours, ... Returns (per-run tokens/s
    by system, summary by system)."""
    per_run: dict[str, list[int]] = {"ours": [], "ours_bf16": []} | ({"fairseq": []} if bin_dir else {})
    for i in range(runs):
        for name, precision in (("ours", "fp32"), ("ours_bf16", "bf16")):
            log(f"training run {i + 1} of {runs}: {name}, {updates} updates")
            tps, _ = interval_median(train_ours(work / f"train_{name}_{i}", updates, precision))
            per_run[name].append(round(tps))
            log(f"{name}: {tps:.0f} target tokens/s")
        if bin_dir:
            log(f"training run {i + 1} of {runs}: fairseq, {updates} updates")
            tps, _ = interval_median(train_fairseq(bin_dir, data_bin, work, updates, f"train_fairseq_{i}"))
            per_run["fairseq"].append(round(tps))
            log(f"fairseq: {tps:.0f} target tokens/s")
    summary = {name: {"tokens_per_s": round(statistics.median(v)), "min": min(v), "max": max(v), "runs": len(v),
                      "updates": updates, "mfu": None if name == "ours_bf16" else
                      round(statistics.median(v) * flops / (peak * 1e9), 4)}
               for name, v in per_run.items()}
    return per_run, summary


def pieces_and_peers(args: argparse.Namespace, work: Path, tok: Tokenizer) -> tuple[Path | None, Path, dict]:
    """The pieces of every split in ``tok``'s vocabulary, fairseq's environment and its binarized data.
    Returns fairseq's bin/ folder (None with --no-peers), its data folder, and the mean lengths."""
    work.mkdir(parents=True, exist_ok=True)
    means = write_pieces(tok, work / "pieces")
    bin_dir = None if args.no_peers else fairseq_venv()
    data_bin = work / "fairseq_bin"
    if bin_dir and not data_bin.is_dir():  # binarized into a temporary folder, renamed when whole
        p, partial = work / "pieces", work / "fairseq_bin.partial"
        shutil.rmtree(partial, ignore_errors=True)
        sh([str(bin_dir / "fairseq-preprocess"), "--source-lang", "en", "--target-lang", "de",
            "--trainpref", str(p / "train"), "--validpref", str(p / "valid"), "--testpref", str(p / "test"),
            "--destdir", str(partial), "--srcdict", str(p / "dict.txt"), "--joined-dictionary", "--workers", "2"],
           work / "fairseq_preprocess.log")
        partial.rename(data_bin)
    return bin_dir, data_bin, means


def training(args: argparse.Namespace, work: Path, cfg: Config, vocab_size: int, bin_dir: Path | None,
             data_bin: Path, means: dict) -> dict:
    """Sections 1 and 2: the peak, then the alternating training runs; speed.json's training keys."""
    log("fp32 matmul peak")
    peak = matmul_peak()
    log(f"peak {peak:.0f} GFLOP/s")
    flops = flops_per_token(cfg.model, vocab_size, means["en"], means["de"])
    runs, summary = train_speed(bin_dir, data_bin, work, args.train_runs, args.train_updates, flops, peak)
    paired = "fairseq" in summary
    ratios = {"train_vs_fairseq": round(summary["ours"]["tokens_per_s"] / summary["fairseq"]["tokens_per_s"], 3)
              if paired else None,
              "train_vs_fairseq_min_max": [round(min(runs["ours"]) / max(runs["fairseq"]), 3),
                                           round(max(runs["ours"]) / min(runs["fairseq"]), 3)] if paired else None,
              "train_bf16_vs_fp32": round(summary["ours_bf16"]["tokens_per_s"] / summary["ours"]["tokens_per_s"], 3),
              "train_bf16_vs_fp32_min_max": [round(min(runs["ours_bf16"]) / max(runs["ours"]), 3),
                                             round(max(runs["ours_bf16"]) / min(runs["ours"]), 3)]}
    return {"matmul_peak_gflops": round(peak, 1), "flops_per_tgt_token": round(flops),
            "mean_lengths": {k: round(v, 2) for k, v in means.items()}, "train_runs": runs, "train": summary,
            "mfu": summary["ours"]["mfu"], "train_ratios": ratios}


def translation_model(args: argparse.Namespace) -> None:
    """--run trained for --train-minutes when it has no checkpoint yet (not timed)."""
    if not list_checkpoints(args.run):
        log(f"training our translation model for {args.train_minutes} min into {args.run} (not timed)")
        train(load_config("small", SMALL + [f"train.max_minutes={args.train_minutes}", "train.max_steps=1000000"]),
              args.run, quiet=True)


def translating(args: argparse.Namespace, work: Path, tok: Tokenizer, bin_dir: Path | None, data_bin: Path) -> dict:
    """Section 3: the same weights in every system; speed.json's translation keys."""
    last = list_checkpoints(args.run)[-1]
    for q in ("float32", "int8"):
        export_ctranslate2(args.run, work / f"ct2_{q}", last, None if q == "float32" else "int8", overwrite=True,
                           log=log)
    ours, py = {"run": str(args.run), "checkpoint": str(last)}, Path(sys.executable)
    systems = {"ours": (py, "speed_worker.py", "ours", ours),
               "ours_int8": (py, "speed_worker.py", "ours_int8", ours),
               "ours_top_stop": (py, "speed_worker.py", "ours", ours | {"early_stop": "top"}),
               "ours_length_norm": (py, "speed_worker.py", "ours", ours | {"length_norm": "length"}),
               "ctranslate2": (py, "speed_worker.py", "ctranslate2", {"model": str(work / "ct2_float32")}),
               "ctranslate2_int8": (py, "speed_worker.py", "ctranslate2", {"model": str(work / "ct2_int8")})}
    if bin_dir:
        fs_ckpt = fairseq_checkpoint(bin_dir, data_bin, load_checkpoint(last, with_state=False).weights, work)
        systems["fairseq"] = (bin_dir / "python", "fairseq_worker.py", "translate",
                              {"checkpoint": str(fs_ckpt), "data_bin": str(data_bin)})
    lines = read_lines(resolve_data_path("multi30k/test_2016_flickr.en.gz"))
    refs = read_lines(resolve_data_path("multi30k/test_2016_flickr.de.gz"))
    vocab = tok.vocabulary()
    piece_sources = [[vocab[i] for i in ids] for ids in tok.encode_batch(lines)]
    agreement = greedy_agreement(systems, piece_sources, work)
    log(f"greedy outputs shared with ours: {agreement}")
    runs = translation(systems, piece_sources, args.b1_sentences, args.repeat, tok, refs, work)
    counts = {name.rsplit("_b", 1)[1]: set() for name in runs}
    for name, r in runs.items():
        counts[name.rsplit("_b", 1)[1]].add(r["sentences"])

    ratio = functools.partial(rate_ratio, runs)

    def bleu_delta(a: str) -> float:
        return round(runs[a]["bleu"] - runs["ours_b64"]["bleu"], 2)

    return {"greedy_agreement": agreement, "translate": runs,
            "sentences": {f"b{batch}": n.pop() for batch, n in counts.items() if len(n) == 1},
            "translate_ratios": {**ratio("translate_b64_vs_fairseq", "ours_b64", "fairseq_b64"),
                                 **ratio("translate_b64_vs_ctranslate2", "ours_b64", "ctranslate2_b64"),
                                 **ratio("translate_b1_vs_ctranslate2", "ours_b1", "ctranslate2_b1")},
            "int8": {"sents_per_s": runs["ours_int8_b64"]["sents_per_s"],
                     **ratio("vs_ctranslate2_int8", "ours_int8_b64", "ctranslate2_int8_b64"),
                     "bleu_delta": bleu_delta("ours_int8_b64")},
            # not a target: our search with OpenNMT-py's stopping rule (--early-stop top)
            "top_stop": {**ratio("b64_vs_ctranslate2", "ours_top_stop_b64", "ctranslate2_b64"),
                         **ratio("b64_vs_fairseq", "ours_top_stop_b64", "fairseq_b64"),
                         **ratio("b64_vs_bound", "ours_top_stop_b64", "ours_b64"),
                         "bleu_delta": bleu_delta("ours_top_stop_b64")},
            # the paper's search ranking hypotheses as fairseq and CTranslate2 do (--length-norm length, |Y|^α)
            "length_norm": {**ratio("b64_vs_ctranslate2", "ours_length_norm_b64", "ctranslate2_b64"),
                            **ratio("b64_vs_fairseq", "ours_length_norm_b64", "fairseq_b64"),
                            **ratio("b1_vs_ctranslate2", "ours_length_norm_b1", "ctranslate2_b1"),
                            **ratio("b64_vs_gnmt", "ours_length_norm_b64", "ours_b64"),
                            "bleu_delta": bleu_delta("ours_length_norm_b64")}}


def rate_ratio(runs: dict, key: str, a: str, b: str) -> dict:
    """``key``: run a's rate over run b's, their best rounds'; ``key``_rounds: the lowest and highest
    round-by-round ratio (round i of a against round i of b). None for both when b was not run."""
    if a not in runs or b not in runs:
        return {key: None, f"{key}_rounds": None}
    each = [tb / ta for ta, tb in zip(runs[a]["rounds_s"], runs[b]["rounds_s"], strict=True)]
    return {key: round(runs[a]["sents_per_s"] / runs[b]["sents_per_s"], 3),
            f"{key}_rounds": [round(min(each), 3), round(max(each), 3)]}


def remeasure(args: argparse.Namespace, state: dict) -> None:
    """--only SECTION: that section measured again, written into speed.json in place of its keys; the
    other sections stay as they were measured, and ``remeasured[SECTION]`` says when, at which commit
    and with which versions this one was. Training needs a vocabulary, not a model: --run's when it has
    one, else one trained as our runs train theirs; the users' model needs the recipe's finished run."""
    path = args.results / "speed.json"
    if not path.is_file():
        sys.exit(f"--only {args.only}: {path} does not exist yet (run speed.py without --only first)")
    result = json.loads(path.read_text(encoding="utf-8"))
    if args.only == "user":
        run, work = users_run(args), args.run / "speed"
        work.mkdir(parents=True, exist_ok=True)
        state["versions"] |= peer_versions(None)
        log(f"the users' model: {run}")
        result["user_model"] = user_model(run, work)
    else:
        result |= measure_section(args, state, result["ratios"])
    result["remeasured"] = result.get("remeasured", {}) | {args.only: state}
    write_result(args.results, "speed", result, markdown)
    print(json.dumps({k: result[k] for k in ("ratios", "remeasured")}, indent=2))


def measure_section(args: argparse.Namespace, state: dict, ratios: dict) -> dict:
    """--only train or translate: the section's keys, and ``ratios`` with the section's replaced."""
    if args.only == "translate":
        translation_model(args)
    if (args.run / "spm.model").is_file():
        work = args.run / ("speed" if args.only == "translate" else "speed_train")
        tok, cfg = Tokenizer(args.run / "spm.model"), load_config(str(args.run / "config.toml"))
    else:
        cfg, work = load_config("small", SMALL), args.run / "speed_train"
        work.mkdir(parents=True, exist_ok=True)
        tok = open_vocabulary(cfg, resolve_data_path(cfg.data.train_src), resolve_data_path(cfg.data.train_tgt),
                              work / "spm.model", log, resuming=False)
    bin_dir, data_bin, means = pieces_and_peers(args, work, tok)
    state["versions"] |= peer_versions(bin_dir)
    if args.only == "train":
        measured = training(args, work, cfg, tok.vocab_size, bin_dir, data_bin, means)
    else:
        measured = translating(args, work, tok, bin_dir, data_bin)
    section_ratios = measured.pop(f"{args.only}_ratios")
    return measured | {"ratios": ratios | section_ratios}


# ---------------------------------------------------------------------------------------------- fairseq model
def fairseq_checkpoint(bin_dir: Path, data_bin: Path, weights: dict[str, torch.Tensor], work: Path) -> Path:
    """A fairseq checkpoint computing our model: fairseq writes one of the right architecture (one
    update), then its tensors are replaced by ours, remapped to fairseq's names and vocabulary."""
    ckpt_dir = work / "fairseq_ckpt"
    shutil.rmtree(ckpt_dir, ignore_errors=True)  # fairseq-train would resume from an earlier one
    sh([str(bin_dir / "fairseq-train"), str(data_bin), *FAIRSEQ_MODEL, "--encoder-learned-pos",
        "--decoder-learned-pos", *FAIRSEQ_OPTIM, "--max-update", "1", "--disable-validation",
        "--no-epoch-checkpoints", "--save-dir", str(ckpt_dir)], work / "fairseq_convert.log")
    from safetensors.torch import save_file

    emb = weights["embed.weight"]  # [V, D] shared (the small preset ties all three)
    V, D = emb.shape

    def table(start_row: torch.Tensor | None) -> torch.Tensor:
        """fairseq ids: <s>=0 <pad>=1 </s>=2 <unk>=3, then our pieces 3.. at +1."""
        t = torch.zeros(V + 1, D)
        t[2] = emb[EOS_ID] if start_row is None else start_row
        t[3] = emb[UNK_ID]
        t[4:] = emb[3:]
        return t

    pos = torch.zeros(1024 + 2, D)
    pos[2:] = sinusoidal_positions(1024, D, 0, torch.device("cpu"))  # fairseq position i sits at row i + 2
    out = {"encoder.embed_tokens.weight": table(None),
           # the decoder's first input is </s> in fairseq and the zero vector in ours (A5)
           "decoder.embed_tokens.weight": table(torch.zeros(D)),
           "decoder.output_projection.weight": table(None),
           "encoder.embed_positions.weight": pos, "decoder.embed_positions.weight": pos.clone()}
    names = {"self_attn.q_proj": "self_attn.q_proj", "self_attn.k_proj": "self_attn.k_proj",
             "self_attn.v_proj": "self_attn.v_proj", "self_attn.out_proj": "self_attn.out_proj",
             "cross_attn.q_proj": "encoder_attn.q_proj", "cross_attn.k_proj": "encoder_attn.k_proj",
             "cross_attn.v_proj": "encoder_attn.v_proj", "cross_attn.out_proj": "encoder_attn.out_proj",
             "ffn.w1": "fc1", "ffn.w2": "fc2"}
    for key, value in weights.items():
        part, _, rest = key.partition(".")
        if part not in ("encoder", "decoder"):
            continue
        layer, _, name = rest.partition(".")
        module, _, kind = name.rpartition(".")
        norms = {"norm1": "self_attn_layer_norm", "norm2": "final_layer_norm" if part == "encoder"
                 else "encoder_attn_layer_norm", "norm3": "final_layer_norm"}
        module = names.get(module, norms.get(module, module))
        out[f"{part}.layers.{layer}.{module}.{kind}"] = value.float().contiguous()
    save_file(out, str(work / "fairseq_weights.safetensors"))
    patch = (
        "import sys, torch; from safetensors.torch import load_file\n"
        "ck = torch.load(sys.argv[1], map_location='cpu', weights_only=False)\n"  # our own file, just written
        "new = load_file(sys.argv[2]); model = ck['model']\n"
        "for k, v in new.items():\n"
        "    assert k in model and model[k].shape == v.shape, (k, tuple(v.shape), tuple(model[k].shape) if k in model else None)\n"
        "    model[k] = v\n"
        "left = [k for k in model if k not in new and not k.endswith('version') and '_float_tensor' not in k]\n"
        "assert not left, left\n"
        "torch.save(ck, sys.argv[1])\n")
    sh([str(bin_dir / "python"), "-c", patch, str(ckpt_dir / "checkpoint_last.pt"),
        str(work / "fairseq_weights.safetensors")])
    return ckpt_dir / "checkpoint_last.pt"


# ---------------------------------------------------------------------------------------------- translation
def worker(system: tuple[Path, str, str, dict], name: str, job: dict, work: Path, env: dict | None = None) -> dict:
    """One system's warm-process timing (speed_worker.py / fairseq_worker.py); checks the sentence count.
    ``system``: (python, script, its first argument, what the job adds); ``env``: variables the process
    gets besides the measured processes' settings."""
    python, script, kind, extra = system
    job = {**DECODE, **extra, **job}
    path = work / f"job_{name}.json"
    path.write_text(json.dumps(job), encoding="utf-8")
    text = sh([str(python), str(HERE / script), kind, str(path)],
              work / f"worker_{name}_b{job['batch']}_beam{job['beam']}.log",
              # the converted fairseq checkpoint is our own file, just written: fairseq's loader unpickles it
              env=(env or {}) | ({"PYTHONPATH": str(ROOT)} if script == "speed_worker.py"
                                 else {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}))
    result = json.loads(next(line for line in reversed(text.splitlines()) if line.startswith('{"seconds"')))
    if result["sentences"] != len(job["sources"]):
        raise RuntimeError(f"{name} translated {result['sentences']} of {len(job['sources'])} sentences")
    return result


def translation(systems: dict[str, tuple[Path, str, str, dict]], piece_sources: list[list[str]], b1: int, rounds: int,
                tok: Tokenizer, refs: list[str], work: Path) -> dict:
    """Every system at batch 64 (all of test2016) and batch 1 (the first ``b1`` sentences), in ``rounds``
    rounds: a round times each system once, in a process of its own after one untimed pass, so that the
    machine's drift over the minutes reaches every system alike and a ratio has a range over rounds.
    A system's rate is its best round's."""
    index = {p: i for i, p in enumerate(tok.vocabulary())}
    runs = {}
    for batch, n in ((64, len(piece_sources)), (1, b1)):
        seconds: dict[str, list[float]] = {name: [] for name in systems}
        outputs = {}
        for i in range(rounds):
            for name, system in systems.items():
                r = worker(system, name, {"batch": batch, "repeat": 1, "warmup": 1, "sources": piece_sources[:n]},
                           work)
                seconds[name].append(r["seconds"])
                outputs[name] = r["outputs"]
                log(f"round {i + 1} of {rounds}, {name} batch {batch}: {n / r['seconds']:.2f} sentences/s")
        for name, times in seconds.items():
            texts = [tok.decode([index.get(p, UNK_ID) for p in o]) for o in outputs[name]]
            tokens, best = sum(len(o) for o in outputs[name]), min(times)
            runs[f"{name}_b{batch}"] = {"sents_per_s": round(n / best, 2), "tgt_tokens_per_s": round(tokens / best, 2),
                                        "seconds": round(best, 2), "rounds_s": [round(t, 3) for t in times],
                                        "sentences": len(outputs[name]), "bleu": bleu(texts, refs)}
    return runs


def greedy_agreement(systems: dict[str, tuple[Path, str, str, dict]], piece_sources: list[list[str]], work: Path) -> dict:
    """How many of test2016's greedy outputs each peer shares with ours, word piece for word piece: the
    converted weights compute our model only if (nearly) all do."""
    outputs = {}
    for name in ("ours", "ctranslate2", "fairseq"):
        if name in systems:
            job = {"beam": 1, "batch": 64, "repeat": 1, "sources": piece_sources}
            outputs[name] = worker(systems[name], name, job, work)["outputs"]
    return {f"{name}_identical": sum(a == b for a, b in zip(outputs["ours"], outputs[name]))
            for name in outputs if name != "ours"} | {"sentences": len(piece_sources)}


def bleu(hyps: list[str], refs: list[str]) -> float:
    return round(sacrebleu.corpus_bleu(hyps, [refs[:len(hyps)]]).score, 2)


# ---------------------------------------------------------------------------------------------- the users' model
def user_model(run: Path, work: Path, repeat: int = 3) -> dict:
    """The EN→DE recipe's model translated as users run each system: whole processes, start to exit."""
    avg = work / "user_avg.safetensors"
    cfg = load_config(str(run / "config.toml"))
    # averaged each time: a file left by an earlier run of the recipe would be another model's
    sh([sys.executable, "-m", "transformer", "average", str(run), "--last", str(cfg.decode.average_last),
        "--out", str(avg)])
    ct2_dir = work / "user_ct2"
    export_ctranslate2(run, ct2_dir, avg, None, overwrite=True, log=log)
    src, empty = work / "user_test.en", work / "user_empty.en"
    src.write_text("".join(line + "\n" for line in read_lines(resolve_data_path(cfg.data.test_src))), encoding="utf-8")
    empty.write_text("", encoding="utf-8")
    refs = read_lines(resolve_data_path(cfg.data.test_tgt))
    ours = [sys.executable, "-m", "transformer", "translate", str(run), "--checkpoint", str(avg), "--device", "cpu"]
    ct2 = [sys.executable, str(HERE / "speed_worker.py"), "ct2_file", str(ct2_dir)]
    commands = {"ours": ours, "ours_top_stop": ours + ["--early-stop", "top"], "ctranslate2": ct2}
    times: dict[str, list[float]] = {f"{n}{k}": [] for n in commands for k in ("", "_startup")}
    outputs = {}
    for _ in range(repeat):  # interleaved
        for name, cmd in commands.items():
            for suffix, inp in (("", src), ("_startup", empty)):
                out = work / f"user_{name}{suffix}.de"
                start = time.perf_counter()
                sh([*cmd, "--input", str(inp), "--output", str(out)])
                times[f"{name}{suffix}"].append(time.perf_counter() - start)
                if not suffix:
                    outputs[name] = read_lines(out)
                    if len(outputs[name]) != len(refs):
                        raise RuntimeError(f"{name}: {len(outputs[name])} output lines for {len(refs)} inputs")
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"run": os.path.relpath(run, ROOT), "sentences": len(refs),
            "model": {k: getattr(cfg.model, k) for k in ("n_enc_layers", "n_dec_layers", "d_model", "d_ff", "norm")},
            "seconds": {k: {"median": round(med[k], 2), "min": round(min(v), 2), "max": round(max(v), 2)}
                        for k, v in times.items()},
            "bleu": {name: bleu(o, refs) for name, o in outputs.items()},
            "ratios": {"exact_vs_ctranslate2": round(med["ctranslate2"] / med["ours"], 3),
                       "top_stop_vs_ctranslate2": round(med["ctranslate2"] / med["ours_top_stop"], 3)},
            "startup_s": {"ours": round(med["ours_startup"], 2), "ctranslate2": round(med["ctranslate2_startup"], 2)}}


# ---------------------------------------------------------------------------------------------- main
def peer_versions(bin_dir: Path | None) -> dict:
    import ctranslate2

    versions = {"ctranslate2": ctranslate2.__version__}
    if bin_dir:
        # fairseq prints warnings on import: the versions are the line that starts with the marker
        code = "import fairseq, torch; print('VERSIONS', fairseq.__version__, torch.__version__)"
        line = [x for x in sh([str(bin_dir / "python"), "-c", code]).splitlines() if x.startswith("VERSIONS ")][-1]
        fairseq_version, fairseq_torch = line.split()[1:]
        versions |= {"fairseq": fairseq_version, "fairseq_torch": fairseq_torch}
    return versions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, default=ROOT / "runs" / "speed_small",
                        help="our translation model's run folder; trained for --train-minutes when it does not exist")
    # defaults filled in after parsing (DEFAULTS), so that --only can tell an option given from one left alone
    parser.add_argument("--train-minutes", type=float, help="minutes to train --run when it has no model (default 15)")
    parser.add_argument("--train-runs", type=int, help="timed training runs per system, alternating (default 3)")
    parser.add_argument("--train-updates", type=int, help="updates in each timed training run (default 250)")
    parser.add_argument("--b1-sentences", type=int, help="sentences translated at batch 1 (default 200)")
    parser.add_argument("--repeat", type=int, help="rounds of translation timings, each system timed once a round; "
                        "a system's best round is kept, and each ratio's range over the rounds (default 3)")
    parser.add_argument("--user-run", type=Path, help="the EN→DE recipe's run folder (default: the recipe's "
                        "own run of benchmarks/multi30k.py, as multi30k_en_de.json names it)")
    parser.add_argument("--no-peers", action="store_true", help="measure ours and CTranslate2 only (no fairseq)")
    parser.add_argument("--only", choices=tuple(SECTION_OPTIONS), help="measure this section alone and write it "
                        "into speed.json in place of its figures (the other sections stay, with the commit and date "
                        "they were measured at)")
    parser.add_argument("--markdown", action="store_true", help="measure nothing: rewrite speed.md from speed.json "
                        "(and ct2_backend.json, when there) after a change to this script's text")
    add_results_option(parser, "speed.json / .md (--only and --markdown start from the speed.json there)")
    args = parser.parse_args()
    if args.only:
        refused = [("--markdown", args.markdown), ("--no-peers", args.no_peers)]
        refused += [(f"--{name.replace('_', '-')}", getattr(args, name) is not None)
                    for section, names in SECTION_OPTIONS.items() if section != args.only for name in names]
        if given := next((option for option, value in refused if value), None):
            parser.error(f"--only {args.only} cannot run with {given} (it measures {args.only} alone, against "
                         f"{'CTranslate2' if args.only == 'user' else 'fairseq'}, and writes speed.json)")
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    results_folder(parser, args.results, make=not args.markdown)
    if args.markdown:
        if not (args.results / "speed.json").is_file():
            parser.error(f"--markdown: no speed.json in {args.results} to rewrite the page from")
        return write_whole(args.results / "speed.md",
                           markdown(json.loads((args.results / "speed.json").read_text(encoding="utf-8"))))
    torch.set_num_threads(2)
    result: dict = {"date": datetime.date.today().isoformat(), **code_state(),
                    "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
                    "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, 2 threads", "cpu_model": cpu_model(),
                    "process_settings": {**PROCESS_ENV, "flush_denormal": "ours, fairseq (Python processes)"},
                    "versions": {"python": platform.python_version(), "torch": torch.__version__,
                                 "sacrebleu": sacrebleu.__version__}}
    if args.only:
        return remeasure(args, result)
    work, user_run = args.run / "speed", users_run(args)
    translation_model(args)
    tok = Tokenizer(args.run / "spm.model")
    bin_dir, data_bin, means = pieces_and_peers(args, work, tok)
    result["versions"] |= peer_versions(bin_dir)
    result |= training(args, work, load_config(str(args.run / "config.toml")), tok.vocab_size, bin_dir, data_bin,
                       means)
    result |= translating(args, work, tok, bin_dir, data_bin)
    result["ratios"] = {**result.pop("train_ratios"), **result.pop("translate_ratios")}
    log(f"the users' model: {user_run}")
    result["user_model"] = user_model(user_run, work)
    write_result(args.results, "speed", result, markdown)
    print(json.dumps(result, indent=2))


def users_run(args: argparse.Namespace) -> Path:
    """--user-run, or the recipe's own run that multi30k_en_de.json names; refused when not finished."""
    run = args.user_run or recipe_run()
    if not (run / "summary.json").is_file():
        sys.exit(f"--user-run {run}: no finished run there (python benchmarks/multi30k.py trains it)")
    return run


def markdown(r: dict) -> str:
    rounds = any("rounds_s" in v for v in r["translate"].values())  # runs before the rounds had none
    rows = "\n".join(f"| {name} | {v['sents_per_s']} | "
                     + (f"{', '.join(map(str, v['rounds_s']))} | " if rounds else "")
                     + f"{v['tgt_tokens_per_s']} | {v['sentences']} | {v['bleu']} |"
                     for name, v in r["translate"].items())
    train_rows = "\n".join(f"| {name} | {v['tokens_per_s']} ({v['min']}–{v['max']}) | "
                           f"{', '.join(map(str, r['train_runs'][name]))} | "
                           f"{'–' if v['mfu'] is None else format(v['mfu'], '.1%')} |"
                           for name, v in r["train"].items())
    u = r["user_model"]
    user_rows = "\n".join(f"| {name} | {s['median']} ({s['min']}–{s['max']}) |" for name, s in u["seconds"].items())
    return f"""# Speed: ours vs fairseq and CTranslate2 (bench-small, Multi30k EN→DE, CPU)

`{r['command']}` — {r['date']}, commit {r.get('commit', '–')}, {r['machine']}, {r['cpu_model']}; torch {r['versions']['torch']},
fairseq {r['versions'].get('fairseq', '–')} (torch {r['versions'].get('fairseq_torch', '–')}), CTranslate2
{r['versions']['ctranslate2']}. fp32 matmul peak {r['matmul_peak_gflops']} GFLOP/s;
{r['flops_per_tgt_token'] / 1e6:.2f} MFLOP per target token. Every measured process had
`{' '.join(f'{k}={v}' for k, v in r['process_settings'].items() if k != 'flush_denormal')}`, and
the Python ones (ours, fairseq) flushed denormal floats to zero.

## Training (target tokens/s: median over a run's 10-update intervals after update 30)

{r['train']['ours']['runs']} runs per system of {r['train']['ours']['updates']} updates each, alternating
({', '.join(r['train'])}, then again); `ours_bf16` is ours with `train.precision = "bf16"`, set against our fp32.
{remeasured(r, 'train')}
| system | median of the runs (min–max) | each run | MFU |
|---|---|---|---|
{train_rows}

## Translation (test2016, beam 4, α 0.6, max length input + 50; same weights in every system)
{remeasured(r, 'translate')}
{timing_text(rounds)} Greedy
outputs shared with ours, word piece for word piece: {json.dumps(r['greedy_agreement'])}. The beams
rank finished hypotheses differently: fairseq and CTranslate2 divide log P by |Y|^α, ours by GNMT's
((5 + |Y|) / 6)^α (§6.1), so beam outputs, lengths and BLEU may differ a little as well as speed.

| system, batch | sentences/s{' (best round) | each round (s)' if rounds else ''} | target tokens/s | sentences | BLEU |
|---|---|---|---|---|{'---|' if rounds else ''}
{rows}

Ratios (ours ÷ theirs): {json.dumps(r['ratios'])}; int8: {json.dumps(r['int8'])}

`ours` stops a sentence by the paper's exact bound (§6.1, A11: no alive beam can beat the best
finished one). `ours_top_stop` (`--early-stop top`, not the paper's) also stops it once the step's
best candidate is EOS, OpenNMT-py's rule (CTranslate2's only without a length penalty: with α 0.6, as
here, it waits for 4 finished hypotheses, as fairseq does): fewer decoder steps, not exact. Not a target; ratios: {json.dumps(r['top_stop'])}
{length_norm(r)}
## The model users train, as users run it
{remeasured(r, 'user')}
`{u['run']}` ({json.dumps(u['model'])}), averaged weights, test2016 ({u['sentences']} sentences),
whole processes timed from start to exit (`transformer translate --checkpoint AVG`, and a CTranslate2
script: sentencepiece, `translate_batch` with beam 4, length penalty 0.6, batches of 64, sentencepiece);
`_startup` is the same command on an empty input. Seconds, median of 3 (min–max), interleaved:

| command | seconds |
|---|---|
{user_rows}

BLEU {json.dumps(u['bleu'])}; ours ÷ CTranslate2 (sentences/s): {json.dumps(u['ratios'])}.
{ct2_threads()}"""


def timing_text(rounds: bool) -> str:
    """How the translation table was timed: in rounds (since the rounds came in), or best of the
    repeats in one process per system (runs before)."""
    if not rounds:
        return "Each system in a warm process of its own, model loaded outside the timing, best of the repeats."
    return ("Timed in rounds: a round times each system once, in a process of its own (model loaded outside\n"
            "the timing) after one untimed pass; a system's rate is its best round's, and each ratio's\n"
            "`_rounds` is its lowest and highest round-by-round value (round i against round i).")


def length_norm(r: dict) -> str:
    """The paragraph on ``ours_length_norm``, in runs that measured it (runs before it did not)."""
    if "length_norm" not in r:
        return ""
    return f"""
`ours_length_norm` (`--length-norm length`) is the paper's search with finished hypotheses ranked as
fairseq and CTranslate2 rank them, log P / |Y|^α: the same normalisation on both sides of a ratio.
Ratios: {json.dumps(r['length_norm'])}
"""


def remeasured(r: dict, section: str) -> str:
    """A section's own provenance when ``--only SECTION`` measured it apart from the page's run."""
    t = r.get("remeasured", {}).get(section)
    if not t:
        return ""
    peak = "; the peak and MFLOP per target token above are this measurement's" if section == "train" else ""
    peers = "".join(f", {name} {t['versions'][key]}" for name, key in SECTION_PEERS[section] if key in t["versions"])
    return f"""
Measured apart from the run above: `{t['command']}` — {t['date']}, commit
{t['commit']}, torch {t['versions']['torch']}{peers}{peak}.
"""


def ct2_threads() -> str:
    """What ct2_backend.py found about CTranslate2's int8 at batch 1, when it has run: the reason the
    table's ctranslate2_int8_b1 is slow here."""
    path = RESULTS / "ct2_backend.json"
    if not path.is_file():
        return ""
    c = json.loads(path.read_text(encoding="utf-8"))
    picked = c["runs"]["picked_int8_b1"]["reported"]
    return f"""
## CTranslate2's int8 at batch 1 ([ct2_backend.md](ct2_backend.md), commit {c['commit']}, another model)

On this CPU CTranslate2 picks {picked.get('GEMM_S8 backend', '?')} for int8 and ISA {picked.get('Selected ISA', '?')}.
With speed.py's two threads its int8 runs {c['int8_over_fp32_b1']['picked']}x its fp32 at batch 1; on one
thread {c['int8_over_fp32_b1']['picked_one_thread']}x, and {c['int8_b1_one_over_two_threads']}x its own
two-thread rate. Forcing MKL (CT2_USE_MKL=1) makes it slower, not faster ({c['int8_over_fp32_b1']['mkl_forced']}x
fp32, both slower than with oneDNN). So `ctranslate2_int8_b1` above measures CTranslate2's two-thread
int8 path at batch 1, not int8 arithmetic on this CPU: a user translating one sentence at a time in
int8 here should give CTranslate2 one thread.
"""


if __name__ == "__main__":
    main()
