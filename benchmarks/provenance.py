"""Which code a benchmark ran: the commit and the uncommitted changes, read through git alone.

It imports nothing from the package, so a benchmark that also runs an earlier ``transformer/`` package
(gpu.py --before puts one first on PYTHONPATH) can record the checkout whatever that package holds."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def git(*args: str) -> str:
    """A git command's output in this checkout (e.g. ``git("rev-parse", "--short", "HEAD")``), "" without git."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def code_state() -> dict:
    """The code a benchmark runs, read when it starts: the commit, and the uncommitted changes to the
    package, the benchmarks and the configs (changes to docs or results do not change what ran)."""
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "uncommitted": git("status", "--porcelain", "--", "transformer", "benchmarks/*.py", "configs").splitlines()}


def commit_text(state: dict) -> str:
    """``code_state``'s commit as a result page's header prints it: "commit abc1234", and "with uncommitted
    changes" where the package, the benchmarks or the configs differed from it."""
    return f"commit {state['commit']}" + (" with uncommitted changes" if state["uncommitted"] else "")
