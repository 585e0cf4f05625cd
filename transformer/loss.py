"""Label-smoothed cross-entropy (§5.4), as the authors' code computed it (IMPLEMENTATION-NOTES A3).

The smoothed target puts 1 - ε_ls on the true class and ε_ls / (V - 1) on every other class, PAD
included. Padding positions carry no loss. The function returns a sum; the trainer divides by the
number of non-pad target tokens of the whole step (all accumulated batches and all ranks), so the
loss is a mean over tokens, never a mean of per-batch means.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def label_smoothed_loss(logits: Tensor, target: Tensor, eps_ls: float) -> Tensor:
    """Σ over tokens of -Σ_v q_v log p_v, q the smoothed target; logits [N, V], target [N], no padding.

    PyTorch's ``label_smoothing=s`` gives (1 - s + s/V) to the true class and s/V to the others;
    s = ε·V/(V-1) turns that into exactly 1 - ε and ε/(V-1), in one fused kernel. The result
    differs from KL(q || p) only by q's constant entropy. ε = 0 gives the plain NLL.
    """
    v = logits.size(-1)
    return F.cross_entropy(logits.float(), target, reduction="sum", label_smoothing=eps_ls * v / (v - 1))
