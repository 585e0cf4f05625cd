"""The counters can show a failure: faults broken on purpose, recorded in a ledger of their own. Each
test sees a counter move both ways, so a counter made constant fails it."""

import contextlib
import json
import random
import subprocess
import sys
import tempfile
import time

import pytest
import torch
from fastapi.testclient import TestClient

import tests.reliability.test_faults as faults
import transformer.train
from tests.reliability.ledger import REPO, Ledger, git_state, write_summary
from tests.reliability.test_cli_matrix import run
from tests.reliability.test_server_abuse import answered
from transformer.checkpoint import list_checkpoints, load_checkpoint
from transformer.config import load_config
from transformer.data import BatchOrder
from transformer.request import DecodeRequest
from transformer.serve import Limits, create_app
from transformer.train import train


def test_a_fault_that_was_not_survived_shows_in_the_summary(tmp_path, tiny_overrides, monkeypatch):
    """A resume that skips a batch, a resume that crashes (an exception, not a failed assert), a
    committed checkpoint whose tensors were cut short, a translation that drops a line and a foreign
    file that was let in: each is reported by the counters, and the summary file says the run did not
    pass."""
    book = Ledger()
    ov = tiny_overrides + ["train.save_every=2", "train.eval_every=1000", "model.p_drop=0.1"]
    reference, run = tmp_path / "reference", tmp_path / "run"
    train(load_config("tiny", ov + ["train.max_steps=6"]), reference, quiet=True)
    train(load_config("tiny", ov + ["train.max_steps=3"]), run, quiet=True)
    epoch_order = BatchOrder.epoch_order
    monkeypatch.setattr(BatchOrder, "epoch_order", lambda self, epoch: epoch_order(self, epoch)[1:])  # one lost
    with pytest.raises(AssertionError), book.damage("resume that skips a batch"):
        train(load_config("tiny", ov + ["train.max_steps=6"]), run, resume=True, quiet=True)
        ours, theirs = (load_checkpoint(list_checkpoints(r)[-1]).weights for r in (run, reference))
        assert all(torch.equal(ours[k], theirs[k]) for k in ours)

    def crash(*args, **kwargs) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(transformer.train, "queue_step", crash)
    with pytest.raises(RuntimeError, match="illegal memory access"), book.damage("resume that crashes"):
        train(load_config("tiny", ov + ["train.max_steps=8"]), run, resume=True, quiet=True)
    with book.damage("SIGTERM during training"):  # one that was survived, beside them
        pass

    weights = list_checkpoints(run)[0].with_suffix(".safetensors")
    weights.write_bytes(weights.read_bytes()[:-100])  # the record still vouches for the whole file
    assert book.checkpoints(run) == 1
    with pytest.raises(AssertionError, match="1 of 3 lines lost"), book.translation(["a dog", "", "a cat"]) as out:
        out.extend(["ein Hund", ""])
    foreign = tmp_path / "evil.pt"
    foreign.write_bytes(b"not refused")
    with pytest.raises(AssertionError), book.foreign(foreign):
        assert foreign.read_bytes() != b"not refused", "loaded"

    summary = write_summary(tmp_path / "results", book, passed=False, failed=["test_x"], tests=2, command="pytest")
    assert json.loads((tmp_path / "results" / "reliability.json").read_text()) == summary
    assert (summary["faults_injected"], summary["faults_survived"]) == (3, 1)
    assert summary["fault_kinds"]["resume that skips a batch"] == {"done": 1, "survived": 0}
    assert summary["fault_kinds"]["resume that crashes"] == {"done": 1, "survived": 0}
    assert summary["fault_kinds"]["SIGTERM during training"] == {"done": 1, "survived": 1}
    assert summary["partial_checkpoints_seen"] == 1 and summary["lines_lost"] == 1
    assert (summary["foreign_files"], summary["foreign_files_refused"]) == (1, 0)
    assert summary["passed"] is False and summary["failed_tests"] == ["test_x"]
    assert summary["fuzz_inputs"] == 3
    markdown = (tmp_path / "results" / "reliability.md").read_text()
    assert "| kinds of damage survived every time they were done | 1 of 3 |" in markdown
    assert "| foreign model files refused | 0 of 1 |" in markdown


def stand_in(resume: str) -> str:
    """A stand-in for test_faults.KILLER that trains nothing: its first run dies by SIGKILL, the next
    (the resume) runs ``resume``."""
    return ("import os, signal, sys\nfrom pathlib import Path\nrun = Path(sys.argv[sys.argv.index('--out') + 1])\n"
            f"if run.exists():\n    {resume}\nrun.mkdir()\nos.kill(os.getpid(), signal.SIGKILL)\n")


@pytest.mark.parametrize("resume, check, outcomes", [
    ("sys.exit(0)", True, [True]),  # killed, resumed, every check passed
    ("raise RuntimeError('the resume crashed')", True, [False, False]),  # the kill, and the crash after it
    ("sys.exit(0)", False, [False]),  # killed and resumed, but the run did not end as it should
])
def test_a_kill_is_survived_only_if_its_resume_and_every_check_pass(tmp_path, monkeypatch, resume, check, outcomes):
    """test_faults' kill-and-resume, with a stand-in for the training: a resume that crashes after a
    SIGKILL, or a check that fails at the end, leaves the kill counted as a fault not survived."""
    book = Ledger()
    monkeypatch.setattr(faults, "KILLER", stand_in(resume))
    with contextlib.nullcontext() if all(outcomes) else pytest.raises(AssertionError):
        with faults.killed_and_resumed(tmp_path, tmp_path / "run", [], random.Random(0), (1, 1), book) as partial:
            assert partial == [0]
            assert check, "the run did not end bit-exact"
    assert [o for outcome in book.faults.values() for o in outcome] == outcomes
    assert book.summary()["faults_survived"] == (len(book.faults) if all(outcomes) else 0)


def test_lines_are_lost_on_every_error_path(tmp_path, fuzz_translator):
    """A call that raises and a server's error answer lose all the call's lines; a short answer loses
    the missing ones; a whole answer loses none."""
    book = Ledger()
    lines = ["a dog runs .", "", "two men sit on a bench ."]

    def crashed(inputs: list[str]) -> list[str]:
        raise RuntimeError("CUDA error: out of memory")

    with pytest.raises(RuntimeError), book.translation(lines) as out:
        out.extend(crashed(lines))
    assert book.lines_lost == 3
    with TestClient(create_app(fuzz_translator, Limits(max_chars=12))) as client:  # the second line is too long
        with pytest.raises(AssertionError, match="422"), book.translation(lines) as out:
            out.extend(answered(client.post("/v1/translate", json={"text": lines})))
        assert book.lines_lost == 6
        with book.translation(lines[:2]) as out:
            out.extend(answered(client.post("/v1/translate", json={"text": lines[:2]})))
        assert book.lines_lost == 6 and len(out) == 2
    with pytest.raises(AssertionError, match="1 of 3 lines lost"), book.translation(lines) as out:
        out.extend(fuzz_translator.translate(lines, DecodeRequest(beam_size=1))[:2])
    assert book.summary()["lines_lost"] == 7
    assert book.summary()["fuzz_inputs"] == 3


def test_the_flood_and_the_attention_requests_are_shed_apart(tmp_path):
    """The flood's 503s and the attention requests' 503s are counted under their own keys, each out of
    its own number of requests, and a measurement not made says so."""
    book = Ledger()
    book.measure("attention_requests", 20, sum)
    book.measure("attention_requests_shed_503", 17, sum)
    book.measure("flood_requests", 1000, sum)
    book.measure("flood_requests_shed_503", 936, sum)
    summary = write_summary(tmp_path, book, passed=True, failed=[], tests=1, command="pytest")
    assert (summary["attention_requests_shed_503"], summary["attention_requests"]) == (17, 20)
    assert (summary["flood_requests_shed_503"], summary["flood_requests"]) == (936, 1000)
    markdown = (tmp_path / "reliability.md").read_text()
    assert "| flood requests shed with 503 | 936 of 1,000 | `flood_requests_shed_503` |" in markdown
    assert "| worst-case attention requests shed with 503 | 17 of 20 |" in markdown
    assert "| server memory growth at peak, MiB | not measured |" in markdown


def test_the_parts_of_two_workers_merge_into_the_ledger_of_one_process(tmp_path):
    """Under pytest-xdist each worker keeps a part of the ledger and the controller merges them: the merged
    summary is the one a single process doing all the damage gives. A kind survived on one worker and not
    on the other is not survived, a foreign file let in by either is let in, a line fuzzed on both counts
    once, counters add, totals add and worst cases take the larger; a hostile line (a lone surrogate)
    travels in the state."""
    evil = tmp_path / "evil.pt"
    evil.write_bytes(b"let in")

    def first(book: Ledger) -> None:
        book.fault("SIGKILL during a step", True)
        book.fault("SIGTERM during training", True)
        with book.translation(["a dog", "\ud800 lone"]) as out:
            out.extend(["ein Hund", ""])
        book.measure("flood_requests", 1000, sum)
        book.measure("attention_worst_response_bytes", 700)
        with book.foreign(evil):
            pass
        with book.command() as ran:
            ran.update(status=1, stderr="error: bad value\n")

    def second(book: Ledger) -> None:
        book.fault("SIGKILL during a step", False)
        with pytest.raises(AssertionError), book.translation(["a dog", "a cat"]) as out:
            out.append("ein Hund")
        book.measure("flood_requests", 500, sum)
        book.measure("attention_worst_response_bytes", 900)
        with pytest.raises(AssertionError), book.foreign(evil):
            raise AssertionError("loaded")
        book.partial_checkpoints_seen += 1
        with book.command() as ran:
            ran.update(status=70, stderr="internal error\n")

    whole, a, b, merged = Ledger(), Ledger(), Ledger(), Ledger()
    first(whole)
    second(whole)
    first(a)
    second(b)
    for part in (a, b):
        merged.merge(part.state())
    summary = merged.summary()
    assert summary == whole.summary()
    assert (summary["faults_injected"], summary["faults_survived"], summary["fuzz_inputs"]) == (2, 1, 3)
    assert (summary["foreign_files"], summary["foreign_files_refused"], summary["lines_lost"]) == (1, 0, 1)
    assert (summary["flood_requests"], summary["attention_worst_response_bytes"]) == (1500, 900)
    assert (summary["cli_cases"], summary["cli_tracebacks"], summary["partial_checkpoints_seen"]) == (2, 1, 1)
    assert "\ud800 lone" in merged.fuzzed


GROWER = ("import sys\nsys.stdin.readline()\nheld = b'x' * (64 << 20)\n"  # 64 MiB, written: resident
          "print('grown', flush=True)\nsys.stdin.readline()\n")


def test_a_server_that_grows_past_its_bound_or_dies_did_not_survive():
    """server_damage against a real process: quiet and alive is survived; 64 MiB more resident memory
    against a 32 MiB bound is not, and the growth is kept in MiB; a process killed meanwhile is not."""
    book = Ledger()
    procs = [subprocess.Popen([sys.executable, "-c", GROWER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(3)]
    try:
        quiet, grower, dying = procs
        with book.server_damage("quiet", quiet, 32):
            time.sleep(0.2)
        with pytest.raises(AssertionError, match="MiB at peak"), book.server_damage("grows", grower, 32) as rss:
            grower.stdin.write("\n")
            grower.stdin.flush()
            assert grower.stdout.readline() == "grown\n"
            time.sleep(0.2)  # sampled every 20 ms
        assert 60 < rss.growth < 100
        with pytest.raises(AssertionError, match="exited"), book.server_damage("dies", dying, 300):
            dying.kill()
            dying.wait()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    summary = book.summary()
    assert summary["fault_kinds"] == {"dies": {"done": 1, "survived": 0}, "grows": {"done": 1, "survived": 0},
                                      "quiet": {"done": 1, "survived": 1}}
    assert 60 < summary["server_peak_rss_growth_mib"] < 100


def test_the_summary_records_the_commit_and_a_dirty_tree(tmp_path):
    """The commit a clean checkout is at, dirty: false; the suite's results or the README changed, still
    false; the package changed, or a test file added, true; outside a checkout, unknown."""
    repo = tmp_path / "checkout"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(repo)], check=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    summary = write_summary(tmp_path / "results", Ledger(), passed=True, failed=[], tests=1, command="pytest",
                            repo=repo)
    assert len(summary["commit"]) >= 7 and head.startswith(summary["commit"]) and summary["dirty"] is False
    assert json.loads((tmp_path / "results" / "reliability.json").read_text())["commit"] == summary["commit"]
    assert f"| commit the suite ran at | {summary['commit']} |" in (tmp_path / "results" / "reliability.md").read_text()
    clean = {"commit": summary["commit"], "dirty": False}
    (repo / "benchmarks" / "results" / "reliability.json").write_text("{}\n")
    (repo / "README.md").write_text("changed\n")
    assert git_state(repo) == clean
    (repo / "tests" / "reliability" / "test_new.py").write_text("")
    assert git_state(repo) == clean | {"dirty": True}
    (repo / "tests" / "reliability" / "test_new.py").unlink()
    (repo / "transformer" / "model.py").write_text("changed\n")
    assert git_state(repo) == clean | {"dirty": True}
    assert git_state(tmp_path) == {"commit": None, "dirty": None}


def test_a_command_that_crashes_counts_as_a_traceback(tmp_path, capsys, monkeypatch):
    """The command matrix's counters: a refusal counts as a case; a command that exits 70 (an internal
    error), one that prints a traceback and one that lets an exception out count as tracebacks too."""
    book = Ledger()
    assert run(["average", str(tmp_path), "--last", "1", "--out", str(tmp_path / "a.pt")], capsys, book)[0] == 1
    assert (book.cli_cases, book.cli_tracebacks) == (1, 0)

    def bug(path):
        raise RuntimeError("an unforeseen failure")

    monkeypatch.setattr("transformer.trees.read_trees", bug)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert run(["evaluate-parse", "--gold", "g.mrg", "--test", "t.mrg"], capsys, book)[0] == 70
    assert (book.cli_cases, book.cli_tracebacks) == (2, 1)
    with book.command() as ran:
        ran.update(status=1, stderr="Traceback (most recent call last):\n  ...\nValueError: x\n")
    with pytest.raises(RuntimeError), book.command():
        raise RuntimeError("let out of main")
    summary = write_summary(tmp_path, book, passed=False, failed=["test_x"], tests=1, command="pytest")
    assert (summary["cli_cases"], summary["cli_tracebacks"]) == (4, 3)
    assert ("| command-line runs with a bad value that ended in a traceback or an internal error | 3 of 4 |"
            in (tmp_path / "reliability.md").read_text())
