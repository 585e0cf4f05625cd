"""The reliability suite: every test does the damage for real and counts it.

Counters are summed over the session and written to benchmarks/results/reliability.json (and .md)
when the whole suite passes, so the committed summary is what the last green run measured.
"""

import datetime
import json
import platform
from collections import Counter
from pathlib import Path

import pytest
import torch

KEYS = ("faults_injected", "faults_survived", "lines_lost", "partial_checkpoints_seen", "foreign_files_refused",
        "fuzz_inputs")
COUNTS: Counter = Counter({k: 0 for k in KEYS})
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@pytest.fixture
def tally() -> Counter:
    return COUNTS


@pytest.fixture(scope="session")
def fuzz_run(tmp_path_factory, multi30k: Path) -> Path:
    """A run folder with a tiny model (30 steps, 300 pieces) whose outputs stop at input + 5 pieces:
    fast enough to decode hundreds of fuzzed lines, shared by the translate and the server tests."""
    from tests.conftest import write_slice
    from transformer.config import load_config
    from transformer.train import train

    out = tmp_path_factory.mktemp("fuzz")
    src, tgt = write_slice(multi30k, out, "train", 0, 400)
    cfg = load_config("tiny", [f'data.train_src="{src}"', f'data.train_tgt="{tgt}"', f'data.valid_src="{src}"',
                               f'data.valid_tgt="{tgt}"', "data.vocab_size=300", "train.max_steps=30",
                               "train.threads=1", "decode.max_len_offset=5"])
    train(cfg, out / "run", quiet=True)
    return out / "run"


@pytest.fixture(scope="session")
def fuzz_translator(fuzz_run: Path):
    """The ``fuzz_run`` model, loaded once."""
    from transformer.translator import Translator

    return Translator(fuzz_run, log=lambda m: None)


HERE = Path(__file__).parent
DESELECTED: list = []


def _ours(item) -> bool:
    return HERE in Path(str(item.fspath)).parents


def pytest_collection_modifyitems(items):
    for item in items:
        if _ours(item):
            item.add_marker(pytest.mark.reliability)


def pytest_deselected(items):
    DESELECTED.extend(i for i in items if _ours(i))


def pytest_sessionfinish(session, exitstatus):
    """Writes the summary only after a green run of the whole reliability suite (every file, nothing
    deselected, not --collect-only)."""
    ran = [i for i in session.items if _ours(i)]
    files = {Path(str(i.fspath)).name for i in ran}
    every_file = files == {p.name for p in HERE.glob("test_*.py")}
    if exitstatus != 0 or not every_file or DESELECTED or session.config.option.collectonly:
        return
    summary = {k: COUNTS[k] for k in KEYS} | {
        "tests": len(ran), "date": datetime.date.today().isoformat(),
        "command": "bash scripts/test.sh -m reliability (or the whole suite)",
        "versions": {"python": platform.python_version(), "torch": torch.__version__}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "reliability.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    rows = "\n".join(f"| {k} | {summary[k]} |" for k in KEYS)
    (RESULTS / "reliability.md").write_text(
        f"# Reliability suite ({summary['tests']} tests, {summary['date']})\n\n`{summary['command']}`\n\n"
        f"| counter | value |\n|---|---|\n{rows}\n", encoding="utf-8")
