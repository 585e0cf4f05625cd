"""Label-smoothed cross-entropy (§5.4), as the authors' code computed it (IMPLEMENTATION-NOTES A3).

The smoothed target puts 1 - ε_ls on the true class and ε_ls / (V - 1) on every other class, PAD
included. Padding positions carry no loss. The functions return sums; the trainer divides by the
number of non-pad target tokens of the whole step (all accumulated batches and all ranks), so the
loss is a mean over tokens, never a mean of per-batch means.
"""

from __future__ import annotations

import torch
from torch import Tensor


def label_smoothed_nll(logits: Tensor, target: Tensor, eps_ls: float) -> tuple[Tensor, Tensor]:
    """logits [N, V], target [N] (no padding: the caller selects non-pad positions first).

    Returns (smoothed loss sum, nll sum). With q the smoothed target, the loss is
    -Σ_v q_v log p_v = (1 - ε - ε/(V-1))·nll + ε/(V-1)·(-Σ_v log p_v), which differs from
    KL(q || p) only by q's constant entropy.
    """
    lprobs = torch.log_softmax(logits.float(), dim=-1)
    nll = -lprobs.gather(-1, target[:, None]).squeeze(-1)
    if eps_ls == 0.0:
        total = nll.sum()
        return total, total
    eps_i = eps_ls / (logits.size(-1) - 1)
    smooth = -lprobs.sum(-1)
    loss = (1.0 - eps_ls - eps_i) * nll + eps_i * smooth
    return loss.sum(), nll.sum()
