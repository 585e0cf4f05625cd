"""The label-smoothed loss alone on a GPU: the Triton kernel (``transformer/fused_loss.py``) against the
operator-by-operator path, at the paper's base and big shapes (issue 47).

    python benchmarks/fused_loss.py [--tokens 25000] [--repeat 10]

For each model's d_model, the loss and both gradients (``label_smoothed_loss`` computes them in its
forward pass) of --tokens target positions over V = 37,000, under bf16 autocast as training runs it:
milliseconds per call (CUDA events, median of --repeat after a warm-up), peak memory, and how far the
two paths' loss and gradients are apart. Then the kernel alone on [--tokens, V] bf16 logits: its
milliseconds and the bytes it moves per second (two reads of the logits and one write), against a
device-to-device copy of the same logits (one read, one write): how near the kernel runs to the
card's memory bandwidth. Writes benchmarks/results/fused_loss.json and .md. Needs a CUDA GPU and Triton.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys

import torch

from provenance import add_results_option, code_state, commit_text, results_folder, write_result, write_whole
from transformer.loss import label_smoothed_loss

VOCAB = 37000
MODELS = {"base": 512, "big": 1024}


def event_times(fn, repeat: int, prepare=lambda: None) -> list[float]:
    """Milliseconds of ``repeat`` calls of ``fn()`` by CUDA events, ``prepare()`` run untimed before each."""
    times = []
    for _ in range(repeat):
        prepare()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def timed(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, fused: bool, repeat: int) -> dict:
    def call() -> tuple[torch.Tensor, ...]:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = label_smoothed_loss(hidden, weight, target, 0.1, fused=fused)
        return (loss, *torch.autograd.grad(loss, (hidden, weight)))

    out = call()  # warm-up: the kernel's compilation, the allocator
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base_memory = torch.cuda.memory_allocated()
    times = event_times(call, repeat)
    return {"ms": round(statistics.median(times), 3), "ms_min": round(min(times), 3),
            "peak_extra_gib": round((torch.cuda.max_memory_allocated() - base_memory) / 2**30, 2),
            "outputs": [t.detach().float() for t in out]}


def kernel_alone(tokens: int, repeat: int, vocab: int = VOCAB, device: str = "cuda") -> dict:
    """The Triton kernel on [tokens, vocab] bf16 logits against a copy of them: ms, GB/s, the share."""
    from transformer.fused_loss import smoothed_loss_and_grad_

    g = torch.Generator(device=device).manual_seed(0)
    source = (torch.randn(tokens, vocab, device=device, generator=g) * 4).bfloat16()
    target = torch.randint(0, vocab, (tokens,), device=device, generator=g)
    logits = torch.empty_like(source)
    nbytes = source.numel() * source.element_size()
    def run() -> None:
        smoothed_loss_and_grad_(logits, target, 0.1)

    def refill() -> None:
        logits.copy_(source)

    refill()
    run()  # the warm-up: the kernel's compilation
    kernel = statistics.median(event_times(run, repeat, refill))
    copy = statistics.median(event_times(refill, repeat))
    kernel_gbs, copy_gbs = 3 * nbytes / kernel / 1e6, 2 * nbytes / copy / 1e6
    return {"logits_gib": round(nbytes / 2**30, 2), "kernel_ms": round(kernel, 3), "kernel_gb_s": round(kernel_gbs),
            "copy_ms": round(copy, 3), "copy_gb_s": round(copy_gbs), "share_of_copy": round(kernel_gbs / copy_gbs, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=25000, help="target positions per call (the paper's batch)")
    parser.add_argument("--repeat", type=int, default=10)
    add_results_option(parser, "fused_loss.json / .md")
    args = parser.parse_args()
    results = results_folder(parser, args.results)
    if not torch.cuda.is_available():
        sys.exit("fused_loss.py needs a CUDA GPU")
    rows = {}
    for name, d in MODELS.items():
        g = torch.Generator(device="cuda").manual_seed(0)
        hidden = torch.randn(args.tokens, d, device="cuda", generator=g).requires_grad_()
        weight = (torch.randn(VOCAB, d, device="cuda", generator=g) * d**-0.5).requires_grad_()
        target = torch.randint(0, VOCAB, (args.tokens,), device="cuda", generator=g)
        plain = timed(hidden, weight, target, False, args.repeat)
        fused = timed(hidden, weight, target, True, args.repeat)
        (loss_p, *grads_p), (loss_f, *grads_f) = plain.pop("outputs"), fused.pop("outputs")
        rows[name] = {"d_model": d, "operators": plain, "fused": fused,
                      "speedup": round(plain["ms"] / fused["ms"], 2),
                      "loss_rel_diff": float((loss_f - loss_p).abs() / loss_p.abs()),
                      "grad_rel_diff": [float((a - b).norm() / b.norm()) for a, b in zip(grads_f, grads_p)]}
        print(name, json.dumps(rows[name]), flush=True)
    alone = kernel_alone(args.tokens, args.repeat)
    print("kernel alone", json.dumps(alone), flush=True)
    result = {"date": datetime.date.today().isoformat(), **code_state(), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "command": "python " + " ".join(sys.argv), "vocab": VOCAB,
              "tokens": args.tokens, "rows": rows, "kernel_alone": alone}
    write_result(results, "fused_loss", result)  # the reading, then its page
    lines = [f"# The label-smoothed loss on {result['gpu']}: Triton kernel against operators", "",
             f"`{result['command']}` — {result['date']}, {commit_text(result)}, torch {result['torch']}. "
             "Loss and both gradients of "
             f"{args.tokens:,} positions over V = {VOCAB:,}, bf16 autocast, median of {args.repeat}.", "",
             "| model | d_model | operators (ms) | fused (ms) | speed-up | extra memory (GiB), operators / fused | "
             "loss rel. diff | gradient rel. diff (hidden, weight) |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {n} | {r['d_model']} | {r['operators']['ms']} | {r['fused']['ms']} | {r['speedup']}× | "
              f"{r['operators']['peak_extra_gib']} / {r['fused']['peak_extra_gib']} | {r['loss_rel_diff']:.1e} | "
              f"{r['grad_rel_diff'][0]:.1e}, {r['grad_rel_diff'][1]:.1e} |" for n, r in rows.items()]
    lines += ["", f"The kernel alone on {alone['logits_gib']} GiB of bf16 logits ([{args.tokens:,}, {VOCAB:,}]): "
              f"{alone['kernel_ms']} ms, {alone['kernel_gb_s']:,} GB/s (two reads and a write); a copy of the "
              f"logits: {alone['copy_ms']} ms, {alone['copy_gb_s']:,} GB/s; the kernel at {alone['share_of_copy']:.0%} "
              "of the copy's rate."]
    write_whole(results / "fused_loss.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
