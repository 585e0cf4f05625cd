"""GPU training throughput of the paper's base and big models (§5.2, Table 2 on today's hardware).

    python benchmarks/gpu.py [--steps 20] [--tokens 25000] [--models base,big]

Trains each model for a few steps on synthetic batches shaped like WMT14 EN-DE (sentence lengths spread around
the mean of 27 BPE pieces, V = 37,000, length-bucketed into batches of --tokens tokens per side, the paper's
25k) through the project's own ``train_step``, in each precision (fp32, bf16 autocast, fp16 autocast with loss
scaling, bf16 + torch.compile, the same compiled graphs replayed as CUDA graphs: what launching kernels costs
the host, measured away, compiled with Inductor's kernel tuning, ``TUNED``: what better launch parameters of
its generated kernels would give, bf16 eager and compiled with the post-norm junctions through
benchmarks/postnorm_kernel.py's candidate kernels, ``KERNEL_MODES``, compiled with attention through SDPA's
memory-efficient kernel first, ``EFFICIENT_MODES``, and compiled with the feed-forward layers' ReLU in their
first product's epilogue, benchmarks/linear_relu.py, ``EPILOGUE_MODES``), and reports step time, target tokens/s,
peak memory and MFU: the model's matmul FLOPs (``flops_per_token``) per second over the GPU's dense bf16 peak;
for each one-batch row, what reading a step's outcome after queueing the next gains (``host_overlap``); and,
with ``--accumulate N`` (default 8), each model in bf16 with a step's tokens taken as N micro-batches, as the
WMT recipes (update_freq 8) train on one device, cycling through the shapes its warm-up meets. It also lists
the attention kernels that ran (flash / memory-efficient SDPA) and checks on the GPU that an fp16 step whose
gradients overflow is skipped and leaves the weights alone. With ``--profile MODES`` (default: bf16,
bf16+compile, bf16+tuned, the kernel, efficient and epilogue rows, those of them that --modes measures), each
model's steps in those precisions also run under torch.profiler: GPU kernel time per step by kind (matrix
products, attention, copies, elementwise, ...: ``kernel_kind``), kernels per step, and the GPU's busy share
(kernel time over the unprofiled step time) — where a step's time goes, before changing it (issue 47) — and,
from two more steps traced with the host, the lines of the package that launched the copies and elementwise
kernels and each matrix product by its operands' shapes with the rate of its multiply-adds (``kernel_sources``),
and from three more, where the GPU waits for the host (``idle_gaps``).
``--before DIR`` (a folder holding an earlier ``transformer/`` package, e.g. ``git archive COMMIT transformer
| tar -x -C DIR``) first measures the same rows with that package, in a process of its own on the same card
(rows only, in ``EARLIER_MODES``: its profile was read on 2026-11-29,
benchmarks/results/gpu_visit_2026-11-29/), and reports each row's speed-up and peak memory beside them; and,
with ``--curve STEPS`` (default 200), the loss curve of one fixed bf16 run of base on batches it can learn
(each target its source) with both packages, and how far apart they are (``compare_curves``: issue 47 keeps it
within 1e-2 relative), beside how far the earlier package's own curve moves when only rounding changes (every
weight nudged by ``NUDGE`` relative): the floor a change of summation order alone reaches, and when only its
dropout masks are drawn again (the generators reseeded after the weights): the floor for a change that draws
them otherwise. ``--curve-modes MODES`` draws the same run in those precisions too (the candidate kernels,
SDPA's memory-efficient kernel, compiled), each against this package's bf16 curve and beside that curve's own
dropout floor, drawn in this run: no earlier package needed (``curve_candidates``). It also times what a batch
of a shape never seen before costs, per attention backend (``first_shape_cost``). Writes
benchmarks/results/NAME.json and .md (``--name``, default gpu_train). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from provenance import add_results_option, code_state, commit_text, results_folder, write_result, write_whole
from transformer.config import load_config
from transformer.cost import H100_BF16_FLOPS, training_cost
from transformer import data
from transformer.data import Example, collate, make_batches
from transformer.distributed import Dist
from transformer.model import Transformer, count_parameters, flops_per_token
from transformer.optim import learning_rate, make_optimizer
from transformer import train as training
from transformer.train import train_step

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 37_000  # WMT14 EN-DE's shared BPE vocabulary (§5.1, A15)
# precision -> (autocast dtype, torch.compile mode: None eager, "default" as train.compile compiles, "reduce-overhead"
# the same graphs replayed as CUDA graphs, one per batch shape: what launching costs the host, measured away;
# "tuned" as train.compile compiles with Inductor's options TUNED, an experiment the trainer does not run)
MODES = {"fp32": (None, None), "bf16": (torch.bfloat16, None), "fp16": (torch.float16, None),
         "bf16+compile": (torch.bfloat16, "default"), "bf16+cudagraphs": (torch.bfloat16, "reduce-overhead"),
         "bf16+tuned": (torch.bfloat16, "tuned"), "bf16+kernel": (torch.bfloat16, None),
         "bf16+compile+kernel": (torch.bfloat16, "default"), "bf16+compile+efficient": (torch.bfloat16, "default"),
         "bf16+compile+kernel+efficient": (torch.bfloat16, "default"),
         "bf16+cudagraphs+kernel+efficient": (torch.bfloat16, "reduce-overhead"),
         "bf16+compile+epilogue": (torch.bfloat16, "default"),
         "bf16+compile+kernel+efficient+epilogue": (torch.bfloat16, "default"),
         "bf16+cudagraphs+kernel+efficient+epilogue": (torch.bfloat16, "reduce-overhead")}
# rows whose post-norm junctions run through benchmarks/postnorm_kernel.py's candidate kernels in place of
# model.residual's operators: eager (what the kernels give a step no compiler fuses) and compiled (the kernels
# launched by the compiled graph, in place of what Inductor generates for the junction)
KERNEL_MODES = tuple(m for m in MODES if "kernel" in m.split("+"))
# rows whose attention prefers SDPA's memory-efficient kernel where it applies (cuDNN's, FlashAttention's and the
# operators' after it): gpu_attention.py on 2026-12-04 timed it 1.24× (base) and 1.45× (big) faster than the cuDNN
# kernel SDPA picks, a call's forward and backward with its views' gradients, outside a compiled step
# (the compiled base step's host was at most 0.9 ms ahead of its GPU on 2026-12-04: a step whose kernels take
# less may then wait for the host, so the two changes are also measured with CUDA graphs)
EFFICIENT_MODES = tuple(m for m in MODES if "efficient" in m.split("+"))
# rows whose feed-forward layers apply their ReLU in the first product's epilogue (benchmarks/linear_relu.py):
# in base's compiled step on 2026-12-04 Inductor applied it by a kernel of its own after the product, 12
# launches and 0.92 ms a step
EPILOGUE_MODES = tuple(m for m in MODES if "epilogue" in m.split("+"))
# the costliest single kernel of base's step in the 2026-12-04 profile
# (benchmarks/results/gpu_visit_2026-12-04/) was one Inductor generates, dropout + residual + LayerNorm
# backward, at an estimated third of a copy's rate (its launches were not recorded then). Coordinate descent
# tries each generated kernel's neighbouring block sizes and warp counts on the shapes met and keeps the
# fastest: what better-chosen launch parameters alone would give, before a kernel is written by hand
TUNED = {"coordinate_descent_tuning": True}
EARLIER_MODES = ("fp32", "bf16", "fp16", "bf16+compile")  # those --before's package is measured in
T0 = time.perf_counter()


def mark(what: str) -> None:
    """A line of progress with the seconds since the script started: a GPU visit's log then says where
    its minutes went, also when the visit's time limit cuts it off."""
    print(f"# {time.perf_counter() - T0:.0f} s: {what}", flush=True)


def synthetic_batches(tokens: int, n_sentences: int, seed: int = 0, copy: bool = False) -> tuple[list, float, float]:
    """Length-bucketed batches of random pieces; source and target lengths 10..44 (mean ~27). With
    ``copy`` each target is its source: a task a model learns within a few hundred steps, so a loss curve
    over them falls, and two training paths that drift apart show it (random targets keep the loss at
    ln V whatever the path does).

    Sorted by target length, a batch's sources keep their spread: at 25k tokens the full batches kept are 568
    sentences with targets 42-44 long, ~15.7k source tokens padded to 24,992 positions (34-42% padding; the
    targets 1-3%). MFU credits ``flops_per_token`` per target token, which counts a source as long as its
    target: the padded source positions are credited as if real. A change that skipped padded positions
    (unpadded position-wise layers, variable-length attention) would shorten the step without computing the
    credited FLOPs any faster: not a gain these rows can show (Multi30k's batches, sorted by the longer side,
    hold ~4% padding: benchmarks/results/shape_buckets.md)."""
    rng = random.Random(seed)
    examples = []
    for _ in range(n_sentences):
        s, t = rng.randint(9, 43), rng.randint(9, 43)
        src = [rng.randrange(4, VOCAB) for _ in range(s)] + [2]
        examples.append(Example(src, list(src) if copy else [rng.randrange(4, VOCAB) for _ in range(t)] + [2]))
    # the issue's batches, whichever package runs: sorted by (target, source) length as the package batched
    # when they were fixed (2026-11-22; it sorts by the longer side since 2026-12-02), then filled to the budget
    src_lengths, tgt_lengths = [len(e.src) for e in examples], [len(e.tgt) for e in examples]
    fill = getattr(data, "fill_batches", None)  # a package from before it (--before) sorted so itself
    plan = (fill(np.lexsort((src_lengths, tgt_lengths)), src_lengths, tgt_lengths, tokens) if fill else
            make_batches(examples, tokens))
    batches = [collate(examples, idx) for idx in plan]
    batches = [b for b in batches if b.n_tgt_tokens > 0.9 * tokens]  # full batches only
    src_len = sum(len(e.src) for e in examples) / len(examples)
    tgt_len = sum(len(e.tgt) for e in examples) / len(examples)
    return batches, src_len, tgt_len


def shape(batch) -> tuple:
    """A batch's shape as the kernels see it: (sentences, source length, target length)."""
    return (*batch.src.shape, batch.tgt_in.shape[1])


def on_gpu(name: str, device: str = "cuda") -> tuple:
    """A freshly initialised preset (seed 0) on the GPU: its config, the model, Adam, the process's Dist."""
    cfg = load_config(name)
    torch.manual_seed(0)
    dist = Dist(device=torch.device(device))
    model = Transformer(cfg.model, VOCAB).to(dist.device)
    return cfg, model, make_optimizer(model, cfg.train), dist


def compile_like_the_trainer(raw: torch.nn.Module, device: torch.device, mode: str = "default") -> torch.nn.Module:
    """``raw`` compiled as the package's trainer compiles it (train.compile: ``train.compiled``); a package
    from before that function (``--before``) compiled as its trainer did, by plain torch.compile. ``mode``
    "reduce-overhead": the same, its graphs replayed as CUDA graphs."""
    compiled = getattr(training, "compiled", None)
    if mode not in ("default", "tuned"):
        return compiled(raw, raw, device, mode)
    return compiled(raw, raw, device) if compiled else torch.compile(raw)


def host_overlap(queue, first: int, steps: int, rounds: int = 3) -> dict:
    """What the host gains by reading a step's outcome late: ``rounds`` rounds of three blocks of ``steps``
    steps, timed apart, ms per step (the median round). "sync": each step's outcome read before the next is
    queued (``train_step``; the trainer before 2026-12-01); "late": read after the next step is queued
    (``queue_step``), so the host launches step i + 1 while the GPU runs step i; "late_pinned": the same with
    the batches copied from pinned memory, as the trainer now runs (``Trainer.run``). ``queue(i, pin)``
    queues step i and returns its ``QueuedStep``. Also the host's own time a step in that last way, queueing it
    (``host_queue_ms``, the waits for outcomes left out): where it nears the step's time the host is the bound,
    and kernels taking less would not shorten the step."""
    times: dict[str, list[float]] = {"sync": [], "late": [], "late_pinned": []}
    queueing: list[float] = []
    i = first
    for _ in range(rounds):
        for how, spent in times.items():
            torch.cuda.synchronize()
            start, pending, host = time.perf_counter(), None, 0.0
            for _ in range(steps):
                began = time.perf_counter()
                queued = queue(i, how == "late_pinned")
                host += time.perf_counter() - began
                i += 1
                if how == "sync":
                    queued.result()
                    continue
                if pending is not None:
                    pending.result()
                pending = queued
            if pending is not None:
                pending.result()
            torch.cuda.synchronize()
            spent.append(1000 * (time.perf_counter() - start) / steps)
            if how == "late_pinned":
                queueing.append(1000 * host / steps)
    return {"steps": steps, "rounds": rounds, **{f"{how}_ms": round(statistics.median(spent), 2)
                                                 for how, spent in times.items()},
            "host_queue_ms": round(statistics.median(queueing), 2)}


def row_mode(mode: str, micro: int) -> str:
    """A row's name for its precision: a micro-batch row's carries its count (``bf16 ×8``)."""
    return mode if micro == 1 else f"{mode} ×{micro}"


def measure(name: str, mode: str, batches: list, steps: int, warmup: int, src_len: float, tgt_len: float,
            micro: int = 1, profile: int = 0) -> tuple[dict, dict | None]:
    """One row of the table: preset ``name`` trained in ``mode``, each step accumulating ``micro`` of
    ``batches`` (the WMT recipes' one-device layout is 8 micro-batches of 3,125 tokens: ``--accumulate``);
    and, with ``profile`` steps, the same model's next steps profiled (``profile_steps``: a compiled model is
    compiled once for both)."""
    with as_the_row_runs(mode):  # compiling happens at the first steps, so all of them run inside
        return measure_row(name, mode, batches, steps, warmup, src_len, tgt_len, micro, profile)


@contextlib.contextmanager
def as_the_row_runs(mode: str):
    """Within it, the package runs as the rows of ``mode`` run it: Inductor's options, the junctions through the
    candidate kernels, attention preferring the memory-efficient kernel, the feed-forward layers' ReLU in their
    product's epilogue, each where ``mode`` names it."""
    with inductor_options(MODES[mode][1]), junctions_through_kernels(mode in KERNEL_MODES), \
            attention_preferring_efficient(mode in EFFICIENT_MODES), ffn_through_epilogue(mode in EPILOGUE_MODES):
        yield


KERNEL_DEVICES = ("cuda",)  # where the junctions go through the kernels (the tests add the CPU: the interpreter)


def junctions_through_kernels(on: bool):
    """Within it, where ``on``, the package's post-norm junctions LayerNorm(x + Dropout(Sublayer(x))) in bf16
    or fp16 on a GPU go through postnorm_kernel.post_norm (``model.residual`` replaced: its layers look it up
    at each call); the rest (pre-norm, fp32, the CPU) as before."""
    if not on:
        return contextlib.nullcontext()
    import transformer.model
    from postnorm_kernel import post_norm

    operators = transformer.model.residual

    def through_kernels(x, norm, drop, pre, sublayer):
        if pre or x.dtype == torch.float32 or x.device.type not in KERNEL_DEVICES:
            return operators(x, norm, drop, pre, sublayer)
        return post_norm(x, sublayer(x), norm, drop.p, drop.training)

    return mock.patch.object(transformer.model, "residual", through_kernels)


EPILOGUE_DEVICES = ("cuda",)  # where the feed-forward layers take the epilogue (the tests add the CPU)


def ffn_through_epilogue(on: bool):
    """Within it, where ``on``, the feed-forward layers' max(0, x W1ᵀ + b1) in training on a GPU goes through
    linear_relu.linear_relu, one product with the ReLU in its epilogue (``model.apply`` replaced: the layers
    look it up at each call); the rest (other projections, decoding, the CPU) as before."""
    if not on:
        return contextlib.nullcontext()
    import transformer.model
    from linear_relu import linear_relu

    operators = transformer.model.apply

    def through_epilogue(layer, x, relu=False):
        if (relu and torch.is_grad_enabled() and x.device.type in EPILOGUE_DEVICES
                and isinstance(layer, torch.nn.Linear) and layer.bias is not None):
            return linear_relu(x, layer.weight, layer.bias)
        return operators(layer, x, relu)

    return mock.patch.object(transformer.model, "apply", through_epilogue)


def attention_preferring_efficient(on: bool):
    """Where ``on``, SDPA tries its memory-efficient kernel first, then cuDNN's, FlashAttention's and the
    operators' (each where it applies), else the context changes nothing."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    return sdpa_kernel(order, set_priority=True) if on else contextlib.nullcontext()


def inductor_options(compile_mode: str | None):
    """A context in which Inductor compiles with TUNED where ``compile_mode`` is "tuned", else as it is."""
    import torch._inductor.config

    return torch._inductor.config.patch(TUNED if compile_mode == "tuned" else {})


def measure_row(name: str, mode: str, batches: list, steps: int, warmup: int, src_len: float, tgt_len: float,
                micro: int, profile: int) -> tuple[dict, dict | None]:
    """``measure``'s row, with Inductor's options already set."""
    from torch._dynamo.utils import counters

    amp_dtype, compile_mode = MODES[mode]
    if compile_mode:
        torch._dynamo.reset()  # each row compiles its own graphs: none reused from a row of other options
    cfg, raw, optimizer, dist = on_gpu(name)
    device = dist.device
    graph_skips = counters["inductor"]["cudagraph_skips"]
    model = compile_like_the_trainer(raw, dist.device, compile_mode) if compile_mode else raw
    scaler = torch.amp.GradScaler("cuda") if amp_dtype is torch.float16 else None
    torch.cuda.reset_peak_memory_stats()
    skipped, tokens = 0, 0
    start = time.perf_counter()
    queue_step = getattr(training, "queue_step", None)  # a package from before it (--before) reads at once
    pinned_batches = None

    def step(i: int, pin: bool = False, late: bool = False):
        nonlocal pinned_batches
        if pin and pinned_batches is None:
            pinned_batches = [b.pin_memory() for b in batches]
        chosen = pinned_batches if pin else batches
        step_batches = [chosen[(i * micro + j) % len(chosen)].to(device) for j in range(micro)]
        if compile_mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # the graphs' outputs of the step before are free
        return (queue_step if late else train_step)(model, optimizer, step_batches, cfg.train.eps_ls, 1e-4, 0.0,
                                                    dist, scaler, amp_dtype)

    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            start, tokens, calls = time.perf_counter(), 0, allocator_calls()
        result = step(i)
        skipped += not result.applied
        tokens += result.n_tokens
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / steps
    achieved = flops_per_token(cfg.model, VOCAB, src_len, tgt_len) * tokens / steps / seconds
    row = {"model": name, "mode": row_mode(mode, micro), "micro_batches": micro,
           "parameters": count_parameters(raw), "step_ms": round(1000 * seconds, 1),
           "tgt_tokens_per_step": round(tokens / steps), "tgt_tokens_per_s": round(tokens / steps / seconds),
           "model_tflops": round(achieved / 1e12, 1), "mfu": round(achieved / H100_BF16_FLOPS, 3),
           "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2), "skipped_steps": skipped,
           "allocator_per_step": {k: round((n - calls[k]) / steps, 2) for k, n in allocator_calls().items()}}
    if compile_mode == "reduce-overhead":  # graphs inductor ran without CUDA graphs (the log says why)
        row["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"] - graph_skips
    if queue_step and micro == 1:
        row["host_overlap"] = host_overlap(lambda i, pin: step(i, pin, late=True), warmup + steps,
                                           max(2, steps // 2))
    print(json.dumps(row), flush=True)
    profiled = profile_steps(row, step, warmup + steps, profile) if profile else None
    mark(f"{name} {row['mode']} measured{' and profiled' if profile else ''}")
    del model, raw, optimizer
    torch.cuda.empty_cache()
    return row, profiled


ALLOCATOR_CALLS = ("num_device_alloc", "num_device_free", "num_alloc_retries")


def allocator_calls() -> dict[str, int]:
    """How often PyTorch's caching allocator has called cudaMalloc and cudaFree, and retried an allocation after
    emptying its cache, in this process. A step that meets its memory in the cache calls neither; one that does
    not waits for them, and cudaFree waits for the whole device: a row's counts a step say whether the allocator
    is why a step leaves the GPU idle (big's compiled step on 2026-12-04 did so at its forward's start, longer
    than base's with the same number of tensors: benchmarks/results/gpu_visit_2026-12-04/)."""
    stats = torch.cuda.memory_stats()
    return {k: stats.get(k, 0) for k in ALLOCATOR_CALLS}


def loss_curve(name: str, mode: str, batches: list, steps: int, device: str = "cuda",
               nudge: float = 0.0, dropout_seed: int | None = None) -> list[float]:
    """The per-token label-smoothed loss of each of the first ``steps`` steps of a fixed run: preset
    ``name`` drawn with seed 0, trained in ``mode`` on ``batches`` in order, the learning rate rising
    linearly over the ``steps`` (eq. 3 with its warmup compressed into them) to the preset's own peak.
    Issue 47 holds its changes to the curve the earlier package draws this way (``compare_curves``).
    ``nudge``: every initial weight times (1 + nudge), a change of rounding alone, for the floor;
    ``dropout_seed``: the same initial weights, the random generators reseeded after drawing them, so that
    every dropout mask is another draw: the floor for a change that draws its masks otherwise (the
    candidate kernels of postnorm_kernel.py). The package runs as ``mode``'s rows run it (``as_the_row_runs``)."""
    amp_dtype, compile_mode = MODES[mode]
    cfg, raw, optimizer, dist = on_gpu(name, device)
    if dropout_seed is not None:
        torch.manual_seed(dropout_seed)  # the CPU's generator and every GPU's
    if nudge:
        with torch.no_grad():
            for p in raw.parameters():
                p.mul_(1 + nudge)
    t = cfg.train
    scale = t.lr_scale * (steps / t.warmup_steps) ** 0.5  # the peak at the last step: the preset's peak
    curve = []
    with as_the_row_runs(mode):  # compiled at the first step, inside
        model = compile_like_the_trainer(raw, dist.device, compile_mode) if compile_mode else raw
        for i in range(steps):
            lr = learning_rate(i + 1, cfg.model.d_model, steps, scale)
            result = train_step(model, optimizer, [batches[i % len(batches)].to(dist.device)], t.eps_ls, lr, 0.0,
                                dist, None, amp_dtype)
            curve.append(result.loss / result.n_tokens)
    del model, raw, optimizer
    if device == "cuda":
        torch.cuda.empty_cache()
    return curve


CURVE_BOUND = 1e-2  # issue 47: the first 200 steps within 1e-2 relative of today's path
NUDGE = 2.0**-20  # the floor's change: 8 to 16 units in the last place of an fp32 weight


def compare_curves(before: list[float], after: list[float]) -> dict:
    """How far two loss curves of the same run are apart, step by step, relative to ``before``: the
    largest gap and its step (1-based), the first step's (before any update: the same weights read by
    both paths, so only the arithmetic differs), the mean, and whether all lie within ``CURVE_BOUND``."""
    if len(before) != len(after) or not before:
        raise ValueError(f"loss curves of {len(before)} and {len(after)} steps cannot be compared")
    gaps = [abs(a - b) / abs(b) for b, a in zip(before, after)]
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    return {"steps": len(gaps), "max_rel_diff": gaps[worst], "at_step": worst + 1, "first_step_rel_diff": gaps[0],
            "mean_rel_diff": sum(gaps) / len(gaps), "bound": CURVE_BOUND, "within": gaps[worst] <= CURVE_BOUND,
            "loss_first": [before[0], after[0]], "loss_last": [before[-1], after[-1]]}


def curve_floor(reference: list[float], other: list[float]) -> dict:
    """How far ``other``, the reference run with only its rounding or its dropout masks changed, moves from
    ``reference``: ``compare_curves``' largest gap, its step and the mean, the floor a change is read against."""
    gaps = compare_curves(reference, other)
    return {k: gaps[k] for k in ("max_rel_diff", "at_step", "mean_rel_diff")}


# (kind, words in a CUDA kernel's name): the first kind whose word the lower-cased name holds. Copies come
# before elementwise (PyTorch's dtype casts and layout copies run as elementwise kernels named after
# direct_copy / bfloat16_copy, torch.cat as CatArrayBatchedCopy), attention before matmul (cuDNN's SDPA
# kernels carry gemm-like tile names).
KERNEL_KINDS = (
    ("attention", ("flash", "fmha", "sdpa", "attention")),
    ("optimizer", ("adam", "multi_tensor")),  # the fused Adam step and the gradient-norm clip
    ("copies", ("copy", "memcpy")),
    # the aten products themselves: what a CPU trace (``kernel_sources(device="cpu")``) names its kernels
    ("matmul", ("gemm", "cutlass", "xmma", "cublas", "wgmma", "nvjet", "splitk", "aten::mm", "aten::addmm",
                "aten::_addmm_activation", "aten::bmm", "aten::baddbmm")),
    ("softmax/loss", ("softmax", "cross_entropy", "nll_loss", "logsumexp")),
    ("layernorm", ("layer_norm", "layernorm", "gammabeta")),
    ("indexing", ("index", "gather", "scatter", "embedding")),
    ("reduction", ("reduce", "triton_red", "triton_per")),
    ("elementwise", ("elementwise", "dropout", "triton_poi", "fill", "where", "masked")),
)
# the words of an inductor kernel's name (triton_poi_fused_<ops>_<n>) that only move data
INDUCTOR_COPIES = {"to", "copy", "clone", "cat", "view", "permute", "transpose", "expand", "unsqueeze", "t"}


def kernel_kind(name: str) -> str:
    """The kind of a CUDA kernel, from its name (``KERNEL_KINDS``); "other" when no word matches.

    An inductor kernel is named after the operators it fused: ``triton_poi_fused__to_copy_add_native_dropout_3``
    adds, drops out and casts in one pass, work an elementwise kernel does anyway, so it counts as a copy only
    when copying is all it does (``triton_poi_fused__to_copy_7``)."""
    low = name.lower()
    if low.startswith("triton_") and "_fused_" in low:
        words = [w for w in low.split("_fused_", 1)[1].split("_") if w and not w.isdigit()]
        if words and set(words) <= INDUCTOR_COPIES:
            return "copies"
        low = low.replace("_to_copy", "").replace("copy", "")
    return next((kind for kind, words in KERNEL_KINDS if any(w in low for w in words)), "other")


def allocator_text(row: dict) -> str:
    """A row's allocator calls a step (``allocator_calls``) as the md gives them; "–" for a row measured by a
    script from before they were counted."""
    calls = row.get("allocator_per_step")
    return " / ".join(f"{calls[k]:g}" for k in ALLOCATOR_CALLS) if calls else "–"


def error_line(e: Exception) -> str:
    """A failed row's error as its result names it: the exception's type and its first line, cut short."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def cuda_kernels(prof) -> list[tuple[str, float, int]]:
    """(name, total µs, launches) of every GPU kernel a torch.profiler run recorded: ``kernel_summary``'s input."""
    return [(e.key, getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)), e.count)
            for e in prof.key_averages() if str(getattr(e, "device_type", "")).endswith("CUDA")]


def kernel_summary(kernels: list[tuple[str, float, int]], steps: int, step_ms: float) -> dict:
    """(name, total µs, launches) of every kernel over ``steps`` profiled steps -> milliseconds per step
    by kind (largest first), kernels launched per step, and the GPU's busy share: kernel time per step
    over ``step_ms``, the step time measured without the profiler (one stream: kernels do not overlap)."""
    by_kind: dict[str, float] = {}
    for name, us, _ in kernels:
        by_kind[kernel_kind(name)] = by_kind.get(kernel_kind(name), 0.0) + us / 1000 / steps
    busy = sum(by_kind.values())
    return {"kernel_ms_per_step": {k: round(v, 2) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "kernel_ms_total": round(busy, 2), "kernels_per_step": round(sum(n for *_, n in kernels) / steps),
            "gpu_busy": round(min(1.0, busy / step_ms), 3) if step_ms > 0 else None,
            "top_kernels": [{"name": n[:120], "kind": kernel_kind(n), "ms_per_step": round(us / 1000 / steps, 2),
                             "launches_per_step": round(launches / steps, 1)}  # bytes per launch make a rate
                            for n, us, launches in sorted(kernels, key=lambda k: -k[1])[:12]]}


FRAME = re.compile(r"(?:^|[/\\])transformer[/\\](\w+\.py)\((\d+)\): (\w+)")  # a with_stack frame of the package
BACKWARD = "autograd::engine::evaluate_function: "


def kernel_sources(events, steps: int, kinds: tuple[str, ...] = ("copies",), top: int = 12,
                   device: str = "cuda") -> dict:
    """Which lines of the package launched the kernels of ``kinds``: torch.profiler's events of steps run with
    ``record_shapes`` and ``with_stack`` -> for each kind, milliseconds and launches per step by source, largest
    first, with the shape of the source's costliest launch and that kernel's name (an aten operator's kernel
    names its functor: an add, a fill, a copy).

    A source is the two innermost frames of ``transformer/`` above the launching operator and the outermost
    aten operator below them (``model.py:283 residual ← model.py:300 forward · aten::add``). A backward kernel
    runs on autograd's thread, which has no Python frames: it is charged to its autograd node (``AddBackward0``)
    and to the frames of the forward operator that made the node (the same sequence number). On a GPU an
    operator's ``kernels`` are what it launched; with ``device="cpu"`` (tests) each aten operator without
    children, and each product, is its own kernel, timed by its self time.

    Matrix products are told apart by their operands' shapes too (a compiled graph's products have no package
    frame, so by source alone they would be one row), and each such row gets its multiply-adds' rate
    (``product_flops``): which products run below the card's rate, and by how much."""
    def chain(e) -> list:
        out = []
        while e is not None:
            out.append(e)
            e = e.cpu_parent
        return out

    def where(ancestors: list) -> tuple[str | None, str | None]:
        """(the two innermost package frames, the outermost aten operator below them) of a chain, innermost
        first: two, because the innermost is often a helper many lines call (``model.py:75 apply``)."""
        op, frames = None, []
        for a in ancestors:
            if (m := FRAME.search(a.name)):
                frames.append(f"{m[1]}:{m[2]} {m[3]}")
                if len(frames) == 2:
                    break
            elif a.name.startswith("aten::") and not frames:
                op = a.name
        return " ← ".join(frames) or None, op

    forward: dict[int, object] = {}  # sequence number -> the first forward operator holding it
    for e in events:
        if e.sequence_nr >= 0 and e.name.startswith("aten::"):
            forward.setdefault(e.sequence_nr, e)
    sources: dict[str, dict[tuple[str, str], list]] = {k: {} for k in kinds}
    for e in events:
        if str(e.device_type).endswith("CUDA"):
            continue
        if device == "cpu":
            # a product's own children (resolve_conj, a bias's expand) are not its work
            leaf = not e.cpu_children or kernel_kind(e.name) == "matmul"
            launched = [(e.name, e.self_cpu_time_total)] if e.name.startswith("aten::") and leaf else []
        else:
            launched = [(k.name, k.duration) for k in e.kernels]
        # a product's multiply-adds count once, however many kernels it launched (a split-K product: two)
        counted = False
        for name, us in launched:
            kind = kernel_kind(name)
            if kind not in sources:
                continue
            ancestors = chain(e)
            node = next((a for a in ancestors if a.name.startswith(BACKWARD)), None)
            if node is None:
                frame, op = where(ancestors)
            else:
                frame, _ = where(chain(forward.get(node.sequence_nr)))
                op = node.name[len(BACKWARD):]
            op = op or e.name
            shapes = [list(x) for x in e.input_shapes or [] if x]
            if kind == "matmul":  # the product itself and its operands (ancestors above it are not products)
                op = f"{op} › {e.name} {shapes}" if op != e.name else f"{e.name} {shapes}"
            key = (frame or "(no package frame)", op)
            entry = sources[kind].setdefault(key, [0.0, 0, 0.0, None, 0.0, None])
            entry[0] += us
            entry[1] += 1
            if kind == "matmul" and not counted:
                entry[4] += product_flops(e.name, shapes) or 0.0
                counted = True
            if us >= entry[2]:
                entry[2], entry[3], entry[5] = us, shapes[0] if shapes else None, name
    return {kind: [{"source": f"{frame} · {op}", "ms_per_step": round(us / 1000 / steps, 3),
                    "launches_per_step": round(n / steps, 1), "shape": shape, "kernel": kernel[:120],
                    **({"tflop_s": float(f"{flops / us / 1e6:.3g}")} if flops and us > 0 else {})}
                   for (frame, op), (us, n, _, shape, flops, kernel) in sorted(found.items(),
                                                                               key=lambda kv: -kv[1][0])[:top]]
            for kind, found in sources.items()}


def product_flops(op: str, shapes: list[list[int]]) -> float | None:
    """2·M·N·K (times the batch) of one aten matrix product from its input shapes, None for any other
    operator or shapes it does not recognise: ``mm`` [M, K] [K, N], ``addmm`` and ``_addmm_activation`` (bias)
    [M, K] [K, N], ``bmm`` [B, M, K] [B, K, N], ``baddbmm`` (bias) [B, M, K] [B, K, N]."""
    operands = {"aten::mm": shapes[:2], "aten::addmm": shapes[1:3], "aten::_addmm_activation": shapes[1:3],
                "aten::bmm": shapes[:2], "aten::baddbmm": shapes[1:3]}.get(op)
    batched = op.endswith("bmm")
    if not operands or len(operands) != 2 or any(len(x) != 2 + batched for x in operands):
        return None
    a, b = operands
    if a[-1] != b[-2] or a[:-2] != b[:-2]:
        return None
    return 2.0 * (a[0] if batched else 1) * a[-2] * a[-1] * b[-1]


SOURCE_STEPS = 2  # steps traced with the host for ``kernel_sources``
IDLE_STEPS = 3  # steps traced with the host's operators (no stacks, no shapes) for ``idle_gaps``
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # a chrome trace's categories of work on the GPU
LAUNCHES = ("cuda_runtime", "cuda_driver")  # ... and of the host's calls that queue it (correlation ids)
HOST_RANGES = ("cpu_op", "user_annotation")  # ... and of the host's operators and named ranges
LONG_GAP_US = 20.0  # a gap longer than the GPU's own few microseconds from one kernel to the next


def idle_gaps(events: list[dict], steps: int, top: int = 10) -> dict:
    """Where the GPU waits for the host: torch.profiler's chrome trace (``traceEvents``) of ``steps`` steps,
    CPU and CUDA activities -> the GPU's idle time per step (the holes between its kernels, copies and
    memsets, all streams together) and, for each hole, what the host was doing: the operator that queued the
    work after it (the innermost range open on the launching thread at the launch, under the outermost),
    summed by that operator, largest first. ``queue_ms_median``: how far ahead of the GPU the host queues,
    from a launch to its kernel's start (near 0: the GPU runs as fast as the host launches). ``host_in_long_gaps``:
    what the launching thread did inside each long hole before it queued the work after it (``host_in_window``),
    summed by what it did: the host's work that kept the GPU waiting, where ``by_launch`` names only who ended
    the wait."""
    work = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_WORK), key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCHES and "correlation" in e.get("args", {})}
    gaps, end = [], None  # (µs idle, the work after the hole)
    for e in work:
        if end is not None and e["ts"] > end:
            gaps.append((e["ts"] - end, e))
        end = e["ts"] + e["dur"] if end is None else max(end, e["ts"] + e["dur"])
    # the ranges open at each launch, per host thread: one sweep over ranges and launches in time order
    by_thread: dict[tuple, list] = {}  # the host's ranges and CUDA calls (launches, synchronisations) per thread
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in HOST_RANGES + LAUNCHES:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    where: dict[int, str] = {}
    for found in by_thread.values():
        stack: list[dict] = []
        for e in sorted(found, key=lambda e: (e["ts"], -e.get("dur", 0.0))):
            stack = [r for r in stack if r["ts"] + r["dur"] >= e["ts"]]  # those still open (named ranges
            # need not nest inside operators)
            if e.get("cat") in HOST_RANGES:
                stack.append(e)
            elif stack:
                outer, inner = stack[0]["name"], stack[-1]["name"]
                where[id(e)] = inner if outer == inner else f"{outer} › {inner}"
            else:
                where[id(e)] = f"{e['name']} (outside any operator)"
    by_source: dict[str, list] = {}
    host: dict[str, float] = {}
    for us, e in gaps:
        launch = launches.get(e.get("args", {}).get("correlation"))
        source = where.get(id(launch), "(launch not traced)")  # id(None) is no launch's
        entry = by_source.setdefault(source, [0.0, 0, 0.0])
        entry[0], entry[1], entry[2] = entry[0] + us, entry[1] + 1, max(entry[2], us)
        if us > LONG_GAP_US:
            thread = [] if launch is None else by_thread.get((launch.get("pid"), launch.get("tid")), [])
            for name, spent in host_in_window(thread, e["ts"] - us, e["ts"], launch).items():
                host[name] = host.get(name, 0.0) + spent
    queued = sorted(e["ts"] - launches[c]["ts"] for e in work
                    if (c := e.get("args", {}).get("correlation")) in launches)
    idle = sum(us for us, _ in gaps)
    return {"steps": steps,
            "span_ms_per_step": round((end - work[0]["ts"]) / 1000 / steps, 2) if work else 0.0,
            "idle_ms_per_step": round(idle / 1000 / steps, 3), "gaps_per_step": round(len(gaps) / steps, 1),
            "long_gaps_per_step": round(sum(us > LONG_GAP_US for us, _ in gaps) / steps, 1),
            "idle_ms_per_step_in_long_gaps": round(sum(us for us, _ in gaps if us > LONG_GAP_US) / 1000 / steps, 3),
            "queue_ms_median": round(queued[len(queued) // 2] / 1000, 3) if queued else None,
            "by_launch": [{"launched_by": source, "ms_per_step": round(us / 1000 / steps, 3),
                           "gaps_per_step": round(n / steps, 1), "longest_us": round(longest, 1)}
                          for source, (us, n, longest) in sorted(by_source.items(), key=lambda kv: -kv[1][0])[:top]],
            "host_in_long_gaps": [{"host": name, "ms_per_step": round(us / 1000 / steps, 3)}
                                  for name, us in sorted(host.items(), key=lambda kv: -kv[1])[:top]]}


def host_in_window(thread: list[dict], start: float, end: float, launch: dict | None) -> dict[str, float]:
    """What one host thread did while the GPU sat idle from ``start`` to ``end`` (µs), up to ``launch``, the
    call that queued the work ending the hole: µs by the ranges open on the thread ("outermost › innermost",
    as ``idle_gaps`` names a launch; the innermost may be a CUDA call, a synchronisation among them), the time
    no range covers as Python's own, and the rest, from the launch to the work's start, as the launch's
    latency. Without a traced launch the whole hole is "(launch not traced)"; work queued before the hole
    opened waited on the device, not the host."""
    if launch is None:
        return {"(launch not traced)": end - start}
    until = min(max(launch["ts"], start), end)
    spent: dict[str, float] = {}
    if until < end:
        spent["(launch to the work's start)" if until > start else "(queued before the hole: a wait on the device)"] \
            = end - until
    ranges = [r for r in thread if r is not launch and r["ts"] < until and r["ts"] + r["dur"] > start]
    cuts = sorted({start, until, *(t for r in ranges for t in (r["ts"], r["ts"] + r["dur"]) if start < t < until)})
    for a, b in zip(cuts, cuts[1:]):
        open_ = sorted((r for r in ranges if r["ts"] <= a and r["ts"] + r["dur"] >= b),
                       key=lambda r: (r["ts"], -r["dur"]))
        name = ("(Python, no operator open)" if not open_ else open_[0]["name"] if len(open_) == 1
                else f"{open_[0]['name']} › {open_[-1]['name']}")
        spent[name] = spent.get(name, 0.0) + b - a
    return spent


def profile_steps(row: dict, step, start: int, steps: int) -> dict:
    """``steps`` more training steps of ``row``'s model (``step(i)`` trains step i, warm already) under
    torch.profiler (GPU kernels only, so the host's tracing does not slow the step), summarised by
    ``kernel_summary`` against the row's unprofiled step time; then ``SOURCE_STEPS`` more traced with the
    host, for the lines that launched the copies, elementwise kernels and products (``kernel_sources``); then
    ``IDLE_STEPS`` more traced with the host's operators alone (lighter: no stacks, no shapes), for where
    the GPU waits for the host (``idle_gaps``)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(start + i)
        torch.cuda.synchronize()
    kernels = cuda_kernels(prof)
    # a second pass traces the host too (shapes, Python frames): slower steps, the same kernels, now with
    # the lines that launched them
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                 with_stack=True) as traced:
        for i in range(SOURCE_STEPS):
            step(start + steps + i)
        torch.cuda.synchronize()
    sources = kernel_sources(traced.events(), SOURCE_STEPS, ("copies", "elementwise", "matmul"))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as timeline:
        for i in range(IDLE_STEPS):
            step(start + steps + SOURCE_STEPS + i)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:  # the trace's events with their times: its chrome export
        timeline.export_chrome_trace(str(Path(tmp) / "trace.json"))
        idle = idle_gaps(json.loads((Path(tmp) / "trace.json").read_text())["traceEvents"], IDLE_STEPS)
    profiled = {"model": row["model"], "mode": row["mode"], "step_ms": row["step_ms"],
                **kernel_summary(kernels, steps, row["step_ms"]), "sources": sources, "idle": idle}
    print(json.dumps(profiled), flush=True)
    return profiled


def attention_kernels(batch) -> list[str]:
    """Names of the CUDA kernels that computed attention in one bf16 training step of base."""
    from torch.profiler import ProfilerActivity, profile

    _, model, optimizer, dist = on_gpu("base")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        train_step(model, optimizer, [batch.to(dist.device)], 0.1, 1e-4, 0.0, dist, None, torch.bfloat16)
        torch.cuda.synchronize()
    words = ("flash", "fmha", "attention", "attn", "sdpa")
    return sorted({e.key for e in prof.key_averages() if any(w in e.key.lower() for w in words)})


def fp16_overflow_is_skipped(batch) -> dict:
    """A loss scale of 2^40 overflows fp16 gradients: the step must be skipped, the weights and Adam's
    state untouched, and the scale lowered for the next step (dynamic loss scaling)."""
    _, model, optimizer, dist = on_gpu("base")
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**40)
    before = [p.detach().clone() for p in model.parameters()]
    step = lambda: train_step(model, optimizer, [batch.to(dist.device)], 0.1, 1e-3, 0.0, dist,  # noqa: E731
                              scaler, torch.float16)
    first = step()
    unchanged = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    # fused Adam skips on the device: its state may exist after the skipped step, all zero at step 0
    adam_untouched = all(float(st["step"]) == 0 and not st["exp_avg"].any() and not st["exp_avg_sq"].any()
                         for st in optimizer.state.values())
    skipped = 0 if first.applied else 1
    while skipped and not step().applied:
        skipped += 1
    changed = not all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    return {"first_step_applied": first.applied, "weights_unchanged_after_skip": unchanged,
            "adam_state_untouched_after_skip": adam_untouched,
            "steps_skipped_before_first_update": skipped, "scale_after": scaler.get_scale(),
            "weights_changed_by_first_finite_step": changed}


FIRST_SHAPE_BACKENDS = ("CUDNN_ATTENTION", "EFFICIENT_ATTENTION")  # flash takes no padding mask


def first_shape_cost(batches: list, per_backend: int = 8, name: str = "base") -> dict:
    """What a batch of a shape never seen before costs preset ``name``'s bf16 step, per SDPA backend:
    ``per_backend`` batches of new shapes each (their own, so no backend meets another's), stepped through
    once and then again, in ms per step. A length-bucketed run meets new (batch, length) shapes until its
    buckets have all been seen; cuDNN's attention builds an execution graph for each, forward and backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg, model, optimizer, dist = on_gpu(name)
    train_step(model, optimizer, [batches[-1].to(dist.device)], cfg.train.eps_ls, 1e-4, 0.0, dist, None,
               torch.bfloat16)  # the process's first step (cuBLAS, the allocator) in neither backend's time
    costs = {}
    for i, backend in enumerate(FIRST_SHAPE_BACKENDS):
        fresh = [b.to(dist.device) for b in batches[i * per_backend:(i + 1) * per_backend]]

        def pass_ms() -> float:
            torch.cuda.synchronize()
            start = time.perf_counter()
            for b in fresh:
                train_step(model, optimizer, [b], cfg.train.eps_ls, 1e-4, 0.0, dist, None, torch.bfloat16)
            torch.cuda.synchronize()
            return 1000 * (time.perf_counter() - start) / len(fresh)

        try:
            with sdpa_kernel([getattr(SDPBackend, backend)]):
                first, again = pass_ms(), pass_ms()
        except RuntimeError as e:  # a backend this card or these masks cannot take
            costs[backend.lower()] = {"error": str(e).strip().splitlines()[0][:200]}
            continue
        costs[backend.lower()] = {"batches": len(fresh), "first_ms": round(first, 1), "again_ms": round(again, 1),
                                  "per_new_shape_ms": round(first - again, 1)}
    del model, optimizer
    torch.cuda.empty_cache()
    print(json.dumps({"first_shape": costs}), flush=True)
    mark("first-shape cost measured")
    return costs


# issue 47's changes to the training step, with what each was predicted to save before a GPU measured it
PREDICTED = [
    ("33ac911", "the loss casts the [rows, V] gradient once for its two products, and its log-softmax reads bf16 "
     "logits directly.", "two [rows, V] casts fewer, ~11 GB less memory traffic, ~3-4 ms of a 57 ms step."),
    ("69dedb8", "one host synchronisation per step (the loss summed on the device, fused Adam skipping a "
     "non-finite step through found_inf).", "two host round trips fewer, ~1 ms where the host waits on the GPU."),
    ("13044b7", "the label-smoothed loss and its gradient in one Triton kernel per block of rows "
     "(transformer/fused_loss.py).", "~12 instead of ~42 bytes moved per logit, ~28 GB less traffic, ~9 ms."),
    ("d3d1403", "data.pad through numpy.", "none here: these batches are collated before timing (the trainer's "
     "own collation of a 25k-token batch fell from ~5.3 ms to ~1.2 ms of host work on this CPU)."),
    ("1166b78", "the target positions selected by indices made on the host (Batch.positions), not a boolean "
     "mask.", "two host waits fewer per batch, mid-step, where the GPU drained its queue while the host launched "
     "the loss and the backward; one compiled graph instead of two: ~1-3 ms of base's compiled step."),
    ("837caed", "the loss casts the [V, D] output weight to bf16 once per call, not once per block of rows.",
     "4 casts fewer at 25k tokens (4 blocks of logits): ~0.45 GB (base) and ~0.9 GB (big) less traffic, "
     "~0.1-0.3 ms, 4 launches."),
    ("b72b4cf", "the fused loss kernel's first pass accumulates per lane and combines the lanes once, not with "
     "three reductions across the program's warps in every iteration.", "on 2026-11-29 the kernel moved ~1.6 GB "
     "in 2.8 ms of base's step, ~0.6 TB/s: toward ~2 TB/s, ~1.5-2 ms less a step for base and for big."),
    ("f47d82d", "a post-norm model's residual stream in bf16 under autocast (LayerNorm returns bf16).",
     "the casts between the fp32 stream and the bf16 products go (~4.4 ms of base's eager step, ~8.6 ms of "
     "big's, by the 2026-11-29 sources), LayerNorm, the residual adds and dropout move half the bytes, ~120 "
     "small launches more (the gains and biases cast): eager ~5-7 ms of base's 50.9 and ~10-12 of big's 95.8; "
     "compiled ~2-3 ms of base's 46.5 and ~3-4 of big's 81.0; peak memory down."),
    ("015361d", "the trainer queues step k + 1 (its batches collated into pinned memory) before it reads step "
     "k's outcome.", "not in the before/after rows, whose loop is gpu.py's own (batches collated before timing): "
     "host_overlap's late_pinned against sync reads it, ~0.5-1.5 ms of base's compiled step and less of big's, "
     "where the GPU waits between steps for the host's copies, graph guards and first launches; in the trainer "
     "the collation too (~1.2 ms of host work per 25k-token batch on this CPU). Nothing where the holes lie "
     "between the kernels of a step."),
    ("eae2463", "the target positions selected after the compiled model, not inside its graph (so that a graph "
     "takes a batch's shape alone: train.shape_buckets, train.cuda_graphs).", "about nothing: an eager gather of "
     "the [B·T, D] decoder output and its backward's index_add, ~35 MB (base) and ~70 MB (big) more traffic, "
     "two launches, < 0.1 ms."),
    ("91bf512", "the fused loss kernel reads and writes 16 bytes per access (its PTX for sm_90 held only 2-byte "
     "loads and stores: V = 37,000 is no multiple of 16, so Triton took no row to be aligned).", "the kernel's "
     "~1.6 GB of base's step toward ~2-3 TB/s from ~0.6: ~1.5-2 ms a step for base and for big; not on top of "
     "b72b4cf's prediction: either may be what held the kernel at 0.6 TB/s (benchmarks/fused_loss.py's kernel_gb_s "
     "tells)."),
    ("e2bbbff", "clipping inside fused Adam's pass (its grad_scale divisor); without clipping (clip_norm 0, the "
     "paper's) no pass at all, where clip_grad_norm_ multiplied every gradient by 1.", "one read and write of the "
     "fp32 gradients fewer, 0.5 GB (base) and 1.7 GB (big): ~0.12-0.15 ms and ~0.4-0.45 ms a step in the "
     "profile's optimizer kernels, and a few launches; below the ~1.6% two visits' steps differ by."),
]


def curve_candidates(modes: str, batches: list, curve: list[float], name: str = "base",
                     device: str = "cuda") -> list[dict]:
    """``name``'s loss curve in each of ``modes`` against ``curve`` (this package's, bf16, the same run), each beside
    how far ``curve`` itself moves when only its dropout masks are drawn again: the floor for a change that draws
    them otherwise, as the candidate kernels do. A mode that fails is listed with its error; the rest go on."""
    floor = curve_floor(curve, loss_curve(name, "bf16", batches, len(curve), device, dropout_seed=1))
    out = []
    for mode in modes.split(","):
        try:
            out.append({"mode": mode, **compare_curves(curve, loss_curve(name, mode, batches, len(curve), device)),
                        "floor_dropout": floor})
        except Exception as e:  # noqa: BLE001 — reported in the results, with its traceback in the log
            traceback.print_exc()
            out.append({"mode": mode, "error": error_line(e)})
            if device == "cuda":
                torch.cuda.empty_cache()
        print(json.dumps({"curve": out[-1]}), flush=True)
    mark("candidate curves drawn")
    return out


def candidate_lines(candidates: list[dict]) -> list[str]:
    """The md's paragraph on ``curve_candidates``."""
    if not candidates:
        return []
    lines = ["", "Loss curves of the candidates against this package's bf16 path (base, one fixed run of copy "
             "batches, the same weights; issue 47's bound: the first 200 steps within 1e-2 relative), beside the "
             "bf16 run with its dropout masks drawn again (the floor for a change that draws them otherwise):", "",
             "| precision | steps | largest gap (step) | first step | mean | within the bound | dropout floor: "
             "largest (step), mean |", "|---|---|---|---|---|---|---|"]
    for c in candidates:
        if "error" in c:
            lines.append(f"| {c['mode']} | failed: {c['error']} | | | | | |")
            continue
        f = c["floor_dropout"]
        lines.append(f"| {c['mode']} | {c['steps']} | {c['max_rel_diff']:.2e} ({c['at_step']}) | "
                     f"{c['first_step_rel_diff']:.2e} | {c['mean_rel_diff']:.2e} | {'yes' if c['within'] else 'no'} | "
                     f"{f['max_rel_diff']:.2e} ({f['at_step']}), {f['mean_rel_diff']:.2e} |")
    return lines


def source_lines(profiles: list[dict], top: int = 6) -> list[str]:
    """The md's tables of where each profiled step's copies, elementwise kernels and matrix products come from
    (``kernel_sources``), the ``top`` costliest sources of each (twice as many products: one source each)."""
    lines = []
    for p in profiles:
        for kind, found in p.get("sources", {}).items():
            if not found:
                continue
            rate = kind == "matmul"  # each product's shapes are in its source; its multiply-adds' rate beside
            lines += ["", f"{p['model']} {p['mode']}: the {kind} kernels' sources ({SOURCE_STEPS} steps traced "
                      "with the host; file:line of the package, the operator; a backward kernel is charged to the "
                      "line of its forward operator" + ("; the products by their operands' shapes, each with "
                                                        "the rate of its multiply-adds" if rate else "") + "):", "",
                      "| source | ms per step | launches per step | " + ("TFLOP/s |" if rate else "costliest shape |"),
                      "|---|---|---|---|"]
            lines += [f"| {r['source']} | {r['ms_per_step']} | {r['launches_per_step']} | "
                      f"{r.get('tflop_s', '–') if rate else r['shape']} |" for r in found[:top * (1 + rate)]]
    return lines


def idle_lines(profiles: list[dict], top: int = 6) -> list[str]:
    """The md's tables of where each profiled step's GPU waits for the host (``idle_gaps``): who ended each
    wait, and what the host did inside the long ones."""
    lines = []
    for p in profiles:
        if not (idle := p.get("idle")):
            continue
        lines += ["", f"{p['model']} {p['mode']}: the GPU idle {idle['idle_ms_per_step']} ms per step "
                  f"({idle['gaps_per_step']} gaps, {idle['long_gaps_per_step']} of them over {LONG_GAP_US:g} µs "
                  f"holding {idle['idle_ms_per_step_in_long_gaps']} ms) of a traced span of "
                  f"{idle['span_ms_per_step']} ms ({idle['steps']} steps traced with the host's operators); "
                  f"the host queues a median {idle['queue_ms_median']} ms ahead of the GPU. By the operator that "
                  "queued the work after each gap:", "",
                  "| launched by | idle ms per step | gaps per step | longest (µs) |", "|---|---|---|---|"]
        lines += [f"| {r['launched_by']} | {r['ms_per_step']} | {r['gaps_per_step']} | {r['longest_us']} |"
                  for r in idle["by_launch"][:top]]
        if idle.get("host_in_long_gaps"):
            lines += ["", f"What the launching thread did inside the gaps over {LONG_GAP_US:g} µs, up to the launch "
                      "that ended each (operators traced without stacks; a CUDA call innermost, a synchronisation "
                      "among them):", "", "| the host | ms per step |", "|---|---|"]
            lines += [f"| {r['host']} | {r['ms_per_step']} |" for r in idle["host_in_long_gaps"][:top]]
    return lines


def measure_before(args) -> dict:
    """The same rows (not profiled: minutes a GPU visit lacks; in ``EARLIER_MODES`` alone) and the loss curves
    with the package in ``args.before``: this script again, in a process whose PYTHONPATH puts that package
    first, writing into a temporary folder."""
    argv, skip = [], False
    for a in sys.argv[1:]:
        if skip or a.startswith("--before="):
            skip = False
            continue
        skip = a == "--before"
        if not skip:
            argv.append(a)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(args.before.resolve()),
                                                        *filter(None, [os.environ.get("PYTHONPATH")])])}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv, "--rows-only", "--profile", "",
                        "--first-shape", "0", "--modes", ",".join(args.earlier_modes), "--results", tmp],
                       env=env, check=True)
        measured = json.loads((Path(tmp) / f"{args.name}.json").read_text())
    return {"package": str(args.before), **measured}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per model and precision")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (torch.compile: more)")
    parser.add_argument("--tokens", type=int, default=25_000, help="tokens per side per step (paper: ~25k)")
    parser.add_argument("--models", default="base,big")
    parser.add_argument("--modes", default=",".join(MODES))
    add_results_option(parser, "NAME.json / .md")
    parser.add_argument("--name", default="gpu_train", help="the result files' name (gpu_visit.sh: one per model)")
    parser.add_argument("--first-shape", type=int, default=8,
                        help="batches of new shapes per attention backend for first_shape_cost (0: none)")
    parser.add_argument("--accumulate", type=int, default=8,
                        help="also each model in bf16 with a step's tokens split into this many micro-batches "
                             "(the WMT recipes' update_freq on one device; 1: no such rows)")
    parser.add_argument("--profile", help="precisions among --modes whose steps are also profiled by kernel kind "
                        "('' for none; default: bf16, bf16+compile, bf16+tuned, bf16+kernel, "
                        "bf16+compile+kernel and the +efficient ones, where --modes has them)")
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--before", type=Path, help="folder holding an earlier transformer/ package, measured first")
    parser.add_argument("--curve", type=int, default=200,
                        help="steps of base's bf16 loss curve on copy batches, compared with --before's (0: none)")
    parser.add_argument("--curve-modes", default="",
                        help="precisions whose loss curve (--curve steps) is also drawn in this run and compared "
                             "with this package's bf16 curve, beside the same run with its dropout masks drawn "
                             "again (the candidate kernels draw theirs otherwise), e.g. bf16+compile+kernel+efficient")
    parser.add_argument("--rows-only", action="store_true", help=argparse.SUPPRESS)  # --before's own process
    args = parser.parse_args()
    for option, values in (("--modes", args.modes), ("--profile", args.profile or ""),
                           ("--curve-modes", args.curve_modes)):
        if unknown := [m for m in filter(None, values.split(",")) if m not in MODES]:
            parser.error(f"{option}: unknown precision {', '.join(unknown)} (known: {', '.join(MODES)})")
    modes = args.modes.split(",")
    if args.profile is None:
        args.profile = ",".join(m for m in dict.fromkeys(("bf16", "bf16+compile", "bf16+tuned", *KERNEL_MODES,
                                                          *EFFICIENT_MODES, *EPILOGUE_MODES)) if m in modes)
    elif unmeasured := [m for m in filter(None, args.profile.split(",")) if m not in modes]:
        parser.error(f"--profile {args.profile}: {', '.join(unmeasured)} not among --modes {args.modes} "
                     "(a profile runs on a measured row's model)")
    if args.curve_modes and args.curve < 1:
        parser.error(f"--curve-modes {args.curve_modes}: needs --curve STEPS (the curves' length), not {args.curve}")
    if args.accumulate < 1:
        parser.error(f"--accumulate {args.accumulate}: must be at least 1 (1: no micro-batch rows)")
    # the batches, and where the results go, before minutes of measuring
    sentences = 16 * args.tokens // 27  # about 16 batches' worth
    batches, src_len, tgt_len = synthetic_batches(args.tokens, sentences)
    # the micro-batch rows cycle through the shapes their warm-up meets, as the one-batch rows do: what a new
    # shape costs is first_shape_cost's to measure, on shapes no row met
    small = synthetic_batches(args.tokens // args.accumulate, sentences)[0] if args.accumulate > 1 else []
    small = small[:args.accumulate * max(args.warmup, 1)]
    met = {shape(b) for b in small}
    fresh = [b for b in synthetic_batches(args.tokens // 8, sentences, seed=1)[0]
             if shape(b) not in met] if args.first_shape else []
    if not batches or (args.accumulate > 1 and not small):
        parser.error(f"--tokens {args.tokens} --accumulate {args.accumulate}: no batch of "
                     f"{args.tokens // args.accumulate if args.accumulate > 1 and batches else args.tokens} tokens "
                     "comes out full of these sentences (10 to 45 tokens; a batch is kept over 90% full)")
    if args.first_shape < 0 or args.first_shape and len(fresh) < len(FIRST_SHAPE_BACKENDS) * args.first_shape + 1:
        parser.error(f"--first-shape {args.first_shape}: {len(fresh)} batches of new shapes come out of "
                     f"--tokens {args.tokens} (each backend takes its own, and one more warms up; 0: none)")
    results_folder(parser, args.results)
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA GPU")
    args.earlier_modes = [m for m in modes if m in EARLIER_MODES]
    before = measure_before(args) if args.before and args.earlier_modes else None
    print(f"{len(batches)} batches; mean lengths {src_len:.1f} / {tgt_len:.1f}", flush=True)
    failed: list[dict] = []

    def attempt(name: str, mode: str, *rest, **options):
        """``measure``, or None where the row fails: its error printed and listed, and the visit's minutes go
        on to the next row (a mode this card, driver or torch cannot run need not cost the rest)."""
        try:
            return measure(name, mode, *rest, **options)
        except Exception as e:  # noqa: BLE001 — reported in the results, with its traceback in the log
            traceback.print_exc()
            failed.append({"model": name, "mode": row_mode(mode, options.get("micro", 1)), "error": error_line(e)})
            print(json.dumps(failed[-1]), flush=True)
            torch.cuda.empty_cache()
            return None

    measured = [attempt(name, mode, batches, args.steps, args.warmup + (10 if MODES[mode][1] else 0), src_len,
                        tgt_len, profile=args.profile_steps if mode in args.profile.split(",") else 0)
                for name in args.models.split(",") for mode in args.modes.split(",")]
    if args.accumulate > 1:
        measured += [attempt(name, "bf16", small, args.steps, args.warmup, src_len, tgt_len, micro=args.accumulate)
                     for name in args.models.split(",")]
    measured = [m for m in measured if m is not None]
    rows = [row for row, _ in measured]
    profiles = [profiled for _, profiled in measured if profiled]
    copies = synthetic_batches(args.tokens, sentences, copy=True)[0]
    curve = loss_curve("base", "bf16", copies, args.curve) if args.curve else None
    if args.rows_only:
        nudged = loss_curve("base", "bf16", copies, args.curve, nudge=NUDGE) if args.curve else None
        redrawn = loss_curve("base", "bf16", copies, args.curve, dropout_seed=1) if args.curve else None
        mark("loss curves drawn")
        write_result(args.results, args.name, {"rows": rows, "failed_rows": failed, "curve": curve,
                                               "curve_nudged": nudged, "curve_redrawn": redrawn})
        return
    candidates = curve_candidates(args.curve_modes, copies, curve) if args.curve_modes else []
    first_shape = first_shape_cost(fresh, args.first_shape) if args.first_shape else {}
    kernels = attention_kernels(batches[0])
    overflow = fp16_overflow_is_skipped(batches[0])
    print(json.dumps({"attention_kernels": kernels, "fp16_overflow": overflow}, indent=1), flush=True)
    estimate = {name: round(1000 * training_cost(load_config(name, [f"train.max_tokens={args.tokens}",
                                                                      "train.update_freq=1"]), VOCAB)
                            .step_seconds(1), 1) for name in args.models.split(",")}
    result = {"date": datetime.date.today().isoformat(), **code_state(), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
              "command": "python " + " ".join(sys.argv), "vocab": VOCAB, "tokens_per_step": args.tokens,
              "mean_src_len": round(src_len, 1), "mean_tgt_len": round(tgt_len, 1),
              "peak_flops_bf16": H100_BF16_FLOPS, "docs_scaling_step_ms_at_mfu_0.4": estimate,
              "rows": rows, "failed_rows": failed, "profiles": profiles, "curve_candidates": candidates,
              "first_shape": first_shape,
              "attention_kernels": kernels, "fp16_overflow": overflow}
    if before:
        after = {(r["model"], r["mode"]): r for r in rows}
        both = [(r, after[(r["model"], r["mode"])]) for r in before["rows"] if (r["model"], r["mode"]) in after]
        result["before"] = before | {"speedup": {f"{r['model']} {r['mode']}": round(r["step_ms"] / a["step_ms"], 3)
                                                 for r, a in both}}
        if curve and before.get("curve"):  # each floor: how far the earlier package's own curve moves
            result["curve"] = {"model": "base", "mode": "bf16", "batches": "copy"} | compare_curves(
                before["curve"], curve) | {"after": curve,
                                           "floor": {"nudge": NUDGE, **curve_floor(before["curve"],
                                                                                   before["curve_nudged"])},
                                           "floor_dropout": curve_floor(before["curve"], before["curve_redrawn"])}
    write_result(args.results, args.name, result)  # before the page: a page's slip must not lose the reading
    lines = [f"# GPU training throughput ({result['gpu']})", "",
             f"`{result['command']}` — {result['date']}, {commit_text(result)}, torch {result['torch']} "
             f"(CUDA {result['cuda']}), Python {result['python']}.", "",
             f"Synthetic WMT-shaped batches: ~{args.tokens:,} tokens per side per step, V = {VOCAB:,}, mean "
             f"lengths {src_len:.1f} / {tgt_len:.1f}; one optimizer step per batch through `train_step`"
             + (f"; a ×{args.accumulate} row takes the step's tokens as {args.accumulate} micro-batches of "
                f"~{args.tokens // args.accumulate:,} (the WMT recipes' layout on one device: update_freq "
                f"{args.accumulate}), cycling through the {len(small)} shapes its warm-up meets"
                if args.accumulate > 1 else "") + ". "
             "MFU = the model's matmul FLOPs per second / the dense bf16 peak "
             f"({H100_BF16_FLOPS / 1e12:.0f} TFLOPS).", "",
             "| model | precision | step (ms) | target tokens/s | model TFLOP/s | MFU | peak memory (GiB) | "
             "cudaMalloc / cudaFree / retries a step |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['mode']} | {r['step_ms']} | {r['tgt_tokens_per_s']:,} | {r['model_tflops']} | "
              f"{100 * r['mfu']:.1f}% | {r['peak_memory_gib']} | {allocator_text(r)} |" for r in rows]
    lines += [f"| {f['model']} | {f['mode']} | failed: {f['error']} | | | | | |" for f in failed]
    if overlaps := [r for r in rows if "host_overlap" in r]:
        o = overlaps[0]["host_overlap"]
        lines += ["", "Reading a step's outcome late (`host_overlap`, the row's own model after its timed steps): "
                  f"{o['rounds']} rounds of blocks of {o['steps']} steps, ms per step (median round). At once: each "
                  "step's outcome read before the next is queued (the trainer before 2026-12-01); late: read after "
                  "the next step is queued (`queue_step`), so the host launches step i + 1 while the GPU runs step "
                  "i; pinned: the same with the batches copied from page-locked memory, as the trainer now runs; "
                  "host: the host's own time queueing a step that way, the waits for outcomes left out (near the "
                  "step's time, the host bounds it).", "",
                  "| model | precision | at once | late | late, pinned | gain (pinned, the trainer's) | host |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['mode']} | {h['sync_ms']} | {h['late_ms']} | {h['late_pinned_ms']} | "
                  f"{round(h['sync_ms'] - h['late_pinned_ms'], 2)} ms | "
                  f"{h.get('host_queue_ms', '–')} |" for r in overlaps for h in [r["host_overlap"]]]
    if before:
        lines += ["", "The changes since the issue-47 baseline (a362aed), each with the gain predicted before a GPU "
                  "measured it (H100-class card; the first six measured together on 2026-11-29, "
                  "benchmarks/results/gpu_visit_2026-11-29/); the table below measures them all together:", ""]
        lines += [f"- {commit}: {what} Predicted: {gain}" for commit, what, gain in PREDICTED]
        lines += ["", f"Before (`{before['package']}`, measured first in its own process on the same card):", "",
                  "| model | precision | step (ms) before | after | speed-up | MFU before | after | peak memory "
                  "(GiB) before | after |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r, a in both:
            lines.append(f"| {r['model']} | {r['mode']} | {r['step_ms']} | {a['step_ms']} | "
                         f"{result['before']['speedup'][r['model'] + ' ' + r['mode']]}× | {100 * r['mfu']:.1f}% | "
                         f"{100 * a['mfu']:.1f}% | {r['peak_memory_gib']} | {a['peak_memory_gib']} |")
        if "curve" in result:
            c = result["curve"]
            lines += ["", f"Loss curve kept: base in bf16, the first {c['steps']} steps of one fixed run (seed 0, "
                      "copy batches, the rate rising to base's peak) with both packages: largest gap "
                      f"{c['max_rel_diff']:.2e} relative (step {c['at_step']}), first step "
                      f"{c['first_step_rel_diff']:.2e}, mean {c['mean_rel_diff']:.2e}; loss "
                      f"{c['loss_first'][1]:.3f} → {c['loss_last'][1]:.3f}; "
                      f"{'within' if c['within'] else 'NOT within'} the issue's {c['bound']:g}. "
                      "The floor: the earlier package's own run with every initial weight × (1 + "
                      f"{c['floor']['nudge']:.2e}), a change of rounding alone, moves its curve by up to "
                      f"{c['floor']['max_rel_diff']:.2e} (step {c['floor']['at_step']}), mean "
                      f"{c['floor']['mean_rel_diff']:.2e}."]
            d = c["floor_dropout"]
            lines[-1] += (f" Its run with the same weights and other dropout masks (the generators reseeded): "
                          f"up to {d['max_rel_diff']:.2e} (step {d['at_step']}), mean {d['mean_rel_diff']:.2e}.")
    lines += candidate_lines(candidates)
    if profiles:
        kinds = sorted({k for p in profiles for k in p["kernel_ms_per_step"]},
                       key=lambda k: -max(p["kernel_ms_per_step"].get(k, 0.0) for p in profiles))
        lines += ["", f"Where a step's time goes (torch.profiler, {args.profile_steps} steps, GPU kernels only): "
                  "kernel milliseconds per step by kind; busy = kernel time over the unprofiled step time.", "",
                  "| model | precision | step (ms) | GPU busy | kernels per step | " + " | ".join(kinds) + " |",
                  "|---|---|---|---|---|" + "---|" * len(kinds)]
        lines += [f"| {p['model']} | {p['mode']} | {p['step_ms']} | {100 * p['gpu_busy']:.0f}% | "
                  f"{p['kernels_per_step']:,} | " + " | ".join(str(p["kernel_ms_per_step"].get(k, 0.0)) for k in kinds)
                  + " |" for p in profiles]
    lines += source_lines(profiles) + idle_lines(profiles)
    if first_shape:
        lines += ["", "A batch of a shape not met before, base in bf16, per attention backend (`first_shape_cost`): "
                  "ms per step the first time and again.", "", "| backend | batches | first | again | per new shape |",
                  "|---|---|---|---|---|"]
        lines += [f"| {name} | {c['batches']} | {c['first_ms']} | {c['again_ms']} | {c['per_new_shape_ms']} |"
                  if "error" not in c else f"| {name} | refused: {c['error']} | | | |"
                  for name, c in first_shape.items()]
    lines += ["", f"docs/scaling.md's estimate at MFU 40%: {estimate} ms per step.", "",
              f"Attention kernels in a bf16 step: {', '.join(kernels) or 'none found'}.", "",
              f"fp16 overflow check (loss scale 2^40): {json.dumps(overflow)}.", ""]
    write_whole(args.results / f"{args.name}.md", "\n".join(lines))


if __name__ == "__main__":
    main()
