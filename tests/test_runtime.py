"""runtime.keep_freed_memory: freed tensors' pages are reused instead of faulted in again."""

import os
import subprocess
import sys

import pytest

from transformer.runtime import glibc

STEPS = """
import resource, statistics, sys, torch
from transformer.config import ModelConfig
from transformer.loss import label_smoothed_loss
from transformer.model import Transformer
from transformer.runtime import keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
torch.set_num_threads(1)  # one thread's heap: another's arena, grown whenever the scheduler hands it work, is noise
torch.manual_seed(0)
model = Transformer(ModelConfig(n_enc_layers=2, n_dec_layers=2, d_model=64, d_ff=256, n_heads=4), 8000)
src, tgt = torch.randint(4, 8000, (128, 16)), torch.randint(4, 8000, (128, 17))
def step():  # forward and backward of a small training batch
    hidden = model(src, tgt[:, :-1], logits=False).flatten(0, 1)
    label_smoothed_loss(hidden, model.output_weight, tgt[:, 1:].flatten(), 0.1).backward()
def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
step()  # the first step maps everything once, in either mode
per_step = []
for _ in range(7):
    before = faults()
    step()
    per_step.append(faults() - before)
# the median: an odd step may still grow a thread's arena, the typical step is what the setting changes
print(int(statistics.median(per_step)))
"""


def _faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-c", STEPS, mode], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not glibc(), reason="glibc's malloc only")
def test_freed_memory_is_reused_without_page_faults():
    default, tuned = _faults("default"), _faults("tuned")
    assert default > 5000  # per step, glibc gives freed tensors back and faults them in again...
    assert tuned < default // 10  # ...unless told to keep them


def test_user_settings_of_malloc_are_left_alone():
    code = "from transformer.runtime import keep_freed_memory; print(keep_freed_memory())"
    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_preloaded_allocator_is_left_alone(monkeypatch):
    """With LD_PRELOAD (jemalloc, tcmalloc) malloc is not glibc's to tune: keep_freed_memory does nothing and says
    so, without calling mallopt, which would tune a malloc the process does not use."""
    from transformer import runtime

    for name in [n for n in os.environ if n.startswith("MALLOC_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LD_PRELOAD", "libjemalloc.so.2")
    monkeypatch.setattr(runtime.ctypes, "CDLL", lambda *a: pytest.fail("mallopt was called"))
    assert runtime.keep_freed_memory() is False


HEAP = """
import ctypes, sys
from transformer.runtime import keep_freed_memory
assert keep_freed_memory()
libc = ctypes.CDLL(None)
FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in FIELDS.split()]
libc.mallinfo2.restype, libc.malloc.restype = Info, ctypes.c_void_p
before = libc.mallinfo2().hblks  # what the imports mapped before the settings
block = libc.malloc(512 << 20)
print(libc.mallinfo2().hblks - before)
"""


@pytest.mark.skipif(not glibc(), reason="glibc's malloc only")
def test_blocks_up_to_a_gib_come_from_the_heap():
    """keep_freed_memory raises glibc's mmap threshold to 1 GiB: a 512 MiB block (a large batch's logits) comes from
    the heap, whose freed memory is kept, not from an mmap of its own that free() unmaps and the next step faults
    in again. (glibc's own threshold, 128 KiB until a larger block is freed, would map it.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-c", HEAP], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"  # no new block of its own mapped
