"""Data parallelism through PyTorch's own stack (§5.2: "one machine with 8 NVIDIA P100 GPUs").

``torchrun`` starts one process per device and sets RANK / WORLD_SIZE / LOCAL_RANK; each process
trains a replica on its own batches and DistributedDataParallel averages the gradients. NCCL on
GPUs, gloo on CPUs. Every collective has a timeout (``train.dist_timeout_s``): a rank that dies or
hangs makes the others fail with an error instead of waiting for ever, and torchrun then stops the
whole job. Work that rank 0 does alone (the vocabulary, encoding the corpus, validation, writing a
checkpoint) is waited for apart from that timeout (``wait_for_rank0``): it may take longer.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as torch_dist

from .config import ConfigError


@dataclass
class Dist:
    """This process's place in the job; the defaults are a single process."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    waits: object = None  # the CPU process group of ``wait_for_rank0``
    # the process group of the host's own values (``all_sum``, ``gather``): a CPU group of its own beside
    # NCCL; None on CPUs, whose default group is gloo's already
    control: object = None

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        """Rank 0 alone writes the run folder: config, logs, metrics, checkpoints."""
        return self.rank == 0


def setup(timeout_s: float) -> Dist:
    """Join the job torchrun started (or run alone); pick this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
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
        torch_dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                      timeout=datetime.timedelta(seconds=timeout_s))
    waits = torch_dist.new_group(backend="gloo", timeout=RANK0_WAIT)
    control = None if device.type == "cpu" else torch_dist.new_group(
        backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return Dist(torch_dist.get_rank(), world, local_rank, device, waits, control)


# How long the other ranks wait for rank 0's own work (vocabulary, encoding, validation, checkpoints):
# outside the collectives' timeout, which catches a dead rank in a step; a rank that dies while the others
# wait here is caught by torchrun, which stops the whole job.
RANK0_WAIT = datetime.timedelta(hours=24)


def wait_for_rank0(d: Dist) -> None:
    """Every rank waits here until rank 0 arrives, on a CPU group of its own whose timeout is
    ``RANK0_WAIT``: rank 0's preparation or validation may take longer than a collective may wait."""
    if d.enabled:
        torch_dist.barrier(group=d.waits)


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
