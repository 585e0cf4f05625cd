"""The counters can show a failure: faults broken on purpose, recorded in a ledger of their own."""

import json

import pytest
import torch

from tests.reliability.conftest import Ledger, write_summary
from transformer.checkpoint import list_checkpoints, load_checkpoint
from transformer.config import load_config
from transformer.data import BatchOrder
from transformer.train import train


def test_a_fault_that_was_not_survived_shows_in_the_summary(tmp_path, tiny_overrides, monkeypatch):
    """A resume that skips a batch, a committed checkpoint whose tensors were cut short, a translation
    that drops a line and a foreign file that was let in: each is reported by the counters, and the
    summary file says the run did not pass."""
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
    with book.damage("SIGTERM during training"):  # one that was survived, beside it
        pass

    weights = list_checkpoints(run)[0].with_suffix(".safetensors")
    weights.write_bytes(weights.read_bytes()[:-100])  # the record still vouches for the whole file
    assert book.checkpoints(run) == 1
    assert book.outputs(["a dog", "", "a cat"], ["ein Hund", ""]) == 1
    foreign = tmp_path / "evil.pt"
    foreign.write_bytes(b"not refused")
    assert not book.foreign(foreign, refused=False)

    summary = write_summary(tmp_path / "results", book, passed=False, failed=["test_x"], tests=2, command="pytest")
    assert json.loads((tmp_path / "results" / "reliability.json").read_text()) == summary
    assert (summary["faults_injected"], summary["faults_survived"]) == (2, 1)
    assert summary["fault_kinds"]["resume that skips a batch"] == {"done": 1, "survived": 0}
    assert summary["partial_checkpoints_seen"] == 1 and summary["lines_lost"] == 1
    assert (summary["foreign_files"], summary["foreign_files_refused"]) == (1, 0)
    assert summary["passed"] is False and summary["failed_tests"] == ["test_x"]
    assert summary["fuzz_inputs"] == 3
