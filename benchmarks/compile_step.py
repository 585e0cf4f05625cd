"""Does compiling a decoder step repay? (issue 43's next levers, measured before building them)

    python benchmarks/compile_step.py [--run RUN] [--steps 300] [--device cuda]

Times one incremental decoder step at batch 1, beam 4 (4 rows), three ways, on the run's weights:
- ``engine``: ``Transformer.decode_step`` as `translate` runs it (its cache grows; positions 10..50);
- ``static_eager``: the same layers written as one function of fixed shapes (a cache of 64 positions
  and a length mask, the form a compiler or a CUDA graph needs), run eagerly;
- ``static_compiled``: that function through ``torch.compile`` (inductor, static shapes), with and
  without inductor's weight freezing; its compile seconds are paid once per process (less when
  inductor's on-disk cache holds the graph from an earlier process, as here after the first run).
- ``static_cuda_graph`` (``--device cuda`` only): that function captured once in a CUDA graph and
  replayed at every step (its position and tokens written into the captured input tensors first):
  one launch for the whole step instead of one per operator, which is what a GPU step at batch 1 waits on.
Checks that the compiled function gives the eager one's log-probabilities (max difference recorded).
Writes benchmarks/results/compile_step.json and .md (compile_step_cuda.* on a GPU). Timed: run it alone
on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from transformer.translator import Translator

from common import ROOT, positive, recipe_run, trained_run
from provenance import add_results_option, git, results_folder, write_result, write_whole

ROWS, CAPACITY, SOURCE = 4, 64, 16  # beam 4 at batch 1; cache positions; source length


def static_step(model):
    """The decoder step as one function of fixed shapes, and a maker of its arguments (on the model's device)."""
    cfg, layers = model.cfg, list(model.decoder)
    device = model.target_embedding.weight.device
    d, heads, eps, pre = cfg.d_model, cfg.n_heads, cfg.ln_eps, cfg.norm == "pre"
    dk = d // heads

    def params(m):
        return m.weight.detach(), m.bias.detach()

    weights = [(torch.cat([l.self_attn.q_proj.weight, l.self_attn.k_proj.weight, l.self_attn.v_proj.weight]).detach(),
                torch.cat([l.self_attn.q_proj.bias, l.self_attn.k_proj.bias, l.self_attn.v_proj.bias]).detach(),
                *params(l.self_attn.out_proj), *params(l.cross_attn.q_proj), *params(l.cross_attn.out_proj),
                *params(l.ffn.w1), *params(l.ffn.w2), *params(l.norm1), *params(l.norm2), *params(l.norm3))
               for l in layers]
    embedding, output = model.target_embedding.weight.detach(), model.output_weight.detach()
    final = params(model.dec_norm) if "dec_norm" in model._modules else None
    table = model.positions(CAPACITY, 0, "tgt_pos", device).detach()
    positions = torch.arange(CAPACITY, device=device)

    def step(tokens, t, self_k, self_v, cross_k, cross_v, src_mask):
        x = F.embedding(tokens, embedding) * d ** 0.5
        x = x.masked_fill((tokens == 0)[:, None], 0.0) + table.index_select(0, t.view(1))
        keep = (positions <= t).view(1, 1, 1, CAPACITY)
        for i, (qkv_w, qkv_b, o_w, o_b, cq_w, cq_b, co_w, co_b, w1, b1, w2, b2, g1, e1, g2, e2, g3, e3) in \
                enumerate(weights):
            h = F.layer_norm(x, (d,), g1, e1, eps) if pre else x
            q, k, v = F.linear(h, qkv_w, qkv_b).split(d, -1)
            self_k[i].index_copy_(2, t.view(1), k.view(ROWS, heads, 1, dk))
            self_v[i].index_copy_(2, t.view(1), v.view(ROWS, heads, 1, dk))
            a = F.scaled_dot_product_attention(q.view(ROWS, heads, 1, dk), self_k[i], self_v[i], attn_mask=keep)
            h = F.linear(a.reshape(ROWS, d), o_w, o_b)
            x = x + h if pre else F.layer_norm(x + h, (d,), g1, e1, eps)
            h = F.layer_norm(x, (d,), g2, e2, eps) if pre else x
            q = F.linear(h, cq_w, cq_b).view(ROWS, heads, 1, dk)
            h = F.linear(F.scaled_dot_product_attention(q, cross_k[i], cross_v[i], attn_mask=src_mask).reshape(ROWS, d),
                         co_w, co_b)
            x = x + h if pre else F.layer_norm(x + h, (d,), g2, e2, eps)
            h = F.layer_norm(x, (d,), g3, e3, eps) if pre else x
            h = F.linear(F.relu(F.linear(h, w1, b1)), w2, b2)
            x = x + h if pre else F.layer_norm(x + h, (d,), g3, e3, eps)
        if final is not None:
            x = F.layer_norm(x, (d,), *final, eps)
        return F.linear(x, output).log_softmax(-1)

    def arguments(seed: int = 0) -> list:
        g = torch.Generator().manual_seed(seed)
        cache = (len(layers), ROWS, heads, CAPACITY, dk)
        cross = (len(layers), ROWS, heads, SOURCE, dk)
        made = [torch.zeros(ROWS, dtype=torch.long), torch.tensor(0), torch.zeros(cache), torch.zeros(cache),
                torch.randn(cross, generator=g), torch.randn(cross, generator=g),
                torch.ones(ROWS, 1, 1, SOURCE, dtype=torch.bool)]
        return [a.to(device) for a in made]

    return step, arguments


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def per_step_ms(fn, arguments, steps: int) -> float:
    args = arguments()
    device = args[0].device
    with torch.inference_mode():
        for j in range(20):
            args[1] = torch.tensor(10 + j % 40, device=device)
            fn(*args)
        sync(device)
        start = time.perf_counter()
        for j in range(steps):
            args[1] = torch.tensor(10 + j % 40, device=device)
            fn(*args)
        sync(device)
    return (time.perf_counter() - start) / steps * 1e3


def graphed_ms(fn, arguments, steps: int) -> tuple[float, float]:
    """The function captured in a CUDA graph and replayed per step (position and tokens written into
    the captured inputs first); ms per step, and the largest difference from the eager function's
    log-probabilities at one position."""
    args = arguments()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode():
        with torch.cuda.stream(side):  # warm-up off the capture stream, as CUDA graphs want
            for _ in range(3):
                fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*args)
        args[1].fill_(17)
        graph.replay()
        want = fn(*[a.clone() for a in args])
        diff = float((want - out).abs().max())
        for j in range(20):
            args[1].fill_(10 + j % 40)
            graph.replay()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for j in range(steps):
            args[0].copy_(args[0])  # the tokens a search would write in
            args[1].fill_(10 + j % 40)
            graph.replay()
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3, diff


def engine_ms(model, steps: int) -> float:
    """``decode_step`` at positions 10..50, a fresh cache every 40 steps (its capacity is grown as it goes)."""
    device = model.target_embedding.weight.device
    with torch.inference_mode():
        memory, mask = model.encode(torch.randint(3, 100, (1, SOURCE), device=device))
        tokens, total, done = torch.zeros(ROWS, dtype=torch.long, device=device), 0.0, 0
        while done < steps:
            cache = model.init_cache(memory, mask, beam=ROWS, max_len=CAPACITY)
            for _ in range(10):
                model.decode_step(tokens, cache)
            sync(device)
            start = time.perf_counter()
            for _ in range(40):
                model.decode_step(tokens, cache)
            sync(device)
            total, done = total + time.perf_counter() - start, done + 40
    return total / done * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, help="run folder (default: the quick recipe's)")
    parser.add_argument("--steps", type=positive, default=300)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (adds the CUDA graph)")
    add_results_option(parser, "compile_step.json / .md (compile_step_cuda.* on a GPU)")
    args = parser.parse_args()
    results = results_folder(parser, args.results)
    run = trained_run(args.run or recipe_run("en_de_quick"), "; train the quick recipe, or pass --run")
    model = Translator(run, log=lambda m: None, device=args.device).model
    step, arguments = static_step(model)
    import torch._inductor.config as inductor

    result = {"engine_ms": round(engine_ms(model, args.steps), 3),
              "static_eager_ms": round(per_step_ms(step, arguments, args.steps), 3), "compiled": {}}
    for freezing in (False, True):
        torch._dynamo.reset()
        inductor.freezing = freezing
        start = time.perf_counter()
        compiled = torch.compile(step, fullgraph=True, dynamic=False)
        with torch.inference_mode():
            compiled(*arguments())
            seconds = time.perf_counter() - start
            want, got = step(*arguments(1)), compiled(*arguments(1))
        result["compiled"][f"freezing_{str(freezing).lower()}"] = {
            "ms": round(per_step_ms(compiled, arguments, args.steps), 3), "compile_seconds": round(seconds, 1),
            "max_abs_diff": float((want - got).abs().max())}
        print(result, flush=True)
    cuda = model.target_embedding.weight.device.type == "cuda"
    if cuda:
        ms, diff = graphed_ms(step, arguments, args.steps)
        result["cuda_graph"] = {"ms": round(ms, 3), "max_abs_diff": diff}
    best = min(c["ms"] for c in result["compiled"].values())
    result |= {"compiled_vs_engine": round(result["engine_ms"] / best, 2),
               "run": os.path.relpath(run, ROOT), "rows": ROWS, "capacity": CAPACITY, "source_len": SOURCE,
               "threads": torch.get_num_threads(), "steps": args.steps, "commit": git("rev-parse", "--short", "HEAD"),
               "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
               "date": datetime.date.today().isoformat(),
               "machine": torch.cuda.get_device_name() if cuda else f"{os.cpu_count()} CPU cores, {platform.machine()}",
               "versions": {"python": platform.python_version(), "torch": torch.__version__}}
    if cuda:
        result["cuda_graph_vs_engine"] = round(result["engine_ms"] / result["cuda_graph"]["ms"], 2)
    name = "compile_step_cuda" if cuda else "compile_step"
    write_result(results, name, result)  # the reading, then its page
    c = result["compiled"]
    graph_row = (f"| static shapes, one CUDA graph replayed per step | {result['cuda_graph']['ms']} | – |\n"
                 if cuda else "")
    graph_line = (f"The engine's step against the CUDA graph: {result['cuda_graph_vs_engine']}× (log-probabilities "
                  f"within {result['cuda_graph']['max_abs_diff']:.1e} of the eager function's).\n" if cuda else "")
    write_whole(results / f"{name}.md", f"""# Compiling a decoder step: {result['machine']}

`{result['command']}` — {result['date']}, commit {result['commit']}, {result['machine']}, {result['threads']} threads,
torch {result['versions']['torch']}; run `{result['run']}`, batch 1 × beam 4, positions 10..50, {result['steps']} steps each.

| step | ms per step | compile s |
|---|---|---|
| engine (`decode_step`, as `translate` runs it) | {result['engine_ms']} | – |
| static shapes, eager | {result['static_eager_ms']} | – |
| static shapes, torch.compile | {c['freezing_false']['ms']} | {c['freezing_false']['compile_seconds']} (cache warm or cold: see the script) |
| static shapes, torch.compile with weight freezing | {c['freezing_true']['ms']} | {c['freezing_true']['compile_seconds']} |
{graph_row}
The engine's step against the best compiled one: {result['compiled_vs_engine']}× (above 1: compiling
would pay). Compiled log-probabilities match the eager function's within
{max(x['max_abs_diff'] for x in c.values()):.1e}. {graph_line}Single readings on a shared machine:
differences under ~10% are noise.
""")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
