"""The post-norm junction alone, forward and backward, compiled as the trainer compiles it and in other
ways (issue 47).

    python benchmarks/gpu_layernorm.py [--rows 24992] [--models base,big]

LayerNorm(x + Dropout(s)) (§3.1, §5.4): the package's own ``model.residual`` in bf16, on [rows, d_model]
(gpu.py's batches hold ~25,000 positions), its output's gradient given. The costliest single kernel of base's
compiled step in the 2026-12-04 profile (benchmarks/results/gpu_visit_2026-12-04/) was the one Inductor
generates for this junction's backward. Timed per way (``WAYS``): eager operators; torch.compile as the
trainer compiles (shape-generic); the same with Inductor's coordinate-descent tuning of the kernels it
generates (gpu.py's ``TUNED``); with static shapes; static and tuned; and the candidate kernels written by
hand (postnorm_kernel.py: one forward, one backward), eager and compiled. Each way's kernel time (the
profiler's, all its kernels: a lone junction's call can be bound by the host's launches, as a training step
whose GPU is busy is not) is read as an effective rate: the bytes a junction must move at least (x and s read
and y written forward; the gradient, x and s read and the gradients of x and s written backward:
``BYTES_PER_ELEMENT`` in bf16; dropout's mask, a bool an element for the operators and a bit for the
kernels, left out) over the time, beside a copy's rate on the same card; the call's time, launches
included, is kept too. It tells in a minute of a GPU visit whether tuning, static shapes or the hand-written
kernels would pay. In the model the backward also sums the gradients
that the junction's output receives from the next sub-layer and the next junction; here it receives one.

Writes benchmarks/results/gpu_layernorm.json and .md. ``--device cpu`` runs the glue on small shapes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import traceback
from pathlib import Path

import torch
import torch._inductor.config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import TUNED, cuda_kernels, error_line, kernel_summary  # noqa: E402  (benchmarks/ is no package)
from gpu_attention import add_common_arguments, checked, timed  # noqa: E402
from provenance import code_state, commit_text, write_result, write_whole  # noqa: E402

from transformer.model import Dropout, residual  # noqa: E402

# way -> (through postnorm_kernel.py's kernels, else model.residual's operators; None: eager, else
# torch.compile's (dynamic, Inductor's options))
WAYS = {"eager": (False, None), "compiled": (False, (True, {})), "compiled+tuned": (False, (True, TUNED)),
        "static": (False, (False, {})), "static+tuned": (False, (False, TUNED)), "kernel": (True, None),
        "compiled+kernel": (True, (True, {}))}
BYTES_PER_ELEMENT = 16  # bf16: forward x, s, y; backward dy, x, s, dx, ds (2 bytes each)


def junction(d_model: int, eps: float, p: float, device: torch.device, kernel: bool = False):
    """The junction as a post-norm layer runs it in bf16 under autocast: ``f(x, s)`` =
    LayerNorm(x + Dropout(s)), and the LayerNorm's parameters (fp32, as the model keeps them); with
    ``kernel``, through the candidate kernels of postnorm_kernel.py instead (imported here: Triton's
    interpreter must be chosen before, where the tests run them on the CPU)."""
    norm = torch.nn.LayerNorm(d_model, eps=eps, device=device)
    if kernel:
        from postnorm_kernel import post_norm

        return (lambda x, s: post_norm(x, s, norm, p, True)), list(norm.parameters())
    drop = Dropout(p)
    return (lambda x, s: residual(x, norm, drop, False, lambda _: s)), list(norm.parameters())


def measure_way(way: str, d_model: int, eps: float, p: float, rows: int, repeat: int,
                device: torch.device) -> dict:
    """One way's forward and backward: median ms of a call (the host's launches included: at one junction's
    size a call can be bound by them), and on a GPU its kernels' time per call and the effective rate of
    that time, the junction's own cost inside a step whose GPU is kept busy."""
    kernel, compiling = WAYS[way]
    f, params = junction(d_model, eps, p, device, kernel=kernel)
    g = torch.Generator(device=device).manual_seed(0)
    x, s, dy = (torch.randn(rows, d_model, device=device, generator=g).bfloat16() for _ in range(3))
    x.requires_grad_(), s.requires_grad_()
    torch._dynamo.reset()  # each way compiles its own graphs
    with torch._inductor.config.patch(compiling[1] if compiling else {}):
        fn = torch.compile(f, dynamic=compiling[0]) if compiling else f

        def step() -> tuple[torch.Tensor, ...]:
            return torch.autograd.grad(fn(x, s), (x, s, *params), dy)

        ms = timed(step, repeat, device)  # the first calls, untimed, compile
        kernels = profiled(step, device)
    nbytes = BYTES_PER_ELEMENT * rows * d_model
    row = {"ms": round(ms, 3), "effective_gb_s": round(nbytes / ms / 1e6, 1), **kernels}
    if "kernel_us" in row:
        row["kernel_gb_s"] = round(nbytes / row["kernel_us"] / 1e3, 1)
    if kernel:  # a fast kernel counts only if it computes the junction on this card
        row["agreement"] = kernel_agreement(d_model, eps, rows, device, compiled=compiling is not None)
    return row


def kernel_agreement(d_model: int, eps: float, rows: int, device: torch.device, compiled: bool = False) -> dict:
    """The hand-written kernels (``compiled``: launched by a compiled graph) against the operators
    (``model.residual``) without dropout, on one bf16 input and one gain and bias not 1 and 0: each of y, dx,
    ds, dw, db as its largest difference over its largest magnitude (bf16 keeps 8 bits: ~4e-3 a rounding)."""
    g = torch.Generator(device=device).manual_seed(1)
    x, s, dy = (torch.randn(rows, d_model, device=device, generator=g).bfloat16() for _ in range(3))
    x.requires_grad_(), s.requires_grad_()
    gain, bias = 1 + 0.1 * torch.randn(d_model, device=device, generator=g), torch.randn(d_model, device=device,
                                                                                          generator=g)
    outputs = []
    for kernel in (False, True):
        f, params = junction(d_model, eps, 0.0, device, kernel=kernel)
        if kernel and compiled:
            torch._dynamo.reset()
            f = torch.compile(f, dynamic=True)
        with torch.no_grad():
            params[0].copy_(gain), params[1].copy_(bias)
        y = f(x, s)
        outputs.append([y, *torch.autograd.grad(y, (x, s, *params), dy)])
    return {name: round(float((got - want).detach().float().abs().max() / want.detach().float().abs().max()), 5)
            for name, want, got in zip(("y", "dx", "ds", "dw", "db"), *outputs)}


def profiled(step, device: torch.device, calls: int = 3) -> dict:
    """The kernels' time per call (µs, all of them), kernels per call and each kernel's µs and launches per
    call, costliest first; nothing on a CPU."""
    if device.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    kernels = sorted(cuda_kernels(prof), key=lambda k: -k[1])
    return {"kernel_us": round(sum(us for _, us, _ in kernels) / calls, 1),
            "kernels_per_call": kernel_summary(kernels, calls, 0.0)["kernels_per_step"],
            "kernels": [{"name": name[:120], "us": round(us / calls, 1), "launches": round(n / calls, 1)}
                        for name, us, n in kernels]}


def copy_rate(device: torch.device, repeat: int, nbytes: int = 2**30) -> float:
    """GB/s of a device-to-device copy of ``nbytes`` (read and written): the card's practical ceiling."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    return round(2 * nbytes / timed(lambda: dst.copy_(src), repeat, device) / 1e6)


def report(result: dict, path: Path) -> None:
    """The md beside the JSON: per model, a row per way."""
    lines = [f"# The post-norm junction alone ({result['device_name']})", "",
             f"`{result['command']}` — {result['date']}, {commit_text(result)}, torch {result['torch']}.", "",
             f"LayerNorm(x + Dropout(s)) forward and backward in bf16 on [{result['rows']:,}, d_model], as "
             f"`model.residual` computes it. ms: a call's time, the host's launches included (at one junction's "
             f"size a call can be bound by them); kernel µs: its kernels' time, the junction's own cost in a step "
             f"whose GPU is kept busy; the rates: {BYTES_PER_ELEMENT} bytes an element (what the junction must "
             f"move at least) over each, beside a copy's {result['copy_gb_s']:,} GB/s here.", "",
             "| model | way | ms | GB/s | kernel µs | kernel GB/s | share of a copy | kernels per call | costliest "
             "kernels (µs per call) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, ways in result["models"].items():
        for way, r in ways.items():
            if "error" in r:
                lines.append(f"| {name} | {way} | failed: {r['error']} | | | | | | |")
                continue
            costliest = ", ".join(f"`{k['name'][:50]}` ({k['us']})" for k in r.get("kernels", [])[:2]) or "–"
            share = f"{r['kernel_gb_s'] / result['copy_gb_s']:.0%}" if "kernel_gb_s" in r else "–"
            lines.append(f"| {name} | {way} | {r['ms']} | {r['effective_gb_s']:,} | {r.get('kernel_us', '–')} | "
                         f"{r.get('kernel_gb_s', '–')} | {share} | {r.get('kernels_per_call', '–')} | "
                         f"{costliest} |")
    for name, ways in result["models"].items():
        for way, r in ways.items():
            if agreement := r.get("agreement"):
                lines += ["", f"{name}, {way}: the kernels against the operators without dropout (largest difference "
                          "over largest magnitude, bf16): " + ", ".join(f"{k} {v:.1e}" for k, v in agreement.items())
                          + "."]
    write_whole(path, "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=568 * 44, help="positions (gpu.py's batches: 568 × 44)")
    parser.add_argument("--ways", default=",".join(WAYS), help="comma-separated, among " + ", ".join(WAYS))
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per way (the median is kept)")
    add_common_arguments(parser)
    args = parser.parse_args()
    if unknown := [w for w in args.ways.split(",") if w not in WAYS]:
        parser.error(f"--ways: unknown {', '.join(unknown)} (known: {', '.join(WAYS)})")
    for option, value in (("--rows", args.rows), ("--repeat", args.repeat)):
        if value < 1:
            parser.error(f"{option} {value}: must be at least 1")
    device, configs = checked(parser, args)
    result = {"date": datetime.date.today().isoformat(), **code_state(), "command": "python " + " ".join(sys.argv),
              "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "rows": args.rows, "bytes_per_element": BYTES_PER_ELEMENT,
              "copy_gb_s": copy_rate(device, args.repeat, 2**30 if device.type == "cuda" else 2**24), "models": {}}
    for name, cfg in zip(args.models.split(","), configs):
        result["models"][name] = {}
        for way in args.ways.split(","):
            try:
                r = measure_way(way, cfg.model.d_model, cfg.model.ln_eps, cfg.model.p_drop, args.rows, args.repeat,
                                device)
            except Exception as e:  # noqa: BLE001 — a way that fails is a finding (its traceback in the log)
                traceback.print_exc()
                r = {"error": error_line(e)}
            result["models"][name][way] = r
            print(json.dumps({name: {way: r}}), flush=True)
    write_result(args.results, "gpu_layernorm", result)
    report(result, args.results / "gpu_layernorm.md")


if __name__ == "__main__":
    main()
