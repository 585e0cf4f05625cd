"""benchmarks/bf16_decode.py: the three ways decode the same lines, and the result files hold what later checks read."""

import json
import sys
from pathlib import Path

from transformer.config import load_config
from transformer.train import train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bf16_decode  # noqa: E402


def test_the_bench_times_and_scores_each_way_on_the_same_lines(tmp_path, tiny_overrides, monkeypatch):
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=4"]), run, quiet=True)
    lines = ["A dog runs.", "Two men talk.", "A girl reads a book.", "A cat sleeps."]
    monkeypatch.setattr(bf16_decode, "test_set", lambda cfg: (list(lines), list(lines), list(lines)))
    monkeypatch.setattr(sys, "argv", ["benchmarks/bf16_decode.py", "--run", str(run), "--repeat", "2",
                                      "--b1-sentences", "2", "--results", str(tmp_path / "results")])
    bf16_decode.main()
    result = json.loads((tmp_path / "results" / "bf16_decode.json").read_text())
    assert result["sentences"] == 4 and result["b1_sentences"] == 2
    for setting in ("batch 1", "batch 64"):
        for way in ("fp32", "bf16", "int8"):
            reading = result["speed_sents_per_s"][setting][way]
            assert len(reading["runs"]) == 2 and reading["min"] <= reading["median"] <= reading["max"]
        assert result["bf16_vs_fp32"][setting] > 0
    assert result["quality"]["fp32"]["outputs_differing_from_fp32"] == 0
    assert set(result["quality"]) == {"fp32", "bf16", "int8"} and isinstance(result["native_bf16"], bool)
    md = (tmp_path / "results" / "bf16_decode.md").read_text()
    assert "| bf16 |" in md and "bf16 against fp32, medians: batch 1" in md
