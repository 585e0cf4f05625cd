"""Which code a benchmark ran (the commit and the uncommitted changes, read through git alone), and where its
reading goes (``--results``).

It imports nothing from the package, so a benchmark that also runs an earlier ``transformer/`` package
(gpu.py --before puts one first on PYTHONPATH) can record the checkout whatever that package holds."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Callable
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


RESULTS = ROOT / "benchmarks" / "results"


def add_results_option(parser: argparse.ArgumentParser, files: str) -> None:
    """``--results FOLDER`` for the script's ``files``: by default the committed readings, which a trial run
    would otherwise replace until `git checkout` restored them."""
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"folder for {files} (default "
                        "benchmarks/results, the project's committed readings: give another for your own run)")


def results_folder(parser: argparse.ArgumentParser, folder: Path, make: bool = True, writes: bool = True) -> Path:
    """``folder`` made and found writable before minutes of measuring, whose reading a folder that cannot take
    it would lose at the end; otherwise a usage error naming ``--results``. ``make`` False: a mode that starts
    from what is there (a typo made no empty folder); ``writes`` False: one that only reads it (a read-only
    folder will do)."""
    if folder.exists() and not folder.is_dir():
        parser.error(f"--results {folder}: not a folder")
    if not make and not folder.is_dir():
        parser.error(f"--results {folder}: no such folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"--results {folder}: {e.strerror}")
    if writes and not os.access(folder, os.W_OK | os.X_OK):
        parser.error(f"--results {folder}: not writable")
    return folder


def write_result(folder: Path, name: str, result: dict, page: Callable[[dict], str] | None = None,
                 indent: int = 2) -> None:
    """NAME.json in ``folder``, then NAME.md of ``page(result)`` where a page is given: the reading is kept
    whatever the page's text then does (a slip in it lost hours of measuring)."""
    write_whole(folder / f"{name}.json", json.dumps(result, indent=indent) + "\n")
    if page is not None:
        write_whole(folder / f"{name}.md", page(result))


def write_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all: an interrupted write leaves the earlier reading, not half of a
    new one. The text goes first into a file of its own beside it (two writers of one file at once, table3.py's
    lanes, each replace it whole) that a failed write does not leave behind."""
    fd, part = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(part, 0o666 & ~umask)  # as a plain write makes it (mkstemp's is 0o600)
        os.replace(part, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
