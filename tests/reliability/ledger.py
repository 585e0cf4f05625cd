"""The reliability suite: every test does the damage for real and records what came of it.

What is recorded is measured, not assumed: a fault's outcome is the result of inspecting what the
damage left (the files on disk, the outputs, the server's answers), recorded before any assert looks
at it, so a fault that was not survived is counted as such even though its test then fails. A check
that crashes counts like one that fails: the fault was not survived, the foreign file not refused, and
every line of a translation call that raised or was answered with an error is lost. Each distinct kind
of damage counts once however often it is repeated; foreign files count once each.

The summary is written to benchmarks/results/reliability.json (and .md) after every run of the whole
reliability suite, green or not, with ``passed``, the failed tests' names and the commit it ran at. This
module is a pytest plugin loaded for every run (pyproject's addopts: ``-p tests.reliability.ledger``), not
the folder's conftest: under pytest-xdist the controller, which collects nothing and so loads no conftest
below tests/, writes the summary from every worker's part of the ledger.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import platform
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
ROWS = (  # reliability.md: (key in reliability.json, the counter in plain words, the key it is a share of)
    ("passed", "every test passed", None),
    ("commit", "commit the suite ran at", None),
    ("dirty", "run with uncommitted changes to the code (package, tests, configs)", None),
    ("faults_survived", "kinds of damage survived every time they were done", "faults_injected"),
    ("lines_lost", "lines lost (all of a call's lines when it crashed or was answered with an error)", None),
    ("partial_checkpoints_seen", "committed checkpoints found partial", None),
    ("foreign_files_refused", "foreign model files refused", "foreign_files"),
    ("fuzz_inputs", "distinct hostile lines translated", None),
    ("attention_requests_shed_503", "worst-case attention requests shed with 503", "attention_requests"),
    ("attention_worst_response_bytes", "largest attention answer (base model), bytes", None),
    ("flood_requests_shed_503", "flood requests shed with 503", "flood_requests"),
    ("server_peak_rss_growth_mib", "server memory growth at peak, MiB", None),
    ("cli_tracebacks", "command-line runs with a bad value that ended in a traceback or an internal error",
     "cli_cases"),
)


def rss_mib(pid: int) -> float:
    """Resident memory of a process, from Linux's /proc: VmRSS is in KiB (the kernel's "kB" is 1024
    bytes), so this is bytes / 2**20."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 2**20
    raise ProcessLookupError(f"process {pid} has no resident memory: it has exited")


class RssPeak:
    """Samples a process's resident memory every 20 ms while in use: the peak above where it started.
    Sampling stops if the process exits; whoever uses it checks that it is still running."""

    def __init__(self, pid: int):
        self.pid, self.start, self.peak, self.done = pid, rss_mib(pid), 0.0, threading.Event()

    def __enter__(self) -> RssPeak:
        def sample() -> None:
            with contextlib.suppress(OSError):  # /proc has no memory, or no entry, for a process that exited
                while not self.done.is_set():
                    self.peak = max(self.peak, rss_mib(self.pid))
                    time.sleep(0.02)
        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()

    @property
    def growth(self) -> float:
        return max(0.0, self.peak - self.start)


@dataclass
class Ledger:
    """What the damage did. A test does the damage and its checks inside ``with ledger.damage(kind)``
    (``foreign``, ``translation`` and ``server_damage`` likewise): the outcome is recorded first, whatever
    the block raised, and asserted second."""

    faults: dict[str, list[bool]] = field(default_factory=dict)  # kind -> one outcome per time it was done
    foreign_files: dict[str, bool] = field(default_factory=dict)  # file (by name and content) -> refused
    fuzzed: set[str] = field(default_factory=set)  # distinct hostile inputs tried
    lines_lost: int = 0
    partial_checkpoints_seen: int = 0
    measured: dict[str, float] = field(default_factory=dict)  # the server's worst cases (``measure``)
    combines: dict[str, str] = field(default_factory=dict)  # measurement -> "max" or "sum", as it is kept
    cli_cases: int = 0  # commands run with a bad value (``command``)
    cli_tracebacks: int = 0  # of them, those that let an exception out, printed a traceback or exited 70

    def fault(self, kind: str, survived: bool) -> bool:
        self.faults.setdefault(kind, []).append(bool(survived))
        return bool(survived)

    @contextlib.contextmanager
    def damage(self, kind: str) -> Iterator[None]:
        """Records one fault of ``kind``: survived only if every check inside the block passed; any
        exception (a crashed resume as much as a failed assert) records it as not survived."""
        survived = False
        try:
            yield
            survived = True
        finally:
            self.fault(kind, survived)

    @contextlib.contextmanager
    def server_damage(self, kind: str, proc: subprocess.Popen, rss_bound_mib: float) -> Iterator[RssPeak]:
        """A fault of ``kind`` done to the server ``proc``: survived only if every check inside the block
        passed, the server's resident memory grew by less than ``rss_bound_mib`` at its peak meanwhile
        (the worst growth is kept as server_peak_rss_growth_mib, however the block ended) and the server
        is still running afterwards."""
        with self.damage(kind):
            rss = RssPeak(proc.pid)
            try:
                with rss:
                    yield rss
            finally:
                self.measure("server_peak_rss_growth_mib", rss.growth)
            assert rss.growth < rss_bound_mib, f"server RSS +{rss.growth:.0f} MiB at peak, bound {rss_bound_mib}"
            assert proc.poll() is None, f"the server exited (status {proc.returncode})"

    @contextlib.contextmanager
    def foreign(self, path: Path) -> Iterator[None]:
        """Records the foreign file ``path`` as refused only if every check inside the block passed."""
        key = f"{Path(path).name}:{hashlib.sha256(Path(path).read_bytes()).hexdigest()}"
        refused = False
        try:
            yield
            refused = True
        finally:
            self.foreign_files[key] = self.foreign_files.get(key, True) and refused

    @contextlib.contextmanager
    def command(self) -> Iterator[dict]:
        """One command run with a bad value: the block runs it and puts its exit ``status`` and its
        ``stderr`` in the dict it is given. Counted in cli_cases, and in cli_tracebacks when the block
        raised before a status was known (the command let an exception out), the status is the
        internal error's or stderr holds a traceback."""
        from transformer.cli import INTERNAL_ERROR

        ran: dict = {}
        try:
            yield ran
        finally:
            self.cli_cases += 1
            self.cli_tracebacks += ran.get("status") in (None, INTERNAL_ERROR) or "Traceback" in ran.get("stderr", "")

    @contextlib.contextmanager
    def translation(self, inputs: list[str], hostile: bool = True) -> Iterator[list[str]]:
        """One call that must give a line back for every line in: the block extends the list it is given
        with what the call delivered. If the block raises (the call crashed, the server answered an error
        status or a body without the translations), every one of ``inputs`` is lost, not none. The loss
        is recorded, then asserted to be nothing. Hostile inputs (generated, or from the fixed corpus of
        nasty lines) are counted as fuzzed."""
        if hostile:
            self.fuzzed.update(inputs)
        delivered: list[str] = []
        lost = len(inputs)
        try:
            yield delivered
            lost = max(len(inputs) - len(delivered), 0)
        finally:
            self.lines_lost += lost
        assert not lost, f"{lost} of {len(inputs)} lines lost"

    def measure(self, name: str, value: float, combine=max) -> float:
        """Keeps the worst (``max``) or the total (``sum``) of a measurement over the run."""
        self.combines[name] = {max: "max", sum: "sum"}[combine]
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

    def state(self) -> str:
        """All this ledger holds, as JSON: what a pytest-xdist worker sends the controller, which ``merge``s
        every worker's part (JSON's escapes carry any hostile line the fuzzing tried)."""
        return json.dumps({"faults": self.faults, "foreign_files": self.foreign_files, "fuzzed": sorted(self.fuzzed),
                           "lines_lost": self.lines_lost, "partial_checkpoints_seen": self.partial_checkpoints_seen,
                           "measured": {k: [v, self.combines[k]] for k, v in self.measured.items()},
                           "cli_cases": self.cli_cases, "cli_tracebacks": self.cli_tracebacks})

    def merge(self, state: str) -> None:
        """Adds another ledger's ``state``: as if its damage had been done and recorded in this one."""
        other = json.loads(state)
        for kind, outcomes in other["faults"].items():
            self.faults.setdefault(kind, []).extend(outcomes)
        for key, refused in other["foreign_files"].items():
            self.foreign_files[key] = self.foreign_files.get(key, True) and refused
        self.fuzzed.update(other["fuzzed"])
        for name, (value, combine) in other["measured"].items():
            self.measure(name, value, {"max": max, "sum": sum}[combine])
        for counter in ("lines_lost", "partial_checkpoints_seen", "cli_cases", "cli_tracebacks"):
            setattr(self, counter, getattr(self, counter) + other[counter])

    def summary(self) -> dict:
        return {"faults_injected": len(self.faults),
                "faults_survived": sum(all(outcomes) for outcomes in self.faults.values()),
                "lines_lost": self.lines_lost, "partial_checkpoints_seen": self.partial_checkpoints_seen,
                "foreign_files_refused": sum(self.foreign_files.values()), "foreign_files": len(self.foreign_files),
                "fuzz_inputs": len(self.fuzzed), "cli_cases": self.cli_cases, "cli_tracebacks": self.cli_tracebacks,
                **{k: round(v, 1) for k, v in sorted(self.measured.items())},
                "fault_kinds": {kind: {"done": len(o), "survived": sum(o)} for kind, o in sorted(self.faults.items())}}


LEDGER = Ledger()


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


WORKERS: list[dict] = []  # under pytest-xdist, the controller's: each worker's part (``pytest_sessionfinish``)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown to a run without it
def pytest_testnodedown(node, error):
    """pytest-xdist's controller, as a worker ends: keeps the worker's part of the ledger."""
    if part := getattr(node, "workeroutput", {}).get("reliability"):
        WORKERS.append(part)


def pytest_sessionfinish(session, exitstatus):
    """Writes the summary after a run of the whole reliability suite (every file, nothing deselected,
    not --collect-only), whether it passed or not. Under pytest-xdist each worker sends its part of the
    ledger and what it collected, and the controller (which sees every test's report) writes it."""
    ran = [i.nodeid for i in session.items if _ours(i)]
    if hasattr(session.config, "workerinput"):  # a pytest-xdist worker
        session.config.workeroutput["reliability"] = {"ledger": LEDGER.state(), "collected": ran,
                                                      "deselected": bool(DESELECTED)}
        return
    for part in WORKERS:
        LEDGER.merge(part["ledger"])
        ran = ran or part["collected"]  # every worker collects every test
    files = {nodeid.split("::")[0].rsplit("/", 1)[-1] for nodeid in ran}
    every_file = files == {p.name for p in HERE.glob("test_*.py")}
    if not every_file or DESELECTED or any(part["deselected"] for part in WORKERS) or session.config.option.collectonly:
        return
    params = session.config.invocation_params
    command = shlex.join([Path(sys.executable).name, "-m", "pytest", *params.args])
    write_summary(RESULTS, LEDGER, exitstatus == 0 and not FAILED, sorted(set(FAILED)), len(ran), command)


def git_state(repo: Path) -> dict:
    """The commit ``repo`` is at, and whether the code the suite runs (the package, the tests, the
    configs, pyproject.toml) differs from it, by changed or untracked files: numbers from such a tree
    are not that commit's; changes to docs or results do not change what ran. None where ``repo`` is
    not a git checkout."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)

    try:
        head = git("rev-parse", "--short", "HEAD")
        changes = git("status", "--porcelain", "--", "transformer", "tests", "configs", "pyproject.toml")
    except OSError:  # no git
        return {"commit": None, "dirty": None}
    if head.returncode or changes.returncode:
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(changes.stdout.strip())}


def shown(value: object) -> str:
    """A value as reliability.md gives it."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "unknown"
    return f"{value:,}" if isinstance(value, int) else str(value)


def write_summary(results: Path, ledger: Ledger, passed: bool, failed: list[str], tests: int, command: str,
                  repo: Path = REPO) -> dict:
    """reliability.json and .md in ``results``; returns the summary."""
    import torch  # here, not at the top: this plugin is loaded by every pytest run, most of which write no summary
    summary = {"passed": passed, "failed_tests": failed, **git_state(repo), **ledger.summary(), "tests": tests,
               "date": datetime.date.today().isoformat(), "command": command,
               "versions": {"python": platform.python_version(), "torch": torch.__version__}}
    results.mkdir(parents=True, exist_ok=True)
    (results / "reliability.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    rows = []
    for key, words, whole in ROWS:  # a measurement whose test did not get that far is missing, and says so
        value = (shown(summary[key]) + (f" of {shown(summary[whole])}" if whole else "")) if key in summary \
            else "not measured"
        rows.append(f"| {words} | {value} | `{key}` |")
    kinds = [f"| {kind} | {v['done']} | {v['survived']} |" for kind, v in summary["fault_kinds"].items()]
    (results / "reliability.md").write_text("\n".join([
        f"# Reliability suite ({summary['tests']} tests, {summary['date']})", "",
        f"`{command}` (run from the repository root)", "",
        "| counter | value | key in reliability.json |", "|---|---|---|", *rows, "",
        "Each kind of damage, how often it was done and how often the inspection afterwards found it survived:", "",
        "| fault | done | survived |", "|---|---|---|", *kinds]) + "\n", encoding="utf-8")
    return summary
