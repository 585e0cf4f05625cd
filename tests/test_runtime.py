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
