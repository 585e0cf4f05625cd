"""What the quality benchmarks share: training a recipe (or re-reading a finished run) and the weights
to pick among on dev."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from transformer.checkpoint import (average_checkpoints, checkpoints_to_average, list_checkpoints, load_checkpoint,
                                    write_model)
from transformer.config import Config, load_config
from transformer.train import train


def train_or_reread(config: Path, out: Path, sets: list[str], minutes: float | None,
                    decode_only: bool) -> tuple[Config, dict, list[str]]:
    """Trains ``config`` into the new run folder ``out`` with every checkpoint kept (curves and
    averages need them), or with ``decode_only`` re-reads the finished run there. Returns the run's
    config, its training summary and the overrides it was trained with here."""
    overrides = ["train.keep_last=1000", *sets] + ([f"train.max_minutes={minutes}"] if minutes else [])
    if not decode_only:
        cfg = load_config(str(config), overrides)
        return cfg, train(cfg, out), overrides
    if sets or minutes:
        sys.exit("--decode-only re-scores a finished run as it was trained: drop --set and --minutes")
    summary = finished_summary(out)  # first: a folder with no finished run gets its one-line error
    return load_config(str(out / "config.toml")), summary, overrides


def finished_summary(run_dir: Path) -> dict:
    """The summary `train` wrote when the run in ``run_dir`` finished (summary.json), for re-scoring it."""
    path = run_dir / "summary.json"
    if not path.is_file():
        sys.exit(f"{run_dir}: no summary.json, so no finished training (run without --decode-only first)")
    return json.loads(path.read_text(encoding="utf-8"))


def weight_candidates(run_dir: Path, averages: tuple[int, ...] = (5, 10)) -> dict[str, Path]:
    """The last checkpoint and the averages of the last N (§6.1), each written as a weights file, by name
    ("last", "average_last5", ...): the candidates a benchmark picks among on the dev set."""
    newest = list_checkpoints(run_dir)[-1]
    meta = load_checkpoint(newest, with_state=False).meta
    keep = {k: meta[k] for k in ("config", "vocab_sha256", "model_hash", "vocab_size") if k in meta}
    candidates = {"last": newest}
    for n in averages:
        paths = checkpoints_to_average(run_dir, n)
        if len(paths) == n:
            path = run_dir / f"average_last{n}.safetensors"
            write_model(path, average_checkpoints(paths), keep | {"averaged": [p.name for p in paths]})
            candidates[f"average_last{n}"] = path
    return candidates
