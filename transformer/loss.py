"""Label-smoothed cross-entropy (§5.4), as the authors' code computed it (IMPLEMENTATION-NOTES A3).

The smoothed target q puts 1 - ε_ls on the true class and ε_ls / (V - 1) on every other class, PAD
included. Padding positions carry no loss. The function returns a sum; the trainer divides by the
number of non-pad target tokens of the whole step (all accumulated batches and all ranks), so the
loss is a mean over tokens, never a mean of per-batch means.

The pre-softmax projection (§3.4) is part of the loss: the [N, V] logits are the largest tensor of a
training step, and computing them, their log-softmax and their gradient a block of rows at a time
keeps each block in the CPU's cache instead of writing and re-reading N × V floats four times
(benchmarks/speed.py measures what training gains overall).
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch
from torch import Tensor

# bytes of logits per block of rows: a few MiB stay in a CPU's cache; an accelerator takes all rows
# at once (its memory bandwidth is not the bound), but never more than a GiB of logits
_CPU_BLOCK_BYTES = 16 << 20
_ACCELERATOR_BLOCK_BYTES = 1 << 30


class _ProjectedLabelSmoothedLoss(torch.autograd.Function):
    """-Σ_tokens Σ_v q_v log p_v of logits = hidden Wᵀ, with the gradient (p - q) written out and
    taken through the projection block by block in the forward pass: d hidden = (p - q) W and
    d W = (p - q)ᵀ hidden. The backward only scales them by the incoming gradient."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, eps_ls: float, rows: int,
                want_grad: bool, fused: ModuleType | None) -> Tensor:
        eps_i = eps_ls / (weight.size(0) - 1)
        on_target = 1.0 - eps_ls - eps_i  # q_target - ε/(V-1): q = ε/(V-1) + on_target·onehot
        grad_hidden = torch.empty_like(hidden) if want_grad else None
        grad_weight = torch.zeros_like(weight) if want_grad else None
        acc = torch.promote_types(hidden.dtype, torch.float32)  # softmax in fp32 at least (bf16 inputs)
        device = hidden.device.type
        # the dtype the gradient's two products take: under autocast its dtype (each product would
        # cast the [rows, V] gradient again), else the weight's
        mm_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        # the weight cast once for every block's products: autocast's cache keeps casts of the weight
        # itself, not of the fresh view weight.T that each block's logits would read
        weight = weight.to(mm_dtype)
        total = torch.zeros((), dtype=acc, device=hidden.device)
        for start in range(0, hidden.size(0), rows):
            h, t = hidden[start: start + rows], target[start: start + rows, None]
            if fused is not None:  # one kernel: the loss of each row, and p - q written over the logits
                grad = h @ weight.T
                total += fused.smoothed_loss_and_grad_(grad, t[:, 0], eps_ls).sum()
            else:
                # bf16 logits read once into an fp32 log-softmax (no fp32 copy of them first, on a GPU)
                log_probs = torch.log_softmax(h @ weight.T, -1, dtype=acc)  # [rows, V]
                total -= on_target * log_probs.gather(-1, t).sum() + eps_i * log_probs.sum()
                if want_grad:
                    grad = log_probs.exp_().sub_(eps_i)  # p - ε/(V-1) everywhere
                    grad.scatter_add_(-1, t, torch.full(t.shape, -on_target, dtype=grad.dtype, device=grad.device))
            if want_grad:
                grad = grad.to(mm_dtype)  # cast once for both products (the fused kernel's: already in it)
                grad_hidden[start: start + rows] = grad @ weight
                grad_weight += grad.T @ h
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_out, grad_weight * grad_out, None, None, None, None, None


def label_smoothed_loss(hidden: Tensor, weight: Tensor, target: Tensor, eps_ls: float,
                        fused: bool | None = None) -> Tensor:
    """Σ over tokens of -Σ_v q_v log p_v, p = softmax(hidden Wᵀ): hidden [N, D] (no padding: select it
    out first), the pre-softmax projection's weight [V, D], target [N].

    Differs from KL(q || p) only by q's constant entropy. ε_ls = 0 gives the plain NLL.
    ``fused``: each block's loss and gradient by ``fused_loss``'s Triton kernel; by default on CUDA
    tensors when Triton is installed (True elsewhere needs Triton's interpreter: the tests).
    """
    block_bytes = _CPU_BLOCK_BYTES if hidden.device.type == "cpu" else _ACCELERATOR_BLOCK_BYTES
    rows = max(1, block_bytes // (4 * weight.size(0)))
    want_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    kernel = _fused_loss() if fused or (fused is None and hidden.device.type == "cuda") else None
    if fused and kernel is None:
        raise RuntimeError("label_smoothed_loss(fused=True): Triton is not installed")
    return _ProjectedLabelSmoothedLoss.apply(hidden, weight, target, eps_ls, rows, want_grad, kernel)


@functools.cache
def _fused_loss() -> ModuleType | None:
    """The ``fused_loss`` module, or None without Triton."""
    try:
        from . import fused_loss
    except ImportError:
        return None
    return fused_loss
