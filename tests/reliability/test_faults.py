"""Nothing lost, nothing let in: training, checkpoints and model files under real damage."""

import contextlib
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.reliability.ledger import Ledger
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


KILLER = """
import os, signal, sys
import transformer.files as F
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
    step = T.queue_step
    def queue_step(*a, **k):
        count()
        return step(*a, **k)
    T.queue_step = queue_step
elif mode == "write":  # dies inside a checkpoint write: after the temp file, before its rename
    replace = F.os.replace
    class Os:
        def __getattr__(self, name):
            return getattr(os, name)
        def replace(self, src, dst):
            if "checkpoints" in str(dst) or os.path.basename(dst).startswith("best."):
                count()
            return replace(src, dst)
    F.os = Os()  # every atomic write goes through files.atomic_path
sys.exit(main(argv))
"""


KINDS = {"step": "SIGKILL during a training step", "write": "SIGKILL inside a checkpoint write"}


@contextlib.contextmanager
def killed_and_resumed(tmp_path: Path, run: Path, ov: list[str], rng: random.Random, nth: tuple[int, int],
                       ledger: Ledger) -> Iterator[list[int]]:
    """Trains ``run`` with --resume under KILLER up to four times, each dying at a random moment (a
    step, or inside a checkpoint write; the nth such call, nth drawn from the range), then once more
    without it if it never finished. Each death is a fault of its kind, open until the block ends:
    survived only if every later resume and every check in the block pass. A run under KILLER that
    exits otherwise (a crash) is a fault not survived. Yields the partial checkpoints found after each kill."""
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    argv = ["train", "tiny", "--out", str(run), "--quiet", "--resume", *sets(ov)]
    partial: list[int] = []
    with contextlib.ExitStack() as faults:
        for _ in range(4):
            mode = rng.choice(["step", "write"])
            proc = subprocess.run([sys.executable, str(script), mode, str(rng.randint(*nth)), *argv], env=ENV,
                                  capture_output=True, text=True, timeout=300)
            if proc.returncode == 0:
                break
            faults.enter_context(ledger.damage(KINDS[mode]))
            assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
            partial.append(ledger.checkpoints(run))
        else:
            proc = subprocess.run([sys.executable, "-m", "transformer", *argv], env=ENV, capture_output=True,
                                  text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr[-2000:]
        yield partial


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sigkill_at_random_moments_then_resume_is_bit_exact(tmp_path, overrides, seed, ledger):
    """Each kill survived: nothing partial on disk after it or at the end, and the run ends bit-exact."""
    ov = overrides + ["train.max_steps=12", "train.save_every=3", "train.keep_last=10"]
    reference = tmp_path / "reference"
    train(load_config("tiny", ov), reference, quiet=True)
    run = tmp_path / "run"
    with killed_and_resumed(tmp_path, run, ov, random.Random(seed), (1, 7), ledger) as partial:
        assert partial == [0] * len(partial) and ledger.checkpoints(run) == 0
        final = load_checkpoint(list_checkpoints(run)[-1])
        assert final.meta["train_state"]["step"] == 12
        assert_bit_equal(final.weights, weights(reference))


def test_keep_best_survives_sigkill_and_resume(tmp_path, overrides, ledger):
    """SIGKILL (in a step, or inside a write: best.safetensors is written the same way) and resume, four
    times: the best weights, their record and the patience count equal an uninterrupted run's."""
    ov = overrides + ["train.max_steps=12", "train.save_every=3", "train.keep_last=10", 'train.keep_best="valid_loss"',
                      "train.eval_every=2", "train.patience=100"]
    reference = tmp_path / "reference"
    train(load_config("tiny", ov), reference, quiet=True)
    run = tmp_path / "run"
    with killed_and_resumed(tmp_path, run, ov, random.Random(5), (2, 8), ledger) as partial:
        assert len(partial) >= 2 and partial == [0] * len(partial) and (run / "best.safetensors").is_file()
        ours, theirs = load_checkpoint(run / "best.safetensors"), load_checkpoint(reference / "best.safetensors")
        assert ours.meta["best"] == theirs.meta["best"]
        assert_bit_equal(ours.weights, theirs.weights)
        best = json.loads((run / "summary.json").read_text())["best"]
        assert best == json.loads((reference / "summary.json").read_text())["best"]
        final = load_checkpoint(list_checkpoints(run)[-1]).meta["train_state"]
        expected = load_checkpoint(list_checkpoints(reference)[-1]).meta["train_state"]
        assert (final["best_step"], final["evals_since_best"]) == (expected["best_step"], expected["evals_since_best"])


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_finishes_the_step_saves_and_resumes_exactly(tmp_path, overrides, signum, code, ledger):
    run = tmp_path / "run"
    ov = overrides + ["train.max_steps=100000", "train.save_every=0", "train.save_minutes=0"]
    proc = subprocess.Popen([sys.executable, "-m", "transformer", "train", "tiny", "--out", str(run), "--quiet",
                             *sets(ov)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.1)
    with ledger.damage(f"{signal.Signals(signum).name} during training"):
        signal_then_resume(proc, run, signum, code, overrides, tmp_path)


def signal_then_resume(proc: subprocess.Popen, run: Path, signum: int, code: int, overrides: list[str],
                       tmp_path: Path) -> None:
    sent = time.monotonic()
    proc.send_signal(signum)
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


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "delete_state"])
def test_a_corrupt_newest_checkpoint_is_refused_and_resume_falls_back(tmp_path, overrides, damage, ledger):
    run = tmp_path / "run"
    ov = overrides + ["train.max_steps=4", "train.save_every=2"]
    train(load_config("tiny", ov), run, quiet=True)
    newest = list_checkpoints(run)[-1]
    target = {"truncate": newest.with_suffix(".safetensors"), "flip_byte": newest.with_suffix(".safetensors"),
              "delete_state": newest.with_name(newest.stem + ".state.safetensors")}[damage]
    with ledger.damage({"truncate": "newest checkpoint truncated", "flip_byte": "a byte flipped in the newest "
                        "checkpoint", "delete_state": "newest checkpoint without its state file"}[damage]):
        corrupt_then_resume(run, newest, target, damage, overrides)


def corrupt_then_resume(run: Path, newest: Path, target: Path, damage: str, overrides: list[str]) -> None:
    data = bytearray(target.read_bytes())
    if damage == "truncate":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "flip_byte":
        data[-7] ^= 0xFF  # inside the tensor bytes, past the header
        target.write_bytes(bytes(data))
    else:
        target.unlink()
    with pytest.raises(CheckpointError, match=target.name):
        load_checkpoint(newest)
    train(load_config("tiny", overrides + ["train.max_steps=6", "train.save_every=2"]), run, resume=True,
          quiet=True)
    log = (run / "train.log").read_text()
    assert f"skipping {target}" in log and "resumed from step_00000002.json at step 2" in log
    assert load_checkpoint(list_checkpoints(run)[-1]).meta["train_state"]["step"] == 6


def test_a_resume_that_no_checkpoint_can_serve_is_refused_and_keeps_them(tmp_path, tiny_overrides):
    """Every state file damaged: --resume trained from step 0 and exited 0, writing over the checkpoints (whose
    weights still verified) and pruning its own new ones as older than theirs."""
    run = tmp_path / "run"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=4", "train.save_every=2"]), run, quiet=True)
    for state in (run / "checkpoints").glob("*.state.safetensors"):
        data = bytearray(state.read_bytes())
        data[-7] ^= 0xFF
        state.write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    with pytest.raises(TrainError, match=r"--resume: none of the 2 checkpoints in .*checkpoints holds an intact "
                                         r"training state \(each is named in train.log\); .* move that folder away first"):  # --quiet said "above"
        train(load_config("tiny", tiny_overrides + ["train.max_steps=6", "train.save_every=2"]), run, resume=True,
              quiet=True)
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before


class _WritesAFile:
    """Unpickling this would create a file: proof that a loader ran code from a model file."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("suffix", [".pt", ".bin", ".safetensors"])
def test_pickle_files_are_refused_and_never_run(tmp_path, overrides, suffix, ledger):
    run = tmp_path / "run"
    train(load_config("tiny", overrides + ["train.max_steps=2"]), run, quiet=True)
    proof = tmp_path / "pwned"
    evil = tmp_path / f"model{suffix}"
    evil.write_bytes(pickle.dumps({"weights": _WritesAFile(str(proof))}))
    with ledger.foreign(evil):  # refused by the loader and by the command, and its code never ran
        with pytest.raises(CheckpointError) as refused:
            Translator(run, evil)
        proc = subprocess.run([sys.executable, "-m", "transformer", "translate", str(run), "--checkpoint",
                               str(evil)], input="a dog\n", env=ENV, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-1500:]
        assert not proof.exists()
    assert evil.name in str(refused.value) or "model.json" in str(refused.value)


def test_safetensors_that_do_not_fit_the_config_are_refused(tmp_path, overrides, ledger):
    run = tmp_path / "run"
    train(load_config("tiny", overrides + ["train.max_steps=2"]), run, quiet=True)
    ckpt = load_checkpoint(list_checkpoints(run)[-1])
    meta = {k: ckpt.meta[k] for k in ("config", "vocab_sha256")}
    wrong = dict(ckpt.weights)
    wrong["encoder.0.ffn.w1.weight"] = torch.zeros(3, 3)
    write_model(tmp_path / "wrong.safetensors", wrong, meta)
    with ledger.foreign(tmp_path / "wrong.safetensors"), pytest.raises(CheckpointError, match="do not fit the config"):
        Translator(run, tmp_path / "wrong.safetensors")


FULL_DISK = """
import json, os, resource, signal, sys
from pathlib import Path
from transformer.checkpoint import CheckpointError, list_checkpoints, load_checkpoint
from transformer.config import load_config
from transformer.train import TrainError, train
root, mode, overrides = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
run = root / "run"
config = lambda steps: load_config("tiny", overrides + [f"train.max_steps={steps}", "train.save_every=2"])
train(config(4), run, quiet=True)
half = (run / "checkpoints" / "step_00000004.safetensors").stat().st_size // 2
if mode == "tmpfs":  # fill the filesystem, then free half a weights file: the next one runs out mid-write
    fd = os.open(root / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(1 << 16))
    except OSError:
        pass
    os.ftruncate(fd, max(os.fstat(fd).st_size - half, 0))
    os.close(fd)
else:  # no user namespace to mount a tmpfs in: the kernel refuses any file past half a weights file
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (half, resource.RLIM_INFINITY))
try:
    train(config(10), run, resume=True, quiet=True)
    error = None
except TrainError as e:
    error = str(e)
def loads(path):
    try:
        return load_checkpoint(path).meta["train_state"]["step"]
    except CheckpointError as e:
        return str(e)
after_failure = {"steps": [loads(p) for p in list_checkpoints(run)],
                 "files": sorted(p.name for p in (run / "checkpoints").iterdir())}
if mode == "tmpfs":  # make room, and resume
    (root / "filler").unlink()
else:
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
train(config(10), run, resume=True, quiet=True)
print(json.dumps({"error": error, "after_failure": after_failure,
                  "after_resume": [loads(p) for p in list_checkpoints(run)]}))
"""


def tmpfs_available() -> bool:
    """Whether this process may mount a small tmpfs in its own user + mount namespace (no root needed)."""
    try:
        return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                               "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_disk_full_during_a_checkpoint_stops_clearly_and_keeps_earlier_ones(tmp_path, overrides, ledger):
    """The real save_checkpoint runs out of space inside a tensor file: on a 16 MiB tmpfs filled to
    within half a weights file (real ENOSPC; where no user namespace can be made, a file-size limit
    that the kernel enforces the same way, EFBIG). Training stops with a clear error; every committed
    checkpoint still verifies, no temp file is left behind, and after making room --resume goes on."""
    script, root = tmp_path / "full_disk.py", tmp_path / "disk"
    script.write_text(FULL_DISK)
    root.mkdir()
    mode = "tmpfs" if tmpfs_available() else "fsize"
    command = [sys.executable, str(script), str(root), mode, *overrides, "train.log_every=1000"]
    if mode == "tmpfs":
        command = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                   f'mount -t tmpfs -o size=16m tmpfs "{root}" && exec "$@"', "sh", *command]
    with ledger.damage("disk full during a checkpoint write"):
        proc = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        result = json.loads(proc.stdout.splitlines()[-1])
        reason = "No space left on device" if mode == "tmpfs" else "File too large"
        assert result["error"] and reason in result["error"] and "earlier checkpoints are intact" in result["error"]
        assert result["after_failure"]["steps"] == [2, 4]  # every committed checkpoint loads, nothing newer
        assert not [f for f in result["after_failure"]["files"] if f.endswith(".tmp")]  # no debris of the write
        assert result["after_resume"][-1] == 10 and all(isinstance(s, int) for s in result["after_resume"])


def test_an_unwritable_run_folder_stops_clearly(tmp_path, overrides, ledger):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; the injected ENOSPC test covers the error path")
    run = tmp_path / "run"
    train(load_config("tiny", overrides + ["train.max_steps=2", "train.save_every=2"]), run, quiet=True)
    (run / "checkpoints").chmod(0o500)
    with ledger.damage("run folder made read-only"):
        try:
            with pytest.raises(TrainError, match="cannot write the checkpoint"):
                train(load_config("tiny", overrides + ["train.max_steps=4", "train.save_every=2"]), run, resume=True,
                      quiet=True)
        finally:
            (run / "checkpoints").chmod(0o700)
        assert load_checkpoint(list_checkpoints(run)[-1]).meta["train_state"]["step"] == 2


@pytest.mark.parametrize("change", ["model.d_ff=96", "train.seed=7", "train.warmup_steps=7", "data.vocab_size=400"])
def test_resume_with_a_changed_config_is_refused_with_the_fields(tmp_path, overrides, change, ledger):
    run = tmp_path / "run"
    train(load_config("tiny", overrides + ["train.max_steps=2", "train.save_every=2"]), run, quiet=True)
    field = change.split("=")[0]
    with ledger.damage("resume with a changed config"), pytest.raises(TrainError, match=f"{field}: .* -> "):
        train(load_config("tiny", overrides + ["train.max_steps=4", change]), run, resume=True, quiet=True)
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
