"""Attention alone in a training step of base and big, per kernel PyTorch offers (issue 47).

    python benchmarks/gpu_attention.py [--tokens 25000] [--repeat 10] [--models base,big]

The 2026-11-29 profile put attention at 5.3 ms of base's compiled step and 11.0 ms of big's (cuDNN's
fused kernels, forward and backward), three to four times what reading and writing its tensors once at
the card's bandwidth would take: at WMT's lengths (~27 pieces) a head's product is tiny and a kernel's
tiles are mostly padding of the tile. Before changing the model's attention, this measures what each
way of computing the same attention costs on the batches ``gpu.py`` trains on (the same synthetic,
length-bucketed batches of --tokens tokens per side): for each of a layer's three attention sites
(encoder self-attention and cross-attention under the key-padding mask, decoder self-attention causal),
forward and backward, q, k and v laid out as the model's fused projections leave them (views of one
[B, L, 3·D] or [B, L, 2·D] product), in bf16:

- ``cudnn``, ``efficient``, ``math``: ``F.scaled_dot_product_attention`` held to one backend (what the
  model's ``attention`` calls on a GPU; the trainer lets PyTorch choose, and it chose cuDNN's).
- ``flash``: FlashAttention-2; it takes no mask, so on the masked sites it runs without one: not the same
  attention, the time padding masks would cost nothing (a bound, marked in the tables).
- ``varlen``: FlashAttention-2 on the real tokens alone, packed (``torch.nn.attention.varlen``): the same
  attention with no padding at all; its time leaves out packing (a model that runs packed packs once).

Per site and way: milliseconds per call (CUDA events, median of --repeat after a warm-up), times the
model's layers per step; and the largest difference of its outputs at real positions from ``math``'s.
Writes benchmarks/results/gpu_attention.json and .md. ``--device cpu`` runs the same glue on the CPU
(small shapes; the fused kernels refuse, and say so in the results): the tests use it.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fused_loss import event_times  # noqa: E402  (benchmarks/ is no package)
from gpu import synthetic_batches  # noqa: E402
from provenance import (add_results_option, code_state, commit_text, results_folder, write_result,  # noqa: E402
                        write_whole)

from transformer.config import Config, load_config  # noqa: E402
from transformer.errors import UserError  # noqa: E402
from transformer.model import padding_mask  # noqa: E402
from transformer.tokenizer import PAD_ID  # noqa: E402

SITES = ("enc_self", "dec_self", "cross")
WAYS = ("cudnn", "efficient", "flash", "math", "varlen")
BACKENDS = {"cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "flash": "FLASH_ATTENTION",
            "math": "MATH"}
INEXACT = {("flash", "enc_self"), ("flash", "cross")}  # run without the padding mask: a bound, not the attention


def timed(fn, repeat: int, device: torch.device) -> float:
    """Median milliseconds of ``fn()`` over ``repeat`` calls after two untimed ones (CUDA events on a GPU)."""
    fn(), fn()
    if device.type == "cuda":
        return statistics.median(event_times(fn, repeat))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def site_inputs(site: str, batch, heads: int, d_k: int, device: torch.device, generator: torch.Generator):
    """The site's leaves (the fused projections' outputs, [B, L, 3·D] or [B, L, D] and [B, L, 2·D], bf16), a
    function making q, k, v [B, H, L, d_k] of them as the model does (views, made anew in each step as in
    training), the key-padding mask or None, is_causal, and the real lengths of queries and keys."""
    src, tgt = batch.src.to(device), batch.tgt_in.to(device)
    src_len, tgt_len = (src != PAD_ID).sum(1), (tgt != PAD_ID).sum(1)
    d = heads * d_k

    def leaf(length: int, parts: int) -> torch.Tensor:
        return torch.randn(src.size(0), length, parts * d, device=device, generator=generator,
                           dtype=torch.bfloat16).requires_grad_()

    def heads_of(x: torch.Tensor) -> list[torch.Tensor]:
        return [p.unflatten(-1, (heads, d_k)).transpose(1, 2) for p in x.split(d, -1)]

    if site == "cross":
        leaves = (leaf(tgt.size(1), 1), leaf(src.size(1), 2))
        return leaves, lambda: (*heads_of(leaves[0]), *heads_of(leaves[1])), padding_mask(src), False, tgt_len, src_len
    tokens, lengths = (src, src_len) if site == "enc_self" else (tgt, tgt_len)
    leaves = (leaf(tokens.size(1), 3),)
    mask, causal = (padding_mask(tokens), False) if site == "enc_self" else (None, True)
    return leaves, lambda: heads_of(leaves[0]), mask, causal, lengths, lengths


def packed(t: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[B, H, L, d] -> [Σ lengths, H, d]: each row's first ``lengths[b]`` positions, one after another."""
    keep = torch.arange(t.size(2), device=t.device)[None, :] < lengths[:, None]  # [B, L]
    return t.transpose(1, 2)[keep]


def way_call(way: str, leaves: tuple, views, mask, causal: bool, q_len, k_len):
    """The leaves a backward reaches, a function computing the site's attention the ``way`` named, and one
    taking its output to the rows of real positions [N, H, d]."""
    if way == "varlen":
        from torch.nn.attention.varlen import varlen_attn

        cu_q = F.pad(q_len.cumsum(0), (1, 0)).to(torch.int32)
        cu_k = F.pad(k_len.cumsum(0), (1, 0)).to(torch.int32)
        q, k, v = (t.detach() for t in views())
        pq, pk, pv = (packed(t, n).requires_grad_() for t, n in ((q, q_len), (k, k_len), (v, k_len)))
        max_q, max_k = int(q_len.max()), int(k_len.max())
        options = ({"window_size": (-1, 0) if causal else (-1, -1)}
                   if "window_size" in inspect.signature(varlen_attn).parameters else {"is_causal": causal})
        return (pq, pk, pv), lambda: varlen_attn(pq, pk, pv, cu_q, cu_k, max_q, max_k, **options), lambda out: out
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, BACKENDS[way])
    attn_mask = None if way == "flash" else mask

    def call() -> torch.Tensor:
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(*views(), attn_mask=attn_mask, is_causal=causal)
    return leaves, call, lambda out: packed(out, q_len)


def measure_site(site: str, batch, heads: int, d_k: int, repeat: int, device: torch.device) -> dict:
    """Every way's forward + backward milliseconds at one site of one batch, and its distance from ``math``."""
    generator = torch.Generator(device=device).manual_seed(0)
    leaves, views, mask, causal, q_len, k_len = site_inputs(site, batch, heads, d_k, device, generator)
    found, reference = {}, None
    for way in ("math", *[w for w in WAYS if w != "math"]):
        try:
            reached, call, real = way_call(way, leaves, views, mask, causal, q_len, k_len)
            out = call()
            grad = torch.ones_like(out)

            def step() -> None:
                for leaf in reached:
                    leaf.grad = None
                call().backward(grad)
            ms = timed(step, repeat, device)
        except (RuntimeError, ImportError, NotImplementedError) as e:  # a kernel this device or build lacks
            found[way] = {"error": f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"}
            continue
        rows = real(out.detach()).float()
        if reference is None:
            reference = rows
        found[way] = {"ms": round(ms, 4), "max_abs_diff_vs_math": round(float((rows - reference).abs().max()), 5)}
    return found


def measure_model(cfg: Config, batches: list, repeat: int, device: torch.device) -> dict:
    """Per site and way: ms per call (mean over the batches), ms per training step (× layers with that site)."""
    m = cfg.model
    heads, d_k = m.n_heads, m.head_dims[0]
    calls = {"enc_self": m.n_enc_layers, "dec_self": m.n_dec_layers, "cross": m.n_dec_layers}
    sites = {}
    for site in SITES:
        per_batch = [measure_site(site, b, heads, d_k, repeat, device) for b in batches]
        sites[site] = {}
        for way in WAYS:
            runs = [r[way] for r in per_batch]
            if errors := [r["error"] for r in runs if "error" in r]:
                sites[site][way] = {"error": errors[0]}
                continue
            ms = statistics.mean(r["ms"] for r in runs)
            sites[site][way] = {"ms_per_call": round(ms, 4), "ms_per_step": round(ms * calls[site], 3),
                                "max_abs_diff_vs_math": max(r["max_abs_diff_vs_math"] for r in runs),
                                **({"exact": False} if (way, site) in INEXACT else {})}
    per_step = {way: round(sum(sites[s][way]["ms_per_step"] for s in SITES), 3) for way in WAYS
                if all("ms_per_step" in sites[s][way] for s in SITES)}
    exact = {site: {way: c["ms_per_step"] for way, c in sites[site].items() if "ms_per_step" in c
                    and c.get("exact") is not False} for site in SITES}
    best = {site: min(ways, key=ways.get) for site, ways in exact.items() if ways}
    return {"heads": heads, "d_k": d_k, "calls_per_step": calls,
            "best_exact": best, "best_exact_ms_per_step": round(sum(exact[s][w] for s, w in best.items()), 3),
            "batches": [[int(n) for n in (*b.src.shape, b.tgt_in.shape[1])] for b in batches],
            "sites": sites, "ms_per_step": per_step}


def report(result: dict, path: Path) -> None:
    """The md beside the JSON: per model, a row per way, ms per step at each site and in all."""
    lines = [f"# Attention alone, per kernel ({result['device_name']})", "",
             f"`{result['command']}` — {result['date']}, {commit_text(result)}, torch {result['torch']}.", "",
             f"Forward and backward of a training step's attention, bf16, on {result['batches']} "
             f"of gpu.py's synthetic batches (~{result['tokens']:,} tokens per side); ms per step = ms per call × "
             "the layers with that site. `flash` on the masked sites runs without the mask (marked *): a bound, "
             "not the attention. `varlen` is FlashAttention on the real tokens alone, packing not counted.", ""]
    for name, m in result["models"].items():
        lines += [f"## {name} (h = {m['heads']}, d_k = {m['d_k']}; batches {m['batches']})", "",
                  "| way | encoder self | decoder self (causal) | cross | per step (ms) | cudnn ÷ this "
                  "| max \\|Δ\\| vs math (exact sites) |",
                  "|---|---|---|---|---|---|---|"]
        refusals = {}
        for way in WAYS:
            cells = []
            for site in SITES:
                c = m["sites"][site][way]
                if "error" in c:
                    refusals.setdefault(way, c["error"])
                mark = "*" if c.get("exact") is False else ""
                cells.append("refused" if "error" in c else f"{c['ms_per_step']}{mark}")
            total, cudnn = m["ms_per_step"].get(way), m["ms_per_step"].get("cudnn")
            diffs = [c["max_abs_diff_vs_math"] for c in (m["sites"][s][way] for s in SITES)
                     if "error" not in c and c.get("exact") is not False]
            speedup = f"{cudnn / total:.2f}×" if total and cudnn else "–"
            lines.append(f"| {way} | " + " | ".join(cells) + f" | {total if total is not None else '–'} "
                         f"| {speedup} | {max(diffs) if diffs else '–'} |")
        lines += ["", f"Fastest exact way per site: {', '.join(f'{s} {w}' for s, w in m['best_exact'].items())}: "
                  f"{m['best_exact_ms_per_step']} ms per step"
                  + (f" against cudnn's {m['ms_per_step']['cudnn']}." if "cudnn" in m["ms_per_step"] else "."), ""]
        lines += [f"- {way} refused: {error}" for way, error in refusals.items()]
        lines.append("")
    write_whole(path, "\n".join(lines))


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """--models, --device and --results, as the benchmarks of one part of a step alone take them (this one and
    gpu_layernorm.py); ``checked`` reads them."""
    parser.add_argument("--models", default="base,big", help="presets, comma-separated")
    parser.add_argument("--device", default="cuda", help="cuda (default); cpu runs the glue on small shapes")
    add_results_option(parser, f"{Path(parser.prog).stem}.json / .md")


def checked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[torch.device, list]:
    """``add_common_arguments``' values checked before any measurement, each refused in one line: the device
    (and a GPU where it is cuda), the results folder (made now, so that a typo loses no measured minutes),
    the presets -> the device and each preset's config."""
    try:
        device = torch.device(args.device)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cuda", "cpu"):
        parser.error(f"--device {args.device}: cuda, cuda:N or cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"benchmarks/{parser.prog} needs a CUDA GPU (or --device cpu for its glue)")
    results_folder(parser, args.results)
    try:
        configs = [load_config(name) for name in args.models.split(",")]
    except UserError as e:
        parser.error(f"--models {args.models}: {e}")
    return device, configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=25_000, help="tokens per side per batch (paper: ~25k)")
    parser.add_argument("--batches", type=int, default=3, help="batches measured (gpu.py's rows cycle through 3)")
    parser.add_argument("--repeat", type=int, default=10)
    add_common_arguments(parser)
    args = parser.parse_args()
    device, configs = checked(parser, args)
    batches = synthetic_batches(args.tokens, 16 * args.tokens // 27)[0][: args.batches]
    if not batches:
        parser.error(f"--tokens {args.tokens}: no full batch comes out of gpu.py's synthetic sentences")
    result = {"date": datetime.date.today().isoformat(), **code_state(), "command": "python " + " ".join(sys.argv),
              "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "tokens": args.tokens, "batches": len(batches), "models": {}}
    for name, cfg in zip(args.models.split(","), configs):
        result["models"][name] = measure_model(cfg, batches, args.repeat, device)
        print(json.dumps({name: result["models"][name]["ms_per_step"]}), flush=True)
    write_result(args.results, "gpu_attention", result)
    report(result, args.results / "gpu_attention.md")


if __name__ == "__main__":
    main()
