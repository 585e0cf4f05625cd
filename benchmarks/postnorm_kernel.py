"""A candidate: the post-norm junction LayerNorm(x + Dropout(s)) (§3.1, §5.4) as two Triton kernels, one
forward and one backward, measured by benchmarks/gpu_layernorm.py against what torch.compile generates
(issue 47: a generated junction backward was the costliest single kernel of base's compiled step), and by
gpu.py's bf16+kernel and bf16+compile+kernel rows in whole training steps. It moves into the package only if
a GPU measures it faster; until then the trainer does not run it.

Forward: each program normalises blocks of rows: z = x + keep · s / (1 - p) in fp32, y = (z - mean) ·
rstd · w + b in x's dtype, with each row's mean and rstd kept (8 bytes a row). The dropout mask is not
stored: ``keep`` = a uniform draw ≥ p from Philox keyed by a seed and the element's index, drawn again by
the backward. The seed is a one-element device tensor drawn from torch's generator, so no host
synchronisation is needed and a checkpoint's random state replays the same masks. Backward: z
recomputed from x and s, dz = rstd · (w·dy - mean(w·dy) - x̂ · mean(x̂ · w·dy)) over each row, the residual's
gradient dz and the sub-layer's dz · keep / (1 - p), and each program's partial sums of dy · x̂ and dy
over its rows for the gain's and bias's gradients, summed by torch after. Bytes an element: x, s read and
y written forward; dy, x, s read and two gradients written backward (gpu_layernorm.py's 16 in bf16).
Both are torch Triton operators (torch.library.triton_op) with an autograd formula, so that torch.compile
keeps them in one graph and launches the kernels from its generated code, autotuning them itself.

Triton's interpreter (TRITON_INTERPRET=1 before import) runs the kernels on CPU tensors for the tests.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor


def _configs() -> list[triton.Config]:
    """Rows a program normalises at a time (the backward loops over blocks of them) and warps, tried on the
    card at the first call for each d_model (triton.autotune) so that the kernels meet Inductor's tuned ones
    on equal terms; the interpreter (the tests, on a CPU) runs one."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return [triton.Config({"ROWS": 8}, num_warps=4)]
    return [triton.Config({"ROWS": rows}, num_warps=warps) for rows in (1, 4, 8, 16) for warps in (4, 8)]


@triton.autotune(configs=_configs(), key=["D"])
@triton.jit
def _forward(x_ptr, s_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, seed_ptr, p, scale, M, D, eps,
             DROP: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    inside = (rows < M)[:, None] & (cols < D)[None, :]
    at = rows.to(tl.int64)[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + at, mask=inside, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + at, mask=inside, other=0.0).to(tl.float32)
    if DROP:
        keep = tl.rand(tl.load(seed_ptr), at.to(tl.int32)) >= p
        s = tl.where(keep, s * scale, 0.0)
    z = x + s
    mean = tl.sum(z, 1) / D
    zc = tl.where(inside, z - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(zc * zc, 1) / D + eps)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    y = zc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=inside)
    tl.store(mean_ptr + rows, mean, mask=rows < M)
    tl.store(rstd_ptr + rows, rstd, mask=rows < M)


@triton.autotune(configs=_configs(), key=["D"])
@triton.jit
def _backward(dy_ptr, x_ptr, s_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, ds_ptr, dw_ptr, db_ptr, seed_ptr, p, scale,
              M, D, DROP: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    program, programs = tl.program_id(0), tl.num_programs(0)
    cols = tl.arange(0, BLOCK_D)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_D], tl.float32)
    db = tl.zeros([BLOCK_D], tl.float32)
    for start in range(program * ROWS, M, programs * ROWS):
        rows = start + tl.arange(0, ROWS)
        inside = (rows < M)[:, None] & (cols < D)[None, :]
        at = rows.to(tl.int64)[:, None] * D + cols[None, :]
        x = tl.load(x_ptr + at, mask=inside, other=0.0).to(tl.float32)
        s = tl.load(s_ptr + at, mask=inside, other=0.0).to(tl.float32)
        if DROP:  # a constant: resolved when the kernel compiles, so keep exists below where DROP holds
            keep = tl.rand(tl.load(seed_ptr), at.to(tl.int32)) >= p
            s = tl.where(keep, s * scale, 0.0)
        mean = tl.load(mean_ptr + rows, mask=rows < M, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
        xhat = tl.where(inside, (x + s - mean[:, None]) * rstd[:, None], 0.0)
        dy = tl.load(dy_ptr + at, mask=inside, other=0.0).to(tl.float32)
        wdy = dy * w[None, :]
        c1 = tl.sum(xhat * wdy, 1) / D
        c2 = tl.sum(wdy, 1) / D
        dz = (wdy - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        tl.store(dx_ptr + at, dz.to(dx_ptr.dtype.element_ty), mask=inside)
        if DROP:
            dz = tl.where(keep, dz * scale, 0.0)
        tl.store(ds_ptr + at, dz.to(ds_ptr.dtype.element_ty), mask=inside)
        dw += tl.sum(dy * xhat, 0)
        db += tl.sum(dy, 0)
    tl.store(dw_ptr + program * D + cols, dw, mask=cols < D)
    tl.store(db_ptr + program * D + cols, db, mask=cols < D)


@torch.library.triton_op("postnorm_kernel::forward", mutates_args=())
def forward(x: Tensor, s: Tensor, weight: Tensor, bias: Tensor, p: float, eps: float,
            seed: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """LayerNorm(x + Dropout(s)) of x, s [M, D] (contiguous, one dtype) with the gain ``weight`` and bias
    ``bias`` [D], ``seed`` a one-element int32 device tensor -> y and each row's mean and rstd (fp32). A
    Triton operator: torch.compile traces into it and launches the kernel from its own generated code, as it
    launches the kernels it writes (an opaque custom operator's Python dispatch and Triton's own launcher
    cost more host time than the kernel: gpu_visit_2026-12-04), and the autograd formula below is its
    backward."""
    m, d = x.shape
    torch._check(m * d < 2**31, lambda: f"post_norm: {m} × {d} elements, more than the int32 Philox offsets reach")
    y = torch.empty_like(x)
    mean, rstd = x.new_empty(m, dtype=torch.float32), x.new_empty(m, dtype=torch.float32)

    def grid(meta: dict) -> tuple:  # the tuned ROWS sets it
        return (triton.cdiv(m, meta["ROWS"]),)

    torch.library.wrap_triton(_forward)[grid](x, s, y, weight, bias, mean, rstd, seed, p, _scale(p), m, d, eps,
                                              DROP=p > 0.0, BLOCK_D=triton.next_power_of_2(d))
    return y, mean, rstd


@torch.library.triton_op("postnorm_kernel::backward", mutates_args=())
def backward(dy: Tensor, x: Tensor, s: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor, p: float,
             seed: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of ``forward``'s y with respect to x, s, the gain and the bias, from y's gradient ``dy``."""
    m, d = x.shape
    dx, ds = torch.empty_like(x), torch.empty_like(s)
    programs = 4 * _processors(x.device)  # a fixed count (no shape guard); one with no rows writes zero sums
    dw = x.new_empty(programs, d, dtype=torch.float32)
    db = x.new_empty(programs, d, dtype=torch.float32)
    torch.library.wrap_triton(_backward)[(programs,)](dy.contiguous(), x, s, weight, mean, rstd, dx, ds, dw, db,
                                                      seed, p, _scale(p), m, d, DROP=p > 0.0,
                                                      BLOCK_D=triton.next_power_of_2(d))
    return dx, ds, dw.sum(0).to(weight.dtype), db.sum(0).to(weight.dtype)


def _keep(ctx, inputs: tuple, output: tuple) -> None:
    x, s, weight, _, p, _, seed = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, s, weight, mean, rstd, seed)
    ctx.p = p


def _gradients(ctx, dy: Tensor, _mean: Tensor, _rstd: Tensor) -> tuple:
    x, s, weight, mean, rstd, seed = ctx.saved_tensors
    dx, ds, dw, db = backward(dy, x, s, weight, mean, rstd, ctx.p, seed)
    return dx, ds, dw, db, None, None, None


forward.register_autograd(_gradients, setup_context=_keep)


def _scale(p: float) -> float:
    """Inverted dropout's scale for the kept elements (§5.4)."""
    return 1.0 / (1.0 - p) if p < 1.0 else 0.0


def _processors(device: torch.device) -> int:
    """The GPU's multiprocessors (the backward's programs: a few per processor); 8 on a CPU."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8


def post_norm(x: Tensor, s: Tensor, norm: torch.nn.LayerNorm, p: float, training: bool) -> Tensor:
    """LayerNorm(x + Dropout(s)) through the kernels, as ``model.residual``'s post-norm junction; a fresh
    seed from x's device generator each call (no dropout, and no draw, out of training)."""
    p = p if training else 0.0
    seed = torch.randint(0, 2**31 - 1, (1,), device=x.device, dtype=torch.int32) if p > 0.0 else \
        torch.zeros(1, device=x.device, dtype=torch.int32)
    d = x.shape[-1]
    y, _, _ = forward(x.reshape(-1, d).contiguous(), s.reshape(-1, d).contiguous(), norm.weight, norm.bias, p,
                      norm.eps, seed)
    return y.view(x.shape)
