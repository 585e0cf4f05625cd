"""What the quality benchmarks share: training a recipe (or re-reading a finished run) and the weights
to pick among on dev."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sacrebleu.metrics.bleu import BLEUScore

from provenance import RESULTS
from transformer.checkpoint import (CheckpointError, average_checkpoints, checkpoints_to_average, list_checkpoints,
                                    load_checkpoint, write_model)
from transformer.config import Config, LengthNorm, load_config
from transformer.data import encode_pairs, lengths, read_lines, read_parallel
from transformer.errors import UserError
from transformer.evaluate import sacrebleu_scores, tok_lc_bleu_score, writes_tokenized
from transformer.prepare import resolve_data_path
from transformer.request import DecodeRequest
from transformer.train import train
from transformer.translator import Translator
from transformer.vocabulary import train_vocabulary

ROOT = Path(__file__).resolve().parent.parent


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1 (0 was taken for "not given" by `if args.x:`, and a run
    re-stamped committed results with the command that asked for nothing)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def trained_run(run: Path, hint: str = "") -> Path:
    """``run`` if `transformer train` left checkpoints there; otherwise the script stops with a message that says
    so (and ``hint``: how to get one), not with a traceback from deep inside the loading."""
    try:
        found = list_checkpoints(run)
    except CheckpointError as err:
        sys.exit(str(err))
    if not found:
        sys.exit(f"{run}: no checkpoints there (a run folder `transformer train` wrote){hint}")
    return run


def prediction_interval(values: list[float], level: float = 0.95) -> dict:
    """Where one more run of the same setting falls, from ``values`` (n >= 2 runs of it, seeds apart):
    mean ± t((1 + level) / 2, n−1) · s · √(1 + 1/n), the interval a single run (a variant, a published
    number) is read against, rather than the runs' min–max."""
    from scipy.stats import t

    n, sd = len(values), statistics.stdev(values)
    half = float(t.ppf(0.5 + level / 2, n - 1)) * sd * math.sqrt(1 + 1 / n)
    return {"n": n, "mean": round(statistics.fmean(values), 3), "sd": round(sd, 3), "min": min(values),
            "max": max(values), "half_width": round(half, 3)}


def recipe_lengths(cfg: Config) -> tuple[list[int], list[int]]:
    """The source and target lengths (pieces, EOS included) of a recipe's training pairs as its run encodes
    them: a joint BPE of its vocabulary size trained afresh, the pairs over its maximum length left out. What
    the counting benchmarks (batching, shape_buckets) batch."""
    src, tgt = resolve_data_path(cfg.data.train_src), resolve_data_path(cfg.data.train_tgt)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = train_vocabulary(cfg, src, tgt, Path(tmp) / "spm.model", log=lambda m: None)
        examples, _ = encode_pairs(read_parallel(src, tgt), tokenizer, cfg.data.max_len)
    return lengths(examples)


def recipe_run(pair: str = "en_de") -> Path:
    """The run folder of the Multi30k recipe as committed (step 3 of benchmarks/multi30k.py, named in its
    result file): the model the other benchmarks measure as the one users train."""
    result = RESULTS / f"multi30k_{pair}.json"
    return ROOT / json.loads(result.read_text(encoding="utf-8"))["run"]


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


def train_or_resume(cfg: Config, out: Path, decode_only: bool = False) -> dict:
    """Trains ``cfg`` into ``out`` (resuming an interrupted run there), or reads back the run that
    finished there; returns its training summary. A run there of another training config (its [decode]
    and threads aside) is refused, never read back as this one."""
    if (out / "config.toml").is_file():
        trained = load_config(str(out / "config.toml"))
        if config_key(dataclasses.replace(trained, decode=cfg.decode)) != config_key(cfg):
            sys.exit(f"{out} holds a run of another config: move it away and run again")
    if (out / "summary.json").is_file():
        return finished_summary(out)
    if decode_only:
        sys.exit(f"--decode-only: {out} holds no finished run to score")
    try:
        return train(cfg, out, resume=bool(list_checkpoints(out)) if out.is_dir() else False)
    except UserError as e:  # as `transformer train` ends: one line, 143 after SIGTERM (its checkpoint written)
        print(f"{e.label}: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


def overrides_of(values: dict[str, object]) -> list[str]:
    """``--set``-style overrides (SECTION.KEY=JSON value) of a dict of config values."""
    return [f"{key}={json.dumps(value)}" for key, value in values.items()]


def config_key(cfg: Config) -> str:
    """What a step-bounded run's result is keyed by: its config's sha256, whatever the thread count."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, threads=0)).sha256()


def bleu_parts(score: BLEUScore) -> dict:
    """A BLEU score's parts: its 1- to 4-gram precisions (%), brevity penalty and lengths in tokens."""
    return {"precisions": [round(p, 2) for p in score.precisions], "bp": round(score.bp, 4),
            "sys_len": score.sys_len, "ref_len": score.ref_len}


def test_set(cfg: Config) -> tuple[list[str], list[str], list[str]]:
    """A run's test sources, references and tokenized lowercased references, read; a run that names none of
    them (one's own data, trained with data.test_tok_ref="" as the README shows) is refused in one line: an
    empty name was read as the current folder, a traceback."""
    d = cfg.data
    if missing := [f"data.{k}" for k in ("test_src", "test_tgt", "test_tok_ref") if not getattr(d, k)]:
        raise SystemExit(f"the run's config names no {', '.join(missing)}: this benchmark scores the test set, "
                         "tokenized lowercased BLEU included (a Multi30k recipe's run names them)")
    return tuple(read_lines(resolve_data_path(p)) for p in (d.test_src, d.test_tgt, d.test_tok_ref))


class Split:
    """One side of Multi30k to score on: sources, references and the tokenized lowercased references
    (Moses lc+norm+tok, as the Multi30k literature reports); ``limit``: its first N sentences only."""

    def __init__(self, cfg: Config, name: str, limit: int | None = None) -> None:
        d = cfg.data
        self.name, self.lang = name, d.tgt_lang
        self.pretokenized = writes_tokenized(d.train_tgt)  # trained on the tokenized files: outputs are in that form
        if name == "val":
            tok = f"multi30k/tok/val.lc.norm.tok.{d.tgt_lang}.gz"
            read = [read_lines(resolve_data_path(p)) for p in (d.valid_src, d.valid_tgt, tok)]
        else:
            read = test_set(cfg)
        self.src, self.ref, self.tok_ref = (lines[:limit] for lines in read)

    def score(self, translator: Translator, beam: int | None = None, alpha: float | None = None,
              length_norm: LengthNorm | None = None) -> dict:
        """Tokenized lowercased BLEU and its parts, sacreBLEU (detokenized, cased) with its signature, chrF,
        the decoding's seconds and the hypotheses."""
        start = time.monotonic()
        hyps = translator.translate(self.src, DecodeRequest(beam_size=beam, alpha=alpha, length_norm=length_norm))
        seconds = time.monotonic() - start
        scores = sacrebleu_scores(hyps, self.ref)
        tok = tok_lc_bleu_score(hyps, self.tok_ref, self.lang, self.pretokenized)
        return {"tok_lc_bleu": round(tok.score, 2), "tok_lc_parts": bleu_parts(tok),
                "sacrebleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2),
                "signature": scores["signature"], "translate_seconds": round(seconds, 1), "hyps": hyps}
