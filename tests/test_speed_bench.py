"""benchmarks/speed.py --train-only (issue 47's CPU check): training measured again is written into
speed.json in place of its training keys, the translation keys untouched, its provenance beside them.
The measuring itself (minutes of timed training against fairseq) is stood in for."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import speed  # noqa: E402

MEASURED = {"versions": {"ctranslate2": "9", "fairseq": "0.12.3.1", "fairseq_torch": "2.13.0+cpu"},
            "matmul_peak_gflops": 170.0, "flops_per_tgt_token": 45750000, "mean_lengths": {"en": 16.0, "de": 16.5},
            "train_runs": {"ours": [3000, 3100, 3200], "fairseq": [2800, 2900, 3000]},
            "train": {"ours": {"tokens_per_s": 3100, "min": 3000, "max": 3200, "runs": 3, "updates": 250,
                               "mfu": 0.83},
                      "fairseq": {"tokens_per_s": 2900, "min": 2800, "max": 3000, "runs": 3, "updates": 250,
                                  "mfu": 0.78}},
            "mfu": 0.83, "train_ratios": {"train_vs_fairseq": 1.069, "train_vs_fairseq_min_max": [1.0, 1.143]}}


def test_train_only_replaces_the_training_keys_and_keeps_the_translation(tmp_path, monkeypatch):
    shutil.copy(ROOT / "benchmarks" / "results" / "speed.json", tmp_path / "speed.json")
    before = json.loads((tmp_path / "speed.json").read_text(encoding="utf-8"))
    monkeypatch.setattr(speed, "RESULTS", tmp_path)
    vocabularies = []
    monkeypatch.setattr(speed, "open_vocabulary", lambda cfg, src, tgt, path, log, resuming: vocabularies.append(path))
    monkeypatch.setattr(speed, "training", lambda args, work, tok, cfg: (None, work, json.loads(json.dumps(MEASURED))))
    args = argparse.Namespace(run=tmp_path / "no_run")
    state = {"date": "2026-11-29", "commit": "abc1234", "uncommitted": [],
             "command": "benchmarks/speed.py --train-only", "versions": {"torch": "2.13.0+cpu"}}
    speed.train_only(args, state)

    after = json.loads((tmp_path / "speed.json").read_text(encoding="utf-8"))
    assert vocabularies == [tmp_path / "no_run" / "speed_train" / "spm.model"]  # no model run: a vocabulary alone
    assert after["train"] == MEASURED["train"] and after["train_runs"] == MEASURED["train_runs"]
    assert after["ratios"]["train_vs_fairseq"] == 1.069
    assert after["matmul_peak_gflops"] == 170.0
    for key in ("translate", "greedy_agreement", "int8", "top_stop", "user_model", "commit", "date"):
        assert after[key] == before[key]
    assert after["ratios"]["translate_b1_vs_ctranslate2"] == before["ratios"]["translate_b1_vs_ctranslate2"]
    assert after["train_measured"]["commit"] == "abc1234"
    assert after["train_measured"]["versions"]["fairseq"] == "0.12.3.1"
    md = (tmp_path / "speed.md").read_text(encoding="utf-8")
    assert "Measured again on its own" in md and "commit abc1234" in md and "| ours | 3100 (3000–3200)" in md


def test_train_only_needs_a_full_run_first(tmp_path, monkeypatch):
    monkeypatch.setattr(speed, "RESULTS", tmp_path)
    with pytest.raises(SystemExit, match="does not exist yet"):
        speed.train_only(argparse.Namespace(run=tmp_path / "run"), {})


def test_the_worker_hands_the_jobs_length_norm_to_the_search(tiny_run, monkeypatch):
    """speed.py's ours_length_norm row: the job's length_norm reaches the search (the default, GNMT's,
    when the job names none)."""
    import speed_worker

    import transformer.decode

    seen = []

    def fake_translate_ids(model, sources, *args, **kwargs):
        seen.append(kwargs)
        return [[] for _ in sources]

    monkeypatch.setattr(transformer.decode, "translate_ids", fake_translate_ids)
    from transformer.tokenizer import Tokenizer

    checkpoint = sorted((tiny_run / "checkpoints").glob("*.safetensors"))[-1]
    piece = Tokenizer(tiny_run / "spm.model").vocabulary()[10]
    job = {"run": str(tiny_run), "checkpoint": str(checkpoint), "sources": [[piece]], "beam": 4, "alpha": 0.6,
           "max_len_offset": 50, "batch": 64, "repeat": 1}
    speed_worker.ours(job | {"length_norm": "length"}, int8=False)
    speed_worker.ours(job, int8=False)
    assert [k["length_norm"] for k in seen] == ["length", "gnmt"]
