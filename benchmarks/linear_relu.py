"""A candidate for issue 47: the feed-forward network's first layer, max(0, x W1ᵀ + b1) (§3.3, eq. 2), with
the ReLU applied in the matrix product's epilogue instead of by a kernel of its own.

Why: in base's compiled bf16 step on the H200 (benchmarks/results/gpu_visit_2026-12-04/, its profile's
elementwise sources), the product x W1ᵀ + b1 is one cuBLASLt call (its bias added in the epilogue), and
Inductor then launches one more kernel per layer that reads the [tokens, d_ff] result back, applies the ReLU
and writes it again with a mask for the backward: work the product's epilogue can do as it stores
(cuBLASLt's ReLU-and-bias epilogue, which ``torch._addmm_activation`` asks for on a GPU). Inductor
keeps ``_addmm_activation`` as the call it is (a fallback, not decomposed), but the operator has no
derivative, so a training step needs the autograd Function below: forward through the fused product, backward
from the layer's own output (the ReLU's gradient passes where h > 0, as ``ReluBackward`` does).

Same numbers: max(0, round(v)) = round(max(0, v)), so applying the ReLU before or after the product's
rounding to bf16 gives the same output bits, given the same product. The backward reads the output (2 bytes
an element) where Inductor's graph read its mask (1 byte): the forward's kernel goes, the backward's moves a
little more (the gain predicted before measuring: docs/scaling.md).

    from linear_relu import linear_relu
    h = linear_relu(x, layer.weight, layer.bias)   # = F.relu(F.linear(x, weight, bias))

benchmarks/gpu.py's ``epilogue`` rows run the model's feed-forward layers through it on a GPU
(``ffn_through_epilogue``); the CPU keeps the package's path (its tests run this one on the CPU too).
"""

from __future__ import annotations

import torch
from torch import Tensor


class _LinearReLU(torch.autograd.Function):
    """max(0, x Wᵀ + b) for 2-D x, the ReLU in the product's epilogue; the backward from the output alone."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        h = torch._addmm_activation(bias, x, weight.t())
        ctx.save_for_backward(x, weight, h)
        return h

    @staticmethod
    def backward(ctx, dh: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight, h = ctx.saved_tensors
        d = torch.ops.aten.threshold_backward(dh, h, 0)  # the ReLU's gradient: dh where h > 0, else 0
        dx = d @ weight if ctx.needs_input_grad[0] else None
        dw = d.t() @ x if ctx.needs_input_grad[1] else None
        db = d.sum(0) if ctx.needs_input_grad[2] else None
        return dx, dw, db


def linear_relu(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``F.relu(F.linear(x, weight, bias))`` for x [..., in], through one product with the ReLU in its epilogue.
    Under autocast the three are cast to its dtype first, as autocast casts a linear layer's operands (the
    casts are autograd's: the fp32 weights get their gradients through them)."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        x, weight, bias = x.to(dtype), weight.to(dtype), bias.to(dtype)
    h = _LinearReLU.apply(x.reshape(-1, x.size(-1)), weight, bias)
    return h.view(*x.shape[:-1], weight.size(0))
