"""No silent skips: a test run fails when a test is skipped for a reason outside this short list.

Loaded for every run (pyproject's addopts: ``-p tests.skips``). A skip is allowed only when its
reason is listed here and the listed condition holds on this machine; an allowed skip is still
named in the summary, the browser one loudly. Anything else that skips (missing data, a missing
dependency, a fixture that gave up) turns a green run red.
"""

from __future__ import annotations

import os

import pytest

# (text in the skip reason, when it is allowed, what it means)
ALLOWED: list[tuple[str, str, str]] = [
    ("needs a CUDA GPU", "no CUDA GPU", "the GPU test, on a machine without a GPU"),
    ("chromium could not be installed", "TRANSFORMER_SKIP_BROWSER is set",
     "WARNING: the browser test of the web page did not run (scripts/test.sh could not install chromium)"),
    ("root writes into read-only folders", "running as root", "the read-only folder test, as root"),
    ("glibc's malloc only", "not GNU libc", "the malloc tuning test, on a libc without it"),
    ("Triton has no wheel here", "not Linux x86-64", "the fused loss's kernel tests, where Triton cannot be installed"),
]
SKIPS: list[tuple[str, str]] = []  # (test or module, reason) of every skip in this run


def _holds(condition: str) -> bool:
    if condition == "no CUDA GPU":
        import torch

        return not torch.cuda.is_available()
    if condition == "TRANSFORMER_SKIP_BROWSER is set":
        return bool(os.environ.get("TRANSFORMER_SKIP_BROWSER"))
    if condition == "running as root":
        return os.geteuid() == 0
    if condition == "not Linux x86-64":
        import platform

        return (platform.system(), platform.machine()) != ("Linux", "x86_64")
    if condition == "not GNU libc":
        from transformer.runtime import glibc

        return not glibc()
    raise ValueError(condition)


def allowed(reason: str) -> str | None:
    """What an allowed skip means, or None when the skip is not allowed here."""
    return next((meaning for text, condition, meaning in ALLOWED if text in reason and _holds(condition)), None)


def _record(nodeid: str, longrepr) -> None:
    if isinstance(longrepr, tuple):  # (file, line, "Skipped: reason")
        SKIPS.append((nodeid, longrepr[2].removeprefix("Skipped: ")))


def pytest_sessionstart(session: pytest.Session) -> None:
    SKIPS.clear()


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a whole module skipped at import (pytest.importorskip, a module-level skip)
        _record(report.nodeid, report.longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _record(report.nodeid, report.longrepr)


def _split() -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
    ok, bad = [], []
    for nodeid, reason in SKIPS:
        meaning = allowed(reason)
        (ok.append((nodeid, reason, meaning)) if meaning else bad.append((nodeid, reason)))
    return ok, bad


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _split()[1] and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    ok, bad = _split()
    for nodeid, _, meaning in ok:
        terminalreporter.write_line(f"allowed skip: {nodeid}: {meaning}", yellow=True, bold="WARNING" in meaning)
    if bad:
        terminalreporter.section("skipped for a reason not allowed (tests/skips.py): the run fails", red=True)
        for nodeid, reason in bad:
            terminalreporter.write_line(f"{nodeid}: {reason}", red=True)
