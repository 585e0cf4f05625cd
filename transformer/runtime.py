"""Process-wide settings that make CPU training and decoding faster, and what the processor computes
natively (not part of the paper).

PyTorch keeps no cache of freed memory on the CPU: every activation, gradient and logit block of a
training step, and every decoding step's tensors, is a fresh ``malloc``. glibc serves blocks above its
mmap threshold (128 KiB at first, raised only as far as the largest block freed so far) with new pages
from the kernel and unmaps them on ``free``; the kernel zeroes each page again on first touch, so
every step pays page faults and system time for memory it has just given back
(tests/test_runtime.py counts the faults; benchmarks/speed.py measures training and decoding).
"""

from __future__ import annotations

import ctypes
import os

import torch

# mallopt() parameters from glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def glibc() -> bool:
    """Whether this process runs on GNU libc (its malloc is the one ``keep_freed_memory`` tunes)."""
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, AttributeError):  # a name this platform lacks; no confstr at all
        return False


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse instead of giving it back to the kernel.

    Blocks up to 1 GiB come from the heap, and up to 2 GiB of free heap is kept: after the first
    step, tensors reuse pages that are already mapped. The price is a resident size that stays at
    its peak. Nothing happens off glibc,
    or when the user already tunes malloc (``MALLOC_*`` variables, ``LD_PRELOAD``: jemalloc,
    tcmalloc). Returns whether the settings were applied.
    """
    if not glibc() or any(name.startswith("MALLOC_") for name in os.environ) or os.environ.get("LD_PRELOAD"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 1 << 30)) and bool(mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1))


def emulated_on_cpu(precision: str) -> bool:
    """Whether this CPU lacks matrix units for ``precision`` (bf16 without AVX512-BF16 or AMX, fp16 without
    AMX-FP16): its products are emulated there, slower than fp32's."""
    probe = {"bf16": lambda: native_bf16(torch.device("cpu")),
             "fp16": getattr(torch.cpu, "_is_amx_fp16_supported", lambda: False)}.get(precision)
    return probe is not None and not probe()


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bf16 in hardware: training's "auto" precision takes bf16 there
    (benchmarks/speed.py measures it faster than fp32); a device that would emulate it (an older GPU, a CPU
    without AVX512-BF16 or AMX) computes bf16 slower than fp32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":  # torch.cpu's CPUID probes (private, hence looked up)
        return any(getattr(torch.cpu, probe, lambda: False)() for probe in ("_is_avx512_bf16_supported",
                                                                            "_is_amx_tile_supported"))
    return False
