"""Label-smoothed cross-entropy over a block of logits in one Triton kernel (§5.4; A3's smoothing),
for GPUs: issue 47's "copies" and "elementwise" kernel time.

``loss._ProjectedLabelSmoothedLoss`` computes the loss and its gradient (p - q) from each block of
[rows, V] logits. Written with PyTorch operators, that block is read and written about ten times:
an fp32 log-softmax of the bf16 logits, its sums, exp, the subtraction, the cast back to bf16. Here
one program per row reads its logits twice (an online max / sum of exponentials and the sum of the
logits, per lane of the program, then p - q) and writes p - q over them, in their own dtype: the loss
of the row is lse - ε/(V-1)·Σ_v x_v - (1 - ε - ε/(V-1))·x_target, with lse = log Σ_v exp x_v, the same
value as -Σ_v q_v log p_v because q sums to 1. Sums and exponentials are taken in fp32.

Triton compiles for CUDA GPUs; the CPU has no compiled backend, but Triton's interpreter
(TRITON_INTERPRET=1 set before this module is imported) runs the same kernel on CPU tensors, which
is how the tests hold it to the PyTorch path. ``loss.label_smoothed_loss`` imports it for CUDA
tensors when Triton is installed (CUDA builds of torch bring it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 4096  # logits per program and iteration: a row of V = 37,000 takes 10 of them per pass


@triton.jit
def _smoothed_rows(logits_ptr, stride_a, target_ptr, loss_ptr, V_a, eps_i, on_target, BLOCK: tl.constexpr,
                   ALIGN: tl.constexpr):
    # the row stride and V come divided by ALIGN, which divides both (``alignment``): multiplied back by a
    # constant, Triton knows each row's start and its end to be multiples of it and moves 16 bytes per access;
    # it learns so of an integer argument only when it is a multiple of 16, which V = 37,000 is not (a multiple
    # of 8): every logit would then be read and written in a 2-byte access of its own
    stride = stride_a * ALIGN
    V = V_a * ALIGN
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    cols = tl.arange(0, BLOCK)
    # per lane: the running maximum, Σ exp(x - m) and Σ x over the logits the lane has read; the lanes
    # are combined once, after the pass, so that its iterations only load and accumulate (a reduction
    # across the program's warps in every iteration would wait on the others' loads each time)
    none = float("-inf")
    m = tl.full([BLOCK], none, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    sx = tl.zeros([BLOCK], tl.float32)
    for start in tl.range(0, V, BLOCK):
        inside = start + cols < V
        x = tl.load(base + start + cols, mask=inside, other=none).to(tl.float32)
        new_m = tl.maximum(m, x)
        seen = new_m != none  # a lane past V's end has read nothing yet
        s = tl.where(seen, s * tl.exp(m - new_m) + tl.exp(x - new_m), 0.0)
        sx += tl.where(inside, x, 0.0)
        m = new_m
    row_m = tl.max(m, 0)
    lse = row_m + tl.log(tl.sum(tl.where(m != none, s * tl.exp(m - row_m), 0.0), 0))
    sx = tl.sum(sx, 0)
    t = tl.load(target_ptr + row)
    x_t = tl.load(base + t).to(tl.float32)  # read before the second pass overwrites it
    tl.store(loss_ptr + row, lse - eps_i * sx - on_target * x_t)
    for start in tl.range(0, V, BLOCK):
        inside = start + cols < V
        x = tl.load(base + start + cols, mask=inside, other=0.0).to(tl.float32)
        grad = tl.exp(x - lse) - eps_i - tl.where(start + cols == t, on_target, 0.0)  # p - q
        tl.store(base + start + cols, grad.to(logits_ptr.dtype.element_ty), mask=inside)


def smoothed_loss_and_grad_(logits: Tensor, target: Tensor, eps_ls: float, block: int = BLOCK) -> Tensor:
    """logits [N, V] (rows contiguous), target [N] -> each row's -Σ_v q_v log p_v [N] in fp32, with
    the logits overwritten by p - q, the gradient of the summed loss with respect to them."""
    n, v = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("smoothed_loss_and_grad_: the logits' rows must be contiguous")
    eps_i = eps_ls / (v - 1)
    loss = logits.new_empty(n, dtype=torch.float32)
    block = min(block, triton.next_power_of_2(v))
    align = alignment(logits.stride(0), v)
    _smoothed_rows[(n,)](logits, logits.stride(0) // align, target, loss, v // align, eps_i, 1.0 - eps_ls - eps_i,
                         BLOCK=block, ALIGN=align, num_warps=8 if block >= 2048 else 4)
    return loss


def alignment(stride: int, v: int) -> int:
    """The largest of 16, 8, 4, 2 and 1 that divides both the logits' row stride and V (the kernel's ALIGN)."""
    return next(a for a in (16, 8, 4, 2, 1) if stride % a == 0 and v % a == 0)
