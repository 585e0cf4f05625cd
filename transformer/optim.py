"""Adam with the warmup / inverse-square-root learning rate of §5.3, eq. (3)."""

from __future__ import annotations

import torch
from torch import nn

from .config import TrainConfig


def learning_rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """eq. (3): lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5), steps counted from 1.

    ``scale`` multiplies the formula; 1.0 is the paper and the authors' first code (A1).
    """
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def cooldown(progress: float, fraction: float) -> float:
    """Multiplier on eq. (3) that falls linearly to 0 over the last ``fraction`` of the budget.

    DEVIATION(§5.3): not in the paper (fraction 0, the default, leaves eq. (3) as it is). A run with
    a fixed budget far shorter than eq. (3)'s horizon ends at a high learning rate; annealing it to 0
    lets the last steps settle, as checkpoint averaging (§6.1) does in another way. ``progress`` is
    the share of the budget used, in [0, 1].
    """
    if fraction <= 0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - progress) / fraction))


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Adam:
    """§5.3: Adam(β1 = 0.9, β2 = 0.98, ε = 1e-9); the learning rate is set before every step.

    PyTorch adds ε after bias correction and TensorFlow before (A2); with ε = 1e-9 the difference
    is negligible, so it is left as it is.
    """
    params = list(model.parameters())
    # one pass over each parameter's memory for the whole update (CPU since torch 2.4, and CUDA),
    # where the foreach implementation makes one pass per arithmetic operation
    fused = all(p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.Adam(params, lr=0.0, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                            weight_decay=cfg.weight_decay, foreach=not fused, fused=fused)
