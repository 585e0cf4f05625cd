"""Data parallelism through PyTorch's own stack (§5.2: "one machine with 8 NVIDIA P100 GPUs").

``torchrun`` starts one process per device and sets RANK / WORLD_SIZE / LOCAL_RANK; each process
trains a replica on its own batches and DistributedDataParallel averages the gradients. NCCL on
GPUs, gloo on CPUs. Every collective has a timeout (``train.dist_timeout_s``): a rank that dies or
hangs makes the others fail with an error instead of waiting for ever, and torchrun then stops the
whole job. Work that rank 0 does alone (the vocabulary, encoding the corpus, validation, writing a
checkpoint) is waited for apart from that timeout (``rank0_alone``): it may take longer, and when it
fails the others stop with its message.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as torch_dist

from .config import ConfigError
from .errors import UserError, first_line, job_world, summary


class PeerStopped(UserError):
    """Rank 0 failed in work the other ranks waited for (preparing the run, validation, a checkpoint):
    they stop with its message rather than wait for ever or fail in their next collective."""

    label = "stopped"


@dataclass
class Dist:
    """This process's place in the job; the defaults are a single process."""

    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    waits: object = None  # the CPU process group of ``rank0_alone``
    # the process group of the host's own values (``all_sum``, ``gather``): a CPU group of its own beside
    # NCCL; None on CPUs, whose default group is gloo's already
    control: object = None
    timeout_s: float = 300.0  # train.dist_timeout_s: how long a collective waits for the others

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        """Rank 0 alone writes the run folder: config, logs, metrics, checkpoints."""
        return self.rank == 0


def job_environment() -> tuple[int, int, int]:
    """(world size, rank, local rank) as torchrun sets them, checked: a user's own (a WORLD_SIZE left set, a rank
    past the world, a word) is a one-line error, where init_process_group's was an internal error or pages of C++
    frames. Unset: one process."""
    def number(name: str, default: int) -> int:
        text = os.environ.get(name)
        if text is None:
            return default
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{name}={text!r}: not a whole number (torchrun sets it; unset it to train in one "
                              "process)") from None

    world, rank, local_rank = number("WORLD_SIZE", 1), number("RANK", 0), number("LOCAL_RANK", 0)
    if world < 1:
        raise ConfigError(f"WORLD_SIZE={world}: the number of processes of the job, at least 1 (unset it to train "
                          "in one process)")
    if world > 1 and (missing := [n for n in ("RANK", "MASTER_ADDR", "MASTER_PORT") if n not in os.environ]):
        raise ConfigError(f"WORLD_SIZE={world} without {', '.join(missing)}: start the processes with torchrun (on "
                          "one machine: `transformer train --nproc N`), which sets them all; unset WORLD_SIZE to "
                          "train in one process")
    if not 0 <= rank < world or local_rank < 0:
        raise ConfigError(f"RANK={rank}, LOCAL_RANK={local_rank}: a rank is in 0 .. {world - 1} (WORLD_SIZE={world}), "
                          "a local rank at least 0")
    return world, rank, local_rank


def setup(timeout_s: float) -> Dist:
    """Join the job torchrun started (or run alone); pick this rank's device."""
    world, _, local_rank = job_environment()
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"local rank {local_rank} has no GPU: this machine shows {torch.cuda.device_count()} "
                               "(start at most that many processes per node, or hide the GPUs with "
                               "CUDA_VISIBLE_DEVICES= to train on CPUs with gloo)")
        torch.cuda.set_device(device)
    if world == 1:
        return Dist(device=device)
    if not torch_dist.is_initialized():
        try:
            torch_dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                          timeout=datetime.timedelta(seconds=timeout_s))
        except (ValueError, torch_dist.DistNetworkError) as e:  # the rendezvous torchrun's variables name: the user's
            raise ConfigError(f"could not join the job at MASTER_ADDR={os.environ['MASTER_ADDR']} MASTER_PORT="
                              f"{os.environ['MASTER_PORT']}: {first_line(e)}") from None
    waits = torch_dist.new_group(backend="gloo", timeout=RANK0_WAIT)
    control = None if device.type == "cpu" else torch_dist.new_group(
        backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    JOINED.set()
    return Dist(torch_dist.get_rank(), world, device, waits, control, timeout_s)


# How long the other ranks wait for rank 0's own work (vocabulary, encoding, validation, checkpoints):
# outside the collectives' timeout, which catches a dead rank in a step; a rank that dies while the others
# wait here is caught by torchrun, which stops the whole job.
RANK0_WAIT = datetime.timedelta(hours=24)


@contextlib.contextmanager
def rank0_alone(d: Dist, wait: bool = True) -> Iterator[None]:
    """Every rank enters this block around work that rank 0 does while the others wait for it, on a CPU
    group of its own whose timeout is ``RANK0_WAIT`` (rank 0's preparation or validation may take longer
    than a collective may wait). Rank 0 then tells the others how it went: when the block raised there,
    its one-line error reaches them and they stop with it (``PeerStopped``). ``wait=False``: no waiting."""
    if not (d.enabled and wait):
        yield
        return
    try:
        yield
    except BaseException as e:
        if d.main:
            # a second Ctrl-C or SIGTERM stops rank 0 at once (KeyboardInterrupt, Terminated): not a bug of its work
            told = summary(e) if isinstance(e, Exception) else "stopped at once by a second stop signal"
            try:
                _rank0_outcome(d, told)
            except Exception as told:  # the others gone already (Ctrl-C reaches every rank of the job): the block's
                if not lost_contact(told):  # own error says why, not the collective that could not tell them
                    raise
        raise
    if (failure := _rank0_outcome(d, None)) is not None:
        raise PeerStopped(f"rank {d.rank} of {d.world} waited for rank 0, which failed ({failure})")


def _rank0_outcome(d: Dist, failure: str | None) -> str | None:
    """Rank 0's ``failure`` (None: none), sent to every rank. Rank 0 waits for the others to take it no longer than
    a collective may (``train.dist_timeout_s``): a rank that hangs held it there for ``RANK0_WAIT``, 24 hours, as
    gloo's sender waits for every receiver; the others wait for rank 0 as long as its work may take."""
    text = None if failure is None else failure.encode("utf-8")
    size = torch.tensor([-1 if text is None else len(text)], dtype=torch.int64)
    if d.main:
        sent = [torch_dist.broadcast(size, src=0, group=d.waits, async_op=True)]
        if text:
            data = torch.tensor(list(text), dtype=torch.uint8)
            sent.append(torch_dist.broadcast(data, src=0, group=d.waits, async_op=True))
        for work in sent:
            work.wait(timeout=datetime.timedelta(seconds=d.timeout_s))
        return failure
    torch_dist.broadcast(size, src=0, group=d.waits)
    if size.item() < 0:
        return None
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    if data.numel():
        torch_dist.broadcast(data, src=0, group=d.waits)
    return bytes(data.tolist()).decode("utf-8")


def lost_contact(error: BaseException) -> bool:
    """Whether ``error``, raised in a rank of a torchrun job, is a collective that failed because another
    rank is gone (it stopped on its own error, or was killed) or hangs: gloo's closed connections and
    timeouts, NCCL's errors. That rank's own output says why; here the error is the job's, not a bug."""
    if job_world() <= 1:
        return False
    text = str(error)
    return isinstance(error, torch_dist.DistError) or isinstance(error, RuntimeError) and any(
        mark in text for mark in ("gloo", "NCCL", "Connection closed by peer", "Connection reset by peer",
                                  "Operation timed out"))  # the last: Work.wait(timeout), _rank0_outcome's


def lost_contact_line(error: BaseException) -> str | None:
    """The line a rank says when ``lost_contact(error)`` (None otherwise): the job's ending, not a bug."""
    if not lost_contact(error):
        return None
    return (f"stopped: rank {os.environ.get('RANK', '?')} lost the other processes of its job (one of them stopped "
            f"or was killed first, and says why): {first_line(error)}")


def launch_local(nproc: int, argv: list[str]) -> int:
    """``python -m transformer ARGV`` in ``nproc`` processes on this machine under PyTorch's elastic launcher
    (``torchrun --standalone``), called in this process: its exit status. Every rank prints its own one-line
    error; the launcher's logs and its report of a failed rank (a traceback and a table) are left out, and
    a rank killed by a signal, which cannot say so itself, is named in one line."""
    import logging

    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default for several processes, said quietly
    os.environ[LAUNCHER_PID] = str(os.getpid())  # the ranks end with this process (die_with_launcher)
    # on SIGINT / SIGTERM the launcher passes the signal on and kills the ranks still running after this many
    # seconds (torchrun's default: 30); a rank stops only after its step, which may end in validation, dev BLEU
    # or a checkpoint that rank 0 takes minutes over, so the ranks are given as long as they wait for rank 0
    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(int(RANK0_WAIT.total_seconds())))
    logging.disable(logging.CRITICAL)  # this process only launches: every log line of it is the launcher's
    try:
        torchrun.main(["--standalone", f"--nproc-per-node={nproc}", "-m", "transformer", *argv])
    except ChildFailedError as e:
        rank, failure = min(e.failures.items(),
                            key=lambda item: (item[1].timestamp, _blame(item[1].exitcode), item[0]))
        if failure.exitcode > 0:  # the rank said why itself
            return failure.exitcode
        try:
            name = signal.Signals(-failure.exitcode).name
        except ValueError:
            name = f"signal {-failure.exitcode}"
        print(f"stopped: rank {rank} (pid {failure.pid}) was killed by {name}"
              + (" (out of memory?)" if name == "SIGKILL" else ""), file=sys.stderr)
        return 128 - failure.exitcode
    except SignalException as e:  # the launcher passed it to the ranks, which stopped with a checkpoint
        return 128 + e.sigval
    finally:
        logging.disable(logging.NOTSET)
        os.environ.pop(LAUNCHER_PID, None)
    return 0


# Set by ``launch_local`` for the ranks it starts: the launcher's pid (``die_with_launcher``).
LAUNCHER_PID = "TRANSFORMER_LAUNCHER_PID"
LAUNCHER_POLL_S = 1.0  # how often a rank looks for its launcher (``die_with_launcher``)
JOINED = threading.Event()  # set once this process has joined its job (``setup``)
LAUNCHER_GONE = threading.Event()  # set before ``die_with_launcher``'s SIGTERM: who sent it, for the stop's line
JOIN_GRACE_S = 10.0  # how long a rank not yet joined may take to stop once its launcher is gone


def die_with_launcher() -> None:
    """In a rank started by ``launch_local``: SIGTERM to this rank, once, when the launcher is gone, taken as any
    SIGTERM (a step's end and its checkpoint in training; at once before). The launcher otherwise waits for its
    ranks, but a stop signal that reaches it while torchrun starts them (between installing its handlers and
    recording the ranks it started) makes it exit 143 without stopping those already running: they outlived it,
    orphans that held its stderr open. So did any rank of a launcher killed itself (SIGKILL, out of memory).

    A thread of the rank looks for its parent every ``LAUNCHER_POLL_S``. Linux's parent-death signal
    (prctl PR_SET_PDEATHSIG), asked for before, is kept by every thread started after it (torch's) and sent once
    for each: a rank took the second SIGTERM as "stop at once" and lost the steps since its last checkpoint.
    The variable is taken out of the environment: what the rank starts is not a rank.

    A rank still joining its job when the launcher goes is connecting to the launcher's rendezvous store, which
    is gone with it: torch retries in C++ for minutes, where Python never takes the signal, and the rank lived
    on as an orphan writing C++ stack traces to the dead launcher's stderr for ten minutes. One that has not
    joined within ``JOIN_GRACE_S`` of the signal exits at once (143, as on SIGTERM): it has written nothing."""
    launcher = os.environ.pop(LAUNCHER_PID, None)
    if launcher is None or os.name != "posix":
        return
    LAUNCHER_GONE.clear()  # this launcher's: not an earlier one's in the same process

    def watch() -> None:
        while os.getppid() == int(launcher):
            time.sleep(LAUNCHER_POLL_S)
        LAUNCHER_GONE.set()
        os.kill(os.getpid(), signal.SIGTERM)
        if not JOINED.wait(JOIN_GRACE_S):  # still alive, and not in the job: stuck joining it
            with contextlib.suppress(OSError, ValueError):  # its stderr may be the dead launcher's pipe
                print("terminated: the launcher is gone and this rank had not joined its job", file=sys.stderr,
                      flush=True)
            os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def _blame(exitcode: int) -> int:
    """Which of the ranks that failed in the same second (the launcher's failure times are whole seconds) it
    answers for first: one killed by a signal, which cannot say so itself (the others then lose it); then
    one that exited with a status, having said why; SIGTERM last, which the launcher itself sends to the
    ranks left when one fails (and SIGKILL 30 s later to those still running: a later second)."""
    return 0 if exitcode < 0 and exitcode != -signal.SIGTERM else 1 if exitcode > 0 else 2


def teardown(d: Dist) -> None:
    if d.enabled and torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def all_sum(d: Dist, values: list[float]) -> list[float]:
    """Element-wise sum over ranks of a few of the host's scalars, in one all-reduce (float64: token counts
    stay exact). On the host's own group (``Dist.control``): through NCCL the sum would queue behind the
    step on the GPU and reading it would wait for that step, so a trainer that queues the next step
    before it reads the last (a token count, the stop flags) could not run ahead."""
    if not d.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    torch_dist.all_reduce(t, group=d.control)
    return t.tolist()


def gather(d: Dist, value):
    """Every rank's ``value`` (any picklable object made by this program), in rank order."""
    if not d.enabled:
        return [value]
    values = [None] * d.world
    torch_dist.all_gather_object(values, value, group=d.control)  # pickled on the host, not through a GPU
    return values


def parameter_checksum(model: torch.nn.Module) -> float:
    """Sum of all parameters in float64: replicas kept in sync by DDP agree on it exactly."""
    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in model.parameters()))
