"""benchmarks/fresh_clone.py reads the precision the quick start trained in from its train.log: the quick start's
"auto" precision decides how many updates its ten minutes hold, so a reading without it cannot be compared."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import fresh_clone  # noqa: E402


def test_the_precision_is_read_from_a_real_train_log(tiny_run: Path):
    log = (tiny_run / "train.log").read_text(encoding="utf-8")
    assert fresh_clone.trained_in(log) == "fp32"  # the tiny preset trains in fp32


def test_auto_precision_is_named_as_auto():
    line = ("2026-12-04 11:41:14 model: 3,131,904 parameters; vocabulary 10000; bf16 (auto) on cpu; per step at "
            "most 4096 tokens per side x update_freq 1 x 1 rank(s) = 4096")
    assert fresh_clone.trained_in(line) == "bf16 (auto)"
    assert fresh_clone.trained_in("no model line") == "unknown"
