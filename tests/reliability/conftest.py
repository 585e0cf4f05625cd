"""The reliability suite: every test does the damage for real and records what came of it.

What is recorded is measured, not assumed: a fault's outcome is the result of inspecting what the
damage left (the files on disk, the outputs, the server's answers), recorded before any assert looks
at it, so a fault that was not survived is counted as such even though its test then fails. Each
distinct kind of damage counts once however often it is repeated; foreign files count once each.

The summary is written to benchmarks/results/reliability.json (and .md) after every run of the whole
reliability suite, green or not, with ``passed`` and the failed tests' names.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import platform
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
KEYS = ("faults_injected", "faults_survived", "lines_lost", "partial_checkpoints_seen", "foreign_files_refused",
        "fuzz_inputs")


@dataclass
class Ledger:
    """What the damage did. A test does the damage and its checks inside ``with ledger.damage(kind)``
    (or reads ``assert ledger.fault(kind, survived)``): the outcome is recorded first, asserted second."""

    faults: dict[str, list[bool]] = field(default_factory=dict)  # kind -> one outcome per time it was done
    foreign_files: dict[str, bool] = field(default_factory=dict)  # file (by name and content) -> refused
    fuzzed: set[str] = field(default_factory=set)  # distinct hostile inputs tried
    lines_lost: int = 0
    partial_checkpoints_seen: int = 0
    measured: dict[str, float] = field(default_factory=dict)  # the server's worst cases (``measure``)

    def fault(self, kind: str, survived: bool) -> bool:
        self.faults.setdefault(kind, []).append(bool(survived))
        return bool(survived)

    @contextlib.contextmanager
    def damage(self, kind: str) -> Iterator[None]:
        """Records one fault of ``kind``: survived only if every check inside the block passed."""
        survived = False
        try:
            yield
            survived = True
        finally:
            self.fault(kind, survived)

    def foreign(self, path: Path, refused: bool) -> bool:
        key = f"{Path(path).name}:{hashlib.sha256(Path(path).read_bytes()).hexdigest()}"
        self.foreign_files[key] = self.foreign_files.get(key, True) and bool(refused)
        return bool(refused)

    def outputs(self, inputs: list[str], outputs: list[str], hostile: bool = True) -> int:
        """Counts the distinct hostile inputs (generated, or from the fixed corpus of nasty lines) and the
        lines lost on the way; returns the loss."""
        if hostile:
            self.fuzzed.update(inputs)
        lost = max(len(inputs) - len(outputs), 0)
        self.lines_lost += lost
        return lost

    def measure(self, name: str, value: float, combine=max) -> float:
        """Keeps the worst (``max``) or the total (``sum``) of a measurement over the run."""
        self.measured[name] = combine([self.measured[name], value]) if name in self.measured else value
        return value

    def checkpoints(self, run: Path) -> int:
        """Inspects every committed checkpoint of ``run`` (a JSON record names it) and counts those whose
        files do not verify completely; returns that count."""
        from transformer.checkpoint import CheckpointError, list_checkpoints, load_checkpoint

        partial = 0
        for path in list_checkpoints(run):
            try:
                load_checkpoint(path)
            except CheckpointError:
                partial += 1
        self.partial_checkpoints_seen += partial
        return partial

    def summary(self) -> dict:
        return {"faults_injected": len(self.faults),
                "faults_survived": sum(all(outcomes) for outcomes in self.faults.values()),
                "lines_lost": self.lines_lost, "partial_checkpoints_seen": self.partial_checkpoints_seen,
                "foreign_files_refused": sum(self.foreign_files.values()), "foreign_files": len(self.foreign_files),
                "fuzz_inputs": len(self.fuzzed), **{k: round(v, 1) for k, v in sorted(self.measured.items())},
                "fault_kinds": {kind: {"done": len(o), "survived": sum(o)} for kind, o in sorted(self.faults.items())}}


LEDGER = Ledger()


@pytest.fixture
def ledger() -> Ledger:
    return LEDGER


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
FAILED: list[str] = []


def _ours(item) -> bool:
    return HERE in Path(str(item.fspath)).parents


def pytest_collection_modifyitems(items):
    for item in items:
        if _ours(item):
            item.add_marker(pytest.mark.reliability)


def pytest_deselected(items):
    DESELECTED.extend(i for i in items if _ours(i))


def pytest_runtest_logreport(report):
    if report.failed and HERE in Path(report.fspath).resolve().parents:
        FAILED.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    """Writes the summary after a run of the whole reliability suite (every file, nothing deselected,
    not --collect-only), whether it passed or not."""
    ran = [i for i in session.items if _ours(i)]
    files = {Path(str(i.fspath)).name for i in ran}
    every_file = files == {p.name for p in HERE.glob("test_*.py")}
    if not every_file or DESELECTED or session.config.option.collectonly:
        return
    params = session.config.invocation_params
    command = shlex.join([Path(sys.executable).name, "-m", "pytest", *params.args])
    write_summary(RESULTS, LEDGER, exitstatus == 0 and not FAILED, sorted(set(FAILED)), len(ran), command)


def write_summary(results: Path, ledger: Ledger, passed: bool, failed: list[str], tests: int, command: str) -> dict:
    """reliability.json and .md in ``results``; returns the summary."""
    summary = {"passed": passed, "failed_tests": failed, **ledger.summary(), "tests": tests,
               "date": datetime.date.today().isoformat(), "command": command,
               "versions": {"python": platform.python_version(), "torch": torch.__version__}}
    results.mkdir(parents=True, exist_ok=True)
    (results / "reliability.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    rows = "\n".join(f"| {k} | {summary[k]} |" for k in ("passed", *KEYS, *sorted(ledger.measured)))
    kinds = "\n".join(f"| {kind} | {v['done']} | {v['survived']} |" for kind, v in summary["fault_kinds"].items())
    (results / "reliability.md").write_text(
        f"# Reliability suite ({summary['tests']} tests, {summary['date']})\n\n`{command}` (run from the "
        f"repository root)\n\n| counter | value |\n|---|---|\n{rows}\n\nEach kind of damage, how often it was "
        f"done and how often the inspection afterwards found it survived:\n\n| fault | done | survived |\n"
        f"|---|---|---|\n{kinds}\n", encoding="utf-8")
    return summary
