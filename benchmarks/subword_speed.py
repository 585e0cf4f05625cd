"""What subword regularization costs the training loop: target tokens/s of the Multi30k EN→DE recipe with
data.subword_alpha and without.

    python benchmarks/subword_speed.py [--alpha 0.1] [--steps 200] [--repeats 2] [--out runs/subword_speed]

Trains the recipe (configs/multi30k_en_de.toml) for --steps updates, alternately without and with
BPE-dropout, --repeats times each, every run from scratch in a fresh folder; the step budget crosses an
epoch boundary in both, so the next epoch's sampling (in its worker process) overlaps training as it
does in a real run. No validation or checkpoints inside the budget. tokens/s is the trainer's own
(target tokens over the training clock, the first epoch's sampling included). Sampled segmentations are
longer, so the same number of updates holds fewer sentences; tokens are pieces. A timed benchmark: run it with the machine otherwise idle.
Writes benchmarks/results/subword_speed.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
from pathlib import Path

import torch

from transformer.config import load_config
from transformer.train import train

from common import ROOT, positive
from provenance import add_results_option, git, results_folder, write_result, write_whole

CONFIG = ROOT / "configs" / "multi30k_en_de.toml"


def one_run(out: Path, alpha: float, steps: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cfg = load_config(str(CONFIG), [f"data.subword_alpha={alpha}", f"train.max_steps={steps}", "train.max_minutes=0",
                                    "train.save_minutes=0", "train.save_every=0", f"train.eval_every={steps * 10}",
                                    "train.bleu_every=0", 'train.keep_best=""', "train.patience=0"])
    summary = train(cfg, out, quiet=True)
    return {"alpha": alpha, "steps": summary["step"], "tokens_per_s": round(summary["tokens_per_s"], 1),
            "tgt_tokens": summary["tgt_tokens"], "train_minutes": round(summary["train_minutes"], 3)}


def spread(runs: dict) -> str:
    """Each kind's range of tokens/s, and whether they overlap: three runs a side are not many."""
    ranges = {kind: (min(r["tokens_per_s"] for r in rs), max(r["tokens_per_s"] for r in rs))
              for kind, rs in runs.items()}
    (lo_a, hi_a), (lo_b, hi_b) = ranges.values()
    said = ", ".join(f"{kind} {lo}–{hi}" for kind, (lo, hi) in ranges.items())
    overlap = lo_a <= hi_b and lo_b <= hi_a
    return (f"The runs' ranges ({said}) overlap: the difference is within their spread." if overlap
            else f"The runs' ranges ({said}) do not overlap.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alpha", type=float, default=0.1, help="data.subword_alpha of the sampled runs")
    parser.add_argument("--steps", type=positive, default=200,
                        help="updates per run (the recipe has 116 batches an epoch)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each kind, alternating")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "subword_speed")
    add_results_option(parser, "subword_speed.json / .md")
    args = parser.parse_args()
    results = results_folder(parser, args.results)

    runs: dict[str, list[dict]] = {"plain": [], "sampled": []}
    for i in range(args.repeats):
        for kind, alpha in (("plain", 0.0), ("sampled", args.alpha)):
            runs[kind].append(one_run(args.out / f"{kind}_{i}", alpha, args.steps))
            print(kind, runs[kind][-1], flush=True)
    plain = statistics.median(r["tokens_per_s"] for r in runs["plain"])
    sampled = statistics.median(r["tokens_per_s"] for r in runs["sampled"])
    result = {
        "alpha": args.alpha, "steps": args.steps, "repeats": args.repeats,
        "plain_tokens_per_s": plain, "sampled_tokens_per_s": sampled,
        "tokens_per_s_ratio": round(sampled / plain, 3),
        "tokens_per_s_loss": round(1 - sampled / plain, 3),
        "runs": runs,
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "config": os.path.relpath(CONFIG, ROOT),
        "commit": git("rev-parse", "--short", "HEAD"),
        "uncommitted": git("status", "--porcelain", "--untracked-files=no").splitlines(),
        "date": datetime.date.today().isoformat(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}",
    }
    write_result(results, "subword_speed", result)  # the reading, then its page
    rows = "".join(f"| {kind} | {r['alpha']} | {r['steps']} | {r['tokens_per_s']} | {r['tgt_tokens']} | "
                   f"{r['train_minutes']} |\n" for kind in runs for r in runs[kind])
    write_whole(
        results / "subword_speed.md",
        f"# Subword regularization: training speed\n\n`{result['command']}` at {result['commit']}, {result['date']}, "
        f"{result['machine']}, torch {torch.__version__}; recipe {result['config']}\n\n"
        f"Median target tokens/s: without {plain}, with BPE-dropout α {args.alpha}: {sampled} "
        f"(ratio {result['tokens_per_s_ratio']}, loss {100 * result['tokens_per_s_loss']:.1f}%). {spread(runs)}\n\n"
        "| run | alpha | updates | target tokens/s | target tokens | minutes |\n|---|---|---|---|---|---|\n" + rows)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
