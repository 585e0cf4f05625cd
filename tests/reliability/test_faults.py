"""Nothing lost, nothing let in: training, checkpoints and model files under real damage."""

import errno
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from transformer.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, write_model
from transformer.config import load_config
from transformer.train import TrainError, train
from transformer.translator import Translator

ENV = os.environ | {"OMP_NUM_THREADS": "1"}


@pytest.fixture
def overrides(tiny_overrides):
    return tiny_overrides + ["train.log_every=1", "train.eval_every=100000", "model.p_drop=0.1"]


def sets(overrides: list[str]) -> list[str]:
    return [x for o in overrides for x in ("--set", o)]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(list_checkpoints(run)[-1]).weights


def assert_bit_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def assert_no_partial_checkpoint(run: Path, tally) -> None:
    """Every committed checkpoint (a JSON record) verifies completely; debris is never a checkpoint."""
    for path in list_checkpoints(run):
        try:
            load_checkpoint(path)
        except CheckpointError:
            tally["partial_checkpoints_seen"] += 1
            raise


KILLER = """
import os, signal, sys
import transformer.checkpoint as C
import transformer.train as T
from transformer.cli import main
mode, at, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
calls = 0
def count():
    global calls
    calls += 1
    if calls == at:
        os.kill(os.getpid(), signal.SIGKILL)
if mode == "step":
    step = T.train_step
    def train_step(*a, **k):
        count()
        return step(*a, **k)
    T.train_step = train_step
elif mode == "write":  # dies inside a checkpoint write: after the temp file, before its rename
    replace = C.os.replace
    class Os:
        def __getattr__(self, name):
            return getattr(os, name)
        def replace(self, src, dst):
            count()
            return replace(src, dst)
    C.os = Os()
sys.exit(main(argv))
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sigkill_at_random_moments_then_resume_is_bit_exact(tmp_path, overrides, seed, tally):
    ov = overrides + ["train.max_steps=12", "train.save_every=3", "train.keep_last=10"]
    reference = tmp_path / "reference"
    train(load_config("tiny", ov), reference, quiet=True)
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    run, rng = tmp_path / "run", random.Random(seed)
    argv = ["train", "tiny", "--out", str(run), "--quiet", "--resume", *sets(ov)]
    for attempt in range(4):
        mode = rng.choice(["step", "write"])
        proc = subprocess.run([sys.executable, str(script), mode, str(rng.randint(1, 7)), *argv], env=ENV,
                              capture_output=True, text=True, timeout=300)
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
        tally["faults_injected"] += 1
        assert_no_partial_checkpoint(run, tally)
        tally["faults_survived"] += 1
    else:
        proc = subprocess.run([sys.executable, "-m", "transformer", *argv], env=ENV, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert_no_partial_checkpoint(run, tally)
    assert load_checkpoint(list_checkpoints(run)[-1]).meta["train_state"]["step"] == 12
    assert_bit_equal(weights(run), weights(reference))


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_finishes_the_step_saves_and_resumes_exactly(tmp_path, overrides, signum, code, tally):
    run = tmp_path / "run"
    ov = overrides + ["train.max_steps=100000", "train.save_every=0", "train.save_minutes=0"]
    proc = subprocess.Popen([sys.executable, "-m", "transformer", "train", "tiny", "--out", str(run), "--quiet",
                             *sets(ov)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.1)
    sent = time.monotonic()
    proc.send_signal(signum)
    tally["faults_injected"] += 1
    _, stderr = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 10, "did not exit within 10 s"
    assert proc.returncode == code, stderr[-2000:]
    assert "continue with --resume" in stderr
    stopped = load_checkpoint(list_checkpoints(run)[-1]).meta["train_state"]["step"]
    assert stopped >= 3
    end = overrides + [f"train.max_steps={stopped + 3}"]
    resumed = subprocess.run([sys.executable, "-m", "transformer", "train", "tiny", "--out", str(run), "--quiet",
                              "--resume", *sets(end + ["train.save_every=0", "train.save_minutes=0"])], env=ENV,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    reference = tmp_path / "reference"
    train(load_config("tiny", end + ["train.save_every=0", "train.save_minutes=0"]), reference, quiet=True)
    assert_bit_equal(weights(run), weights(reference))
    tally["faults_survived"] += 1


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "delete_state"])
def test_a_corrupt_newest_checkpoint_is_refused_and_resume_falls_back(tmp_path, overrides, damage, tally):
    run = tmp_path / "run"
    ov = overrides + ["train.max_steps=4", "train.save_every=2"]
    train(load_config("tiny", ov), run, quiet=True)
    newest = list_checkpoints(run)[-1]
    target = {"truncate": newest.with_suffix(".safetensors"), "flip_byte": newest.with_suffix(".safetensors"),
              "delete_state": newest.with_name(newest.stem + ".state.safetensors")}[damage]
    data = bytearray(target.read_bytes())
    if damage == "truncate":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "flip_byte":
        data[-7] ^= 0xFF  # inside the tensor bytes, past the header
        target.write_bytes(bytes(data))
    else:
        target.unlink()
    tally["faults_injected"] += 1
    with pytest.raises(CheckpointError, match=target.name):
        load_checkpoint(newest)
    train(load_config("tiny", overrides + ["train.max_steps=6", "train.save_every=2"]), run, resume=True,
          quiet=True)
    log = (run / "train.log").read_text()
    assert f"skipping {target.name}" in log and "resumed from step_00000002.json at step 2" in log
    assert load_checkpoint(list_checkpoints(run)[-1]).meta["train_state"]["step"] == 6
    tally["faults_survived"] += 1


class _WritesAFile:
    """Unpickling this would create a file: proof that a loader ran code from a model file."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("suffix", [".pt", ".bin", ".safetensors"])
def test_pickle_files_are_refused_and_never_run(tmp_path, overrides, suffix, tally):
    run = tmp_path / "run"
    train(load_config("tiny", overrides + ["train.max_steps=2"]), run, quiet=True)
    proof = tmp_path / "pwned"
    evil = tmp_path / f"model{suffix}"
    evil.write_bytes(pickle.dumps({"weights": _WritesAFile(str(proof))}))
    with pytest.raises(CheckpointError) as e:
        Translator(run, evil)
    assert evil.name in str(e.value) or "model.json" in str(e.value)
    proc = subprocess.run([sys.executable, "-m", "transformer", "translate", str(run), "--checkpoint", str(evil)],
                          input="a dog\n", env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert not proof.exists()
    tally["foreign_files_refused"] += 2


def test_safetensors_that_do_not_fit_the_config_are_refused(tmp_path, overrides, tally):
    run = tmp_path / "run"
    train(load_config("tiny", overrides + ["train.max_steps=2"]), run, quiet=True)
    ckpt = load_checkpoint(list_checkpoints(run)[-1])
    meta = {k: ckpt.meta[k] for k in ("config", "vocab_sha256")}
    wrong = dict(ckpt.weights)
    wrong["encoder.0.ffn.w1.weight"] = torch.zeros(3, 3)
    write_model(tmp_path / "wrong.safetensors", wrong, meta)
    with pytest.raises(CheckpointError, match="do not fit the config"):
        Translator(run, tmp_path / "wrong.safetensors")
    tally["foreign_files_refused"] += 1


def test_disk_full_during_a_checkpoint_stops_clearly_and_keeps_earlier_ones(tmp_path, overrides, monkeypatch,
                                                                            tally):
    import transformer.train as T
    real, calls = T.save_checkpoint, {"n": 0}

    def full_disk(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)
    monkeypatch.setattr(T, "save_checkpoint", full_disk)
    run = tmp_path / "run"
    tally["faults_injected"] += 1
    with pytest.raises(TrainError, match="No space left on device.*earlier checkpoints are intact"):
        train(load_config("tiny", overrides + ["train.max_steps=10", "train.save_every=2"]), run, quiet=True)
    assert [load_checkpoint(p).meta["train_state"]["step"] for p in list_checkpoints(run)] == [2, 4]
    tally["faults_survived"] += 1


def test_an_unwritable_run_folder_stops_clearly(tmp_path, overrides, tally):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; the injected ENOSPC test covers the error path")
    run = tmp_path / "run"
    train(load_config("tiny", overrides + ["train.max_steps=2", "train.save_every=2"]), run, quiet=True)
    (run / "checkpoints").chmod(0o500)
    try:
        with pytest.raises(TrainError, match="cannot write the checkpoint"):
            train(load_config("tiny", overrides + ["train.max_steps=4", "train.save_every=2"]), run, resume=True,
                  quiet=True)
    finally:
        (run / "checkpoints").chmod(0o700)
    assert load_checkpoint(list_checkpoints(run)[-1]).meta["train_state"]["step"] == 2
    tally["faults_injected"] += 1
    tally["faults_survived"] += 1


@pytest.mark.parametrize("change", ["model.d_ff=96", "train.seed=7", "train.warmup_steps=7", "data.vocab_size=400"])
def test_resume_with_a_changed_config_is_refused_with_the_fields(tmp_path, overrides, change, tally):
    run = tmp_path / "run"
    train(load_config("tiny", overrides + ["train.max_steps=2", "train.save_every=2"]), run, quiet=True)
    field = change.split("=")[0]
    with pytest.raises(TrainError, match=f"{field}: .* -> "):
        train(load_config("tiny", overrides + ["train.max_steps=4", change]), run, resume=True, quiet=True)
    tally["foreign_files_refused"] += 1
    if field.startswith("train."):  # the override resumes, and says so
        train(load_config("tiny", overrides + ["train.max_steps=4", change]), run, resume=True, quiet=True,
              allow_config_change=True)
        assert f"resuming with changed config (--allow-config-change): {field}" in (run / "train.log").read_text()


def test_same_config_and_seed_give_the_same_checkpoints_and_the_log_says_how(tmp_path, overrides):
    a, b = tmp_path / "a", tmp_path / "b"
    for run in (a, b):
        train(load_config("tiny", overrides + ["train.max_steps=4", "train.save_every=2"]), run, quiet=True)
    for pa, pb in zip(list_checkpoints(a), list_checkpoints(b), strict=True):
        assert_bit_equal(load_checkpoint(pa).weights, load_checkpoint(pb).weights)
    log = (a / "train.log").read_text()
    assert f"torch {torch.__version__}" in log and "seed 1" in log and "config sha256" in log
