"""Data parallelism (§5.2) on CPU with gloo, launched by torchrun as a user would."""

import contextlib
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from transformer import distributed
from transformer.checkpoint import list_checkpoints, load_checkpoint
from transformer.config import load_config
from transformer.data import BatchOrder, encode_pairs, make_batches, read_parallel
from transformer.prepare import resolve_data_path
from transformer.tokenizer import Tokenizer
from transformer.train import TrainError, train

pytestmark = pytest.mark.slow
ENV = os.environ | {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # gloo on CPUs, GPU or not


def sets(overrides: list[str]) -> list[str]:
    return [x for o in overrides for x in ("--set", o)]


def launch(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transformer", *args], env=ENV, timeout=timeout,
                          capture_output=True, text=True)


def torchrun_script(tmp_path, body: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script)], env=ENV, timeout=timeout, capture_output=True, text=True)
    return proc, time.monotonic() - start


def rank_1_signalled(run, overrides: list[str], signal_name: str, call: int) -> str:
    """A torchrun script that trains the tiny model into ``run``, rank 1 sending itself ``signal_name`` as it
    queues its ``call``-th step."""
    return f"""
        import os, signal
        import transformer.train as T
        from transformer.config import load_config
        step = T.queue_step
        calls = 0
        def signalled_step(*args, **kwargs):
            global calls
            calls += 1
            if os.environ["RANK"] == "1" and calls == {call}:
                os.kill(os.getpid(), signal.{signal_name})
            return step(*args, **kwargs)
        T.queue_step = signalled_step
        T.train(load_config("tiny", {overrides!r}), {str(run)!r}, quiet=True)
    """


def test_two_ranks_equal_one_process_on_the_same_global_batches(tmp_path, tiny_overrides, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # like the ranks: CPU, GPU or not
    steps = 5
    overrides = tiny_overrides + ["model.p_drop=0.0", f"train.max_steps={steps}", f"train.save_every={steps}",
                                  "train.threads=1", "train.max_tokens=512", "train.log_every=1"]
    cfg = load_config("tiny", overrides)
    one, two = tmp_path / "one", tmp_path / "two"
    # one process accumulating 2 batches per step: step k takes batches 2k and 2k+1 of the epoch order
    train(load_config("tiny", overrides + ["train.update_freq=2"]), one, quiet=True)
    # two ranks, one batch each: rank r takes batch 2k + r; the same vocabulary file
    two.mkdir()
    shutil.copy(one / "spm.model", two / "spm.model")
    proc = launch(["train", "tiny", "--out", str(two), "--nproc", "2", "--quiet", *sets(overrides)])
    assert proc.returncode == 0, proc.stderr[-3000:]

    # the ranks held different numbers of target tokens, so a mean of rank means would differ
    tok = Tokenizer(one / "spm.model")
    examples, _ = encode_pairs(read_parallel(resolve_data_path(cfg.data.train_src),
                                             resolve_data_path(cfg.data.train_tgt)), tok, cfg.data.max_len)
    batches = make_batches(examples, cfg.train.max_tokens)
    assert len(batches) >= 2 * steps  # all steps within the first epoch
    order = BatchOrder(len(batches), cfg.train.seed).epoch_order(0)
    tokens = [sum(len(examples[i].tgt) for i in batches[b]) for b in order[:2 * steps]]
    assert any(tokens[2 * k] != tokens[2 * k + 1] for k in range(steps))

    a = load_checkpoint(list_checkpoints(one)[-1]).weights
    b = load_checkpoint(list_checkpoints(two)[-1]).weights
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=2e-6, rtol=1e-5, msg=name)
    # the logged loss is the step's, over all ranks' tokens (it was rank 0's loss over the ranks' mean count)
    losses = [[json.loads(line)["train_loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
              for run in (one, two)]
    assert len(losses[0]) == steps and losses[1] == pytest.approx(losses[0], rel=1e-5)


def test_ranks_with_different_configs_are_stopped(tmp_path, tiny_overrides):
    proc, _ = torchrun_script(tmp_path, f"""
        import os
        from transformer.config import load_config
        from transformer.train import train
        rank = int(os.environ["RANK"])
        overrides = {tiny_overrides!r} + ["train.max_steps=2", f"model.d_ff={{64 + 32 * rank}}"]
        train(load_config("tiny", overrides), {str(tmp_path / "run")!r}, quiet=True)
    """)
    assert proc.returncode != 0
    said = ("the ranks disagree on the config, the data or the vocabulary: rank 1 differs from rank 0 in model.d_ff "
            "64 (rank 0) vs 96")
    assert said in proc.stderr, proc.stderr[-2000:]


def test_ranks_on_files_of_other_content_or_one_alone_resuming_are_stopped(tmp_path, tiny_overrides):
    """A fine-tune (or a resume) trains no vocabulary, whose record had been the one check of each rank's data: a
    rank reading a stale copy of the files under the same names trained on without a word. A rank alone given
    --resume ended in DDP's internal error (the ranks' collectives out of step). The files are compared byte for
    byte, as a resume compares them with its checkpoint's record on every rank: the same text compressed at
    another time trained, then stopped that rank alone at the next resume."""
    parent = tmp_path / "parent"
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), parent, quiet=True)
    given = Path(next(o for o in tiny_overrides if o.startswith("data.valid_src=")).split("=", 1)[1].strip('"'))
    lines = given.read_text(encoding="utf-8").splitlines()
    stale = tmp_path / "stale_copy"  # what rank 1's node holds under the config's name
    stale.write_text("A different first line.\n" + "".join(line + "\n" for line in lines[1:]), encoding="utf-8")
    script = """
        import os
        from pathlib import Path
        import transformer.train as T
        from transformer.config import load_config
        rank = int(os.environ["RANK"])
        named = T.data_paths  # the config's names as rank 1's node resolves them
        T.data_paths = lambda cfg: {{**named(cfg), "valid_src": Path({copy!r})}} if rank == 1 else named(cfg)
        T.train(load_config("tiny", {overrides!r} + ["train.max_steps=2"]), {out!r}, quiet=True,
                resume={resume}, init_from={parent!r})
    """
    proc, _ = torchrun_script(tmp_path, script.format(copy=str(stale), overrides=tiny_overrides, resume="rank == 1",
                                                      out=str(tmp_path / "run"), parent=str(parent)))
    assert proc.returncode != 0
    assert "rank 1 differs from rank 0 in data.valid_src's file (sha256 " in proc.stderr, proc.stderr[-3000:]
    assert "; --resume False (rank 0) vs True (each rank must be started" in proc.stderr, proc.stderr[-3000:]
    assert "internal error" not in proc.stderr and not list_checkpoints(tmp_path / "run")
    # the same text in other bytes (compressed at another time: a gzip header holds the time), refused at the start
    with gzip.GzipFile(same := tmp_path / "same_text.gz", "wb", mtime=12345) as f:
        f.write(given.read_bytes())
    proc, _ = torchrun_script(tmp_path, script.format(copy=str(same), overrides=tiny_overrides, resume=False,
                                                      out=str(tmp_path / "run2"), parent=str(parent)))
    assert proc.returncode != 0 and "data.valid_src's file" in proc.stderr, proc.stderr[-3000:]
    assert "not a gzip made again or a store written from other paths)" in proc.stderr


def test_ranks_that_find_different_checkpoints_are_stopped(tmp_path, tiny_overrides):
    """Ranks that each see a run folder of their own (nodes without a shared disk): rank 0 resumed at its
    checkpoint, rank 1 found none and trained from step 0, and the job ran on, out of step, to "done"."""
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), tmp_path / "a", quiet=True)
    shutil.copytree(tmp_path / "a", tmp_path / "b", ignore=shutil.ignore_patterns("checkpoints"))
    script = f"""
        import os
        from transformer.config import load_config
        from transformer.train import train
        out = {[str(tmp_path / "a"), str(tmp_path / "b")]!r}[int(os.environ["RANK"])]
        train(load_config("tiny", {tiny_overrides!r} + ["train.max_steps=4"]), out, resume=True, quiet=True)
    """
    proc, _ = torchrun_script(tmp_path, script)
    assert proc.returncode != 0
    assert "the ranks found different checkpoints in" in proc.stderr and "rank 1: none" in proc.stderr, proc.stderr
    assert [p.stem for p in list_checkpoints(tmp_path / "a")] == ["step_00000002"]
    # two runs' checkpoints of one name: "rank 0: step_00000002.json, rank 1: step_00000002.json" said no difference
    shutil.rmtree(tmp_path / "b")
    train(load_config("tiny", tiny_overrides + ["train.max_steps=2"]), tmp_path / "b", quiet=True)
    proc, _ = torchrun_script(tmp_path, script)
    runs = [json.loads(p.read_text())["run_id"] for p in (tmp_path / "a" / "checkpoints" / "step_00000002.json",
                                                          tmp_path / "b" / "checkpoints" / "step_00000002.json")]
    assert f"(rank 0: step_00000002.json of run {runs[0]}, rank 1: step_00000002.json of run {runs[1]})" in \
        proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("env, line", [
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 without RANK, MASTER_ADDR, MASTER_PORT: start the processes with torchrun"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0: the number of processes of the job, at least 1"),
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc': not a whole number"),
    ({"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
     r"RANK=5, LOCAL_RANK=0: a rank is in 0 .. 1 (WORLD_SIZE=2)"),
    ({"WORLD_SIZE": "1"}, "--nproc 2: this process is already one of a job (WORLD_SIZE=1 is set"),
])
def test_a_job_environment_set_wrong_is_one_line_before_anything_is_written(tmp_path, tiny_overrides, monkeypatch,
                                                                              capsys, env, line):
    """torchrun's variables set by hand or left set: an internal error (exit 70), two tracebacks, pages of C++
    frames, or (WORLD_SIZE=1 with --nproc 2) one process at half the batch asked for, without a word."""
    from transformer.cli import main

    for name in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    nproc = ["--nproc", "2"] if env == {"WORLD_SIZE": "1"} else []
    assert main(["train", "tiny", "--out", str(tmp_path / "run"), "--quiet", *nproc, *sets(tiny_overrides)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {line}") and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_cuda_graphs_with_several_ranks_are_refused_before_anything_is_written(tmp_path, tiny_overrides):
    """Under torchrun (started by the user: `transformer train --nproc` refuses it before launching, in
    test_cli.py) every rank stops with the one line, and the run folder is not made."""
    run = tmp_path / "run"
    proc, _ = torchrun_script(tmp_path, f"""
        from transformer.cli import main
        raise SystemExit(main(["train", "tiny", "--out", {str(run)!r}, "--quiet",
                               *[x for o in {tiny_overrides!r} + ["train.compile=true", "train.cuda_graphs=true",
                                                                  "train.shape_buckets=8"] for x in ("--set", o)]]))
    """)
    assert proc.returncode != 0
    assert proc.stderr.count("error: train.cuda_graphs is for one process") == 2, proc.stderr[-2000:]
    assert not run.exists()


def test_a_killed_rank_stops_the_job_and_the_run_resumes(tmp_path, tiny_overrides):
    run = tmp_path / "run"
    overrides = tiny_overrides + ["train.max_steps=8", "train.save_every=2", "train.threads=1",
                                  "train.dist_timeout_s=30"]
    proc, seconds = torchrun_script(tmp_path, rank_1_signalled(run, overrides, "SIGKILL", call=5))
    assert proc.returncode != 0
    assert seconds < 120  # no hang: torchrun stops the job when a rank dies
    done = list_checkpoints(run)
    assert done and load_checkpoint(done[-1]).meta["train_state"]["step"] == 4
    log = (run / "train.log").read_text()  # rank 0 says it lost rank 1, not that it met a bug
    assert "stopped: rank 0 lost the other processes of its job" in log and "internal error" not in log, log[-2000:]
    resumed = launch(["train", "tiny", "--out", str(run), "--nproc", "2", "--resume", "--quiet", *sets(overrides)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert load_checkpoint(list_checkpoints(run)[-1]).meta["train_state"]["step"] == 8


def test_a_signal_to_another_rank_stops_rank_zero_as_signalled(tmp_path, tiny_overrides):
    """SIGTERM to rank 1 alone stops every rank after the same step, but rank 0, which got none, wrote "done"
    to train.log and a summary.json as if the budget had been met."""
    run = tmp_path / "run"
    overrides = tiny_overrides + ["train.max_steps=8", "train.save_every=2", "train.threads=1"]
    proc, _ = torchrun_script(tmp_path, rank_1_signalled(run, overrides, "SIGTERM", call=3))
    assert proc.returncode != 0
    log = (run / "train.log").read_text()
    assert "SIGTERM (to another rank): stopped after step" in log and "done:" not in log, log[-2000:]
    assert not (run / "summary.json").exists()
    assert load_checkpoint(list_checkpoints(run)[-1]).meta["train_state"]["step"] < 8


def test_rank_zeros_slow_preparation_and_validation_do_not_time_out(tmp_path, tiny_overrides):
    """Rank 0 alone trains the vocabulary, encodes the corpus and validates; the other ranks wait for it
    outside the collectives' timeout (3 s here): made slower than that (5 s of preparation, 4 s for the
    validation), the job still finishes. A rank that dies is still caught (the test above)."""
    run = tmp_path / "run"
    overrides = tiny_overrides + ["train.max_steps=4", "train.eval_every=4", "train.log_every=2", "train.threads=1",
                                  "train.dist_timeout_s=3"]
    proc, _ = torchrun_script(tmp_path, f"""
        import os, time
        import transformer.train as T
        from transformer.config import load_config
        slow = os.environ["RANK"] == "0"
        prepare, evaluate = T.prepare_run, T.Trainer.evaluate
        def slow_prepare(*args, **kwargs):
            time.sleep(5 if slow else 0)
            return prepare(*args, **kwargs)
        def slow_evaluate(self):
            time.sleep(4)
            return evaluate(self)
        T.prepare_run, T.Trainer.evaluate = slow_prepare, slow_evaluate
        T.train(load_config("tiny", {overrides!r}), {str(run)!r}, quiet=True)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert load_checkpoint(list_checkpoints(run)[-1]).meta["train_state"]["step"] == 4
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    validated = [r["step"] for r in records if "valid_ppl" in r]
    assert validated == [4]  # the slow validation ran, once


def test_the_hosts_values_go_through_the_hosts_own_group(monkeypatch):
    """The token counts, stop flags and checksums are summed and gathered on ``Dist.control`` from host
    tensors, never the device's: through NCCL a GPU job's host would wait there for the step in flight.
    (A device no collective could take stands for the GPU.)"""
    seen = []

    def all_reduce(t, group=None):
        seen.append(("sum", t.device.type, group))
        t.mul_(2)

    def all_gather_object(out, value, group=None):
        seen.append(("gather", group))
        out[:] = [value, value]

    monkeypatch.setattr(distributed.torch_dist, "all_reduce", all_reduce)
    monkeypatch.setattr(distributed.torch_dist, "all_gather_object", all_gather_object)
    d = distributed.Dist(rank=0, world=2, device=torch.device("meta"), control="the host's group")
    assert distributed.all_sum(d, [1.0, 3.0]) == [2.0, 6.0]
    assert distributed.gather(d, "x") == ["x", "x"]
    assert seen == [("sum", "cpu", "the host's group"), ("gather", "the host's group")]


def test_a_data_error_on_rank_0_reaches_the_others_in_one_line_each_without_the_launchers_report(tmp_path,
                                                                                                  tiny_overrides):
    """`transformer train --nproc 2` on training files of unequal line counts: rank 0 says so, rank 1 (which
    waited for its vocabulary) stops with its message instead of failing in a collective, and torchrun's own
    report of a failed rank (a traceback, a table, its log lines) is not shown."""
    src = next(o for o in tiny_overrides if o.startswith("data.train_src=")).split("=", 1)[1].strip('"')
    short = tmp_path / "short.en"
    short.write_text("".join(open(src, encoding="utf-8").readlines()[:-1]), encoding="utf-8")
    proc = launch(["train", "tiny", "--out", str(tmp_path / "run"), "--nproc", "2", "--quiet",
                   *sets(tiny_overrides + [f'data.train_src="{short}"'])])
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()  # --quiet: not the "launching: torchrun ..." line either
    error = next(line for line in lines if line.startswith("error: "))
    assert "short.en" in error
    assert sorted(lines) == sorted([error, f"stopped: rank 1 of 2 waited for rank 0, which failed ({error})"])


def test_a_missing_data_file_is_refused_before_any_process_starts(tmp_path, tiny_overrides):
    proc = launch(["train", "tiny", "--out", str(tmp_path / "run"), "--nproc", "2",
                   *sets(tiny_overrides + [f'data.valid_tgt="{tmp_path / "missing.de"}"'])])
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: data.valid_tgt: data file not found: {tmp_path / 'missing.de'}"
    assert not (tmp_path / "run").exists()


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux's /proc)."""
    found = []
    for stat in os.scandir("/proc"):
        if stat.name.isdigit():
            try:
                fields = open(f"/proc/{stat.name}/stat").read().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if int(fields[1]) == pid:
                found.append(int(stat.name))
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds the ranks through Linux's /proc")
def test_a_rank_killed_under_the_launcher_is_named_in_one_line(tmp_path, tiny_overrides):
    """A rank killed by SIGKILL (as by the kernel when out of memory) cannot say so: the launcher names it and
    exits with 128 + 9; the other rank, whose collective lost it, says so in one line. No traceback."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "transformer", "train", "tiny", "--out", str(run), "--nproc", "2",
                             "--quiet", *sets(tiny_overrides + ["train.max_steps=100000", "train.log_every=1"])],
                            env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        rank1 = next(p for p in children(proc.pid) if b"RANK=1" in open(f"/proc/{p}/environ", "rb").read().split(b"\0"))
        os.kill(rank1, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGKILL, err[-3000:]
    assert f"stopped: rank 1 (pid {rank1}) was killed by SIGKILL (out of memory?)" in err.splitlines()
    assert "Traceback" not in err and "internal error" not in err
    assert all(line.startswith(("launching: ", "stopped: ")) for line in err.strip().splitlines()), err[-3000:]


def running(pid: int) -> bool:
    """Whether ``pid`` is a process still running (not gone, nor a zombie waiting to be reaped)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a process' state is found through /proc")
def test_a_stop_signal_while_torchrun_starts_the_ranks_leaves_none_running(tmp_path, tiny_overrides):
    """SIGTERM or Ctrl-C reaching the launcher as torchrun starts the ranks (its handler installed, the ranks it
    started not yet recorded) made it exit 143 without stopping those already running: orphans, which held its
    stderr open and went on (waiting for a rank that never came, or training). Simulated here: the signal taken
    as rank 0 has started. The ranks end with their launcher."""
    script = tmp_path / "launcher.py"
    script.write_text(textwrap.dedent("""
        import signal, sys
        from torch.distributed.elastic.multiprocessing import api
        from transformer import distributed
        start = api.get_subprocess_handler
        def start_then_signalled(**kwargs):
            handler = start(**kwargs)
            print(handler.proc.pid, flush=True)
            raise api.SignalException("SIGTERM after the first rank started", sigval=signal.SIGTERM)
        api.get_subprocess_handler = start_then_signalled
        sys.exit(distributed.launch_local(2, sys.argv[1:]))
    """))
    out = tmp_path / "pids"
    with out.open("w") as pids:  # a file, not a pipe: an orphan would hold a pipe open
        code = subprocess.run([sys.executable, str(script), "train", "tiny", "--out", str(tmp_path / "run"),
                               "--quiet", *sets(tiny_overrides + ["train.max_steps=100000"])],
                              env=ENV, stdout=pids, stderr=subprocess.DEVNULL, timeout=120).returncode
    rank = int(out.read_text().split()[0])
    try:
        assert code == 128 + signal.SIGTERM
        deadline = time.monotonic() + 60
        while running(rank) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not running(rank), "rank 0 outlived its launcher"
    finally:
        with contextlib.suppress(OSError):
            os.kill(rank, signal.SIGKILL)


def test_a_rank_stops_once_when_its_launcher_is_gone(monkeypatch):
    """A rank of ``launch_local`` looks for its launcher and sends itself one SIGTERM when it is gone, at once if
    it was gone already. Linux's parent-death signal, which it asked for before, came once for each of torch's
    threads: a second SIGTERM, "stop at once", and the steps since the last checkpoint were lost. The
    launcher's pid is taken out of the environment: a rank's own children are none."""
    sent, parent = [], [4321]
    joined = threading.Event()
    joined.set()  # in its job: the signal is left to training (a rank still joining is the next test's)
    monkeypatch.setattr(distributed, "JOINED", joined)
    monkeypatch.setattr(distributed, "LAUNCHER_GONE", gone := threading.Event())  # training's stop line reads it
    monkeypatch.setattr(distributed.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setattr(distributed.os, "getppid", lambda: parent[0])
    monkeypatch.setattr(distributed, "LAUNCHER_POLL_S", 0.01)
    monkeypatch.setenv(distributed.LAUNCHER_PID, "4321")  # the launcher is the parent still
    distributed.die_with_launcher()
    assert distributed.LAUNCHER_PID not in os.environ
    time.sleep(0.2)
    assert not sent and not gone.is_set()
    parent[0] = 1  # the launcher died: this rank was reparented
    deadline = time.monotonic() + 10
    while not sent and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert sent == [(os.getpid(), signal.SIGTERM)] and gone.is_set()  # once, and said whose it is
    monkeypatch.setenv(distributed.LAUNCHER_PID, "1234")  # gone before the rank looked
    distributed.die_with_launcher()
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent == [(os.getpid(), signal.SIGTERM)] * 2
    distributed.die_with_launcher()  # not a rank of launch_local: nothing watched
    time.sleep(0.2)
    assert len(sent) == 2


def test_a_rank_stuck_joining_its_job_exits_once_its_launcher_is_gone(tmp_path):
    """Joining the job, a rank connects to the launcher's rendezvous store: with the launcher killed there, torch
    retried in C++ for ten minutes, where Python never took the SIGTERM, an orphan writing stack traces. Here the
    signal is ignored to stand for that: the rank exits on its own, 143, once the grace has passed."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import signal, time\n"
        "from transformer import distributed\n"
        "distributed.LAUNCHER_POLL_S, distributed.JOIN_GRACE_S = 0.05, 1.0\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a signal Python never takes, as in torch's C++ retries\n"
        "distributed.die_with_launcher()\n"
        "time.sleep(60)\n")
    # the rank's launcher is its parent: a shell that starts it and is killed
    shell = subprocess.Popen(["bash", "-c", f"{distributed.LAUNCHER_PID}=$$ {sys.executable} {script} & echo $!; wait"],
                             stdout=subprocess.PIPE, text=True)
    rank = int(shell.stdout.readline())
    shell.kill()
    shell.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(rank):
        time.sleep(0.1)
    assert not _alive(rank), "the rank outlived its launcher"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped by init) is gone
        return f.read().split(")")[-1].split()[0] != "Z"


def test_ctrl_c_to_a_data_parallel_job_says_it_stopped_once(tmp_path, tiny_overrides):
    """Ctrl-C reaches the launcher and both ranks (the terminal's process group): the job stops after one step
    with its checkpoint, exit 130, and says so in one line, rank 0's."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "transformer", "train", "tiny", "--out", str(run), "--nproc", "2",
                             "--quiet", *sets(tiny_overrides + ["train.max_steps=100000", "train.log_every=1"])],
                            env=ENV, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stopped: SIGINT: training stopped after step"), err[-3000:]
    assert list_checkpoints(run)


def test_a_job_whose_launcher_is_killed_stops_with_its_checkpoint(tmp_path, tiny_overrides):
    """The launcher killed (SIGKILL: out of memory, say): its ranks stop after their step and write a
    checkpoint, as on SIGTERM. They took a SIGTERM for each of their threads (Linux's parent-death signal),
    the second "stop at once", and lost every step since the last checkpoint; and each rank sees its launcher gone
    at its own moment: one stopped by the other's signal took its own while writing the checkpoint, and lost it."""
    run = tmp_path / "run"
    threads = {k: v for k, v in ENV.items() if k != "OMP_NUM_THREADS"}  # as a user runs it: thread pools of its own
    proc = subprocess.Popen([sys.executable, "-m", "transformer", "train", "tiny", "--out", str(run), "--nproc", "2",
                             "--quiet", *sets(tiny_overrides + ["train.max_steps=100000", "train.log_every=1"])],
                            env=threads, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        proc.kill()  # the launcher alone
        proc.wait()
        while not list_checkpoints(run) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the ranks too, whatever became of them
    assert list_checkpoints(run), (run / "train.log").read_text()[-2000:]
    assert "again" not in (run / "train.log").read_text()


@pytest.mark.parametrize("broadcast_error, raised", [
    (RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:23747"), KeyboardInterrupt),
    (RuntimeError("a bug in the broadcast"), RuntimeError)])
def test_ctrl_c_in_rank_0s_block_is_not_told_as_a_lost_rank(monkeypatch, broadcast_error, raised):
    """Ctrl-C while rank 0 trained the vocabulary reached every rank: the others stopped at once, so rank 0's
    broadcast of its outcome failed, and it said "lost the other processes of its job" (a traceback in a log)
    instead of "interrupted". A broadcast that fails otherwise is still the failure."""
    monkeypatch.setenv("WORLD_SIZE", "2")

    def outcome(d, failure):
        raise broadcast_error

    monkeypatch.setattr(distributed, "_rank0_outcome", outcome)
    with pytest.raises(raised):
        with distributed.rank0_alone(distributed.Dist(rank=0, world=2, waits="waits")):
            raise KeyboardInterrupt


def test_rank_0s_failure_in_work_the_others_wait_for_stops_them_with_its_message(monkeypatch):
    """Rank 0 sends how its block went; the others, which ran nothing in it, stop with its one line."""
    sent, incoming = [], []

    def outcome(d, failure):
        if not d.main:  # another rank receives what rank 0 sent
            return incoming.pop()
        sent.append(failure)
        return failure

    monkeypatch.setattr(distributed, "_rank0_outcome", outcome)
    rank0 = distributed.Dist(rank=0, world=2, waits="waits")
    with pytest.raises(TrainError):
        with distributed.rank0_alone(rank0):
            raise TrainError("cannot write the checkpoint of step 4")
    incoming.append(sent[-1])
    with pytest.raises(distributed.PeerStopped) as stopped:
        with distributed.rank0_alone(distributed.Dist(rank=1, world=2, waits="waits")):
            pass
    assert str(stopped.value) == ("rank 1 of 2 waited for rank 0, which failed (error: cannot write the checkpoint "
                                  "of step 4)")
    sent.clear()
    with distributed.rank0_alone(rank0):
        pass
    incoming.append(sent[-1])
    with distributed.rank0_alone(distributed.Dist(rank=1, world=2, waits="waits")):
        pass
    with distributed.rank0_alone(rank0, wait=False):
        pass
    assert sent == [None] and not incoming
    with pytest.raises(ZeroDivisionError):  # a bug on rank 0 is sent as one
        with distributed.rank0_alone(rank0):
            1 / 0
    assert sent[-1] == "internal error: ZeroDivisionError: division by zero"


@pytest.mark.parametrize("exits, status, line", [
    ({0: (1, 0), 1: (-signal.SIGTERM, 0)}, 1, None),  # rank 0 said why; the launcher then stopped rank 1
    ({0: (1, 0), 1: (-signal.SIGKILL, 0)}, 137, "stopped: rank 1 (pid 101) was killed by SIGKILL (out of memory?)"),
    ({0: (-signal.SIGTERM, 0), 1: (-signal.SIGSEGV, 0)}, 139, "stopped: rank 1 (pid 101) was killed by SIGSEGV"),
    ({1: (-signal.SIGTERM, 0)}, 143, "stopped: rank 1 (pid 101) was killed by SIGTERM"),
    # rank 1 said why; rank 0, stuck in a collective, outlived the launcher's SIGTERM and was killed 30 s later
    ({0: (-signal.SIGKILL, 30), 1: (1, 0)}, 1, None),
])
def test_the_launcher_names_a_rank_killed_by_a_signal_and_leaves_the_rest_to_the_ranks(exits, status, line,
                                                                                      monkeypatch, capsys):
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    def failing(argv):
        assert argv[:4] == ["--standalone", "--nproc-per-node=2", "-m", "transformer"] and argv[4:] == ["train", "x"]
        failures = {}
        for r, (code, seconds) in exits.items():
            failures[r] = ProcessFailure(r, 100 + r, code, "<N/A>")
            failures[r].timestamp = 1_800_000_000 + seconds  # when the launcher found it failed
        raise ChildFailedError("transformer", failures)

    monkeypatch.setattr(torchrun, "main", failing)
    assert distributed.launch_local(2, ["train", "x"]) == status
    assert capsys.readouterr().err.splitlines() == ([line] if line else [])


def test_the_launcher_gives_signalled_ranks_as_long_as_rank_0s_work_to_stop(monkeypatch):
    """On Ctrl-C or SIGTERM the launcher passes the signal to the ranks, which stop after their step, and kills
    those still running after its shutdown timeout: torchrun's 30 s killed ranks whose step ended in a dev BLEU
    of over 30 s, so no checkpoint was written and rank 1 said it had lost rank 0 (the timeout is read from the
    environment by torchrun's launch config)."""
    from torch.distributed import run as torchrun

    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "")
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")  # unset, and set back as it was after the test
    given = []
    monkeypatch.setattr(torchrun, "main", lambda argv: given.append(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")))
    assert distributed.launch_local(2, ["train", "x"]) == 0
    assert given and given[0] is not None and int(given[0]) >= distributed.RANK0_WAIT.total_seconds()


def test_a_collective_that_lost_its_peer_is_told_apart_from_a_bug(monkeypatch, tmp_path, capsys):
    from transformer.cli import INTERNAL_ERROR, internal_error

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    gone = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:31944: "
                        "Connection reset by peer")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not distributed.lost_contact(gone)  # one process: no peer to lose
    assert internal_error(gone, ["train"]) == INTERNAL_ERROR
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert distributed.lost_contact(gone) and not distributed.lost_contact(RuntimeError("shape mismatch"))
    assert internal_error(gone, ["train"]) == 1
    assert internal_error(ValueError("a bug"), ["train"]) == INTERNAL_ERROR
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("internal error: RuntimeError: [../third_party/gloo")
    assert err[1].startswith("stopped: rank 0 lost the other processes of its job (one of them stopped or was "
                             "killed first, and says why): [../third_party/gloo") and "traceback in" in err[1]
    assert err[2].startswith("internal error: ValueError: a bug — please report it with the traceback in")


def test_a_checkpoint_rank_0_cannot_write_stops_the_others_with_its_message(tmp_path, tiny_overrides):
    """The disk fills while rank 0 writes step 2's checkpoint: it says so, and rank 1, waiting for it, stops
    with its message rather than fail in the next step's collective."""
    run = tmp_path / "run"
    proc, _ = torchrun_script(tmp_path, f"""
        import errno, os
        import transformer.train as T
        from transformer.cli import main
        if os.environ["RANK"] == "0":
            def full(*args, **kwargs):
                raise OSError(errno.ENOSPC, "No space left on device")
            T.save_checkpoint = full
        raise SystemExit(main(["train", "tiny", "--out", {str(run)!r}, "--quiet",
                               *[x for o in {tiny_overrides!r} + ["train.max_steps=4", "train.save_every=2"]
                                 for x in ("--set", o)]]))
    """)
    assert proc.returncode != 0
    error = (f"error: cannot write the checkpoint of step 2 in {run / 'checkpoints'}: No space left on device; "
             "there is no earlier checkpoint: make room and --resume")
    lines = proc.stderr.splitlines()
    assert error in lines and f"stopped: rank 1 of 2 waited for rank 0, which failed ({error})" in lines, \
        proc.stderr[-3000:]
    assert "internal error" not in proc.stderr and "lost the other processes" not in proc.stderr
