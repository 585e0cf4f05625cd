"""Which kernel a decoding step's small products should take on this CPU: torch's default BLAS (MKL)
against oneDNN (`torch.ops.mkldnn._linear_pointwise` with the weight reordered once into oneDNN's
blocked layout, as `transformer.model.pack_for_inference` leaves it; the library CTranslate2 picks here), and SDPA
against the explicit softmax(QKᵀ/√d)V, and the search's two-stage top-k (`transformer.search.row_topk`)
against one `torch.topk`, at the shapes translation runs (rows = batch × beam).

    python benchmarks/linear_kernels.py [--threads 2]

What transformer/model.py decides from it: `linear` sends fp32 products of at least
`ONEDNN_MIN_MACS` multiply-adds to oneDNN when no gradient is needed; `attention` takes SDPA on
the CPU only for few queries in all (batch × heads × queries <= 64); `row_topk` takes two stages on a
CPU for at least 16 rows. Each timing: median of 7 runs of 200 calls (µs per call), fp32.
Writes benchmarks/results/linear_kernels.json and .md. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from common import positive
from provenance import add_results_option, code_state, results_folder, write_result, write_whole
from transformer.model import ONEDNN_MIN_MACS
from transformer.search import row_topk

# (in, out) of the projections of the models measured: the recipe (d 128, d_ff 256/512, V 10k) and
# bench-small (d 256, d_ff 1024, V 8k); rows: batch 1 and 64 at beam 4 (4, 256), and a source batch
LINEARS = [(128, 128), (128, 384), (128, 512), (256, 256), (256, 768), (256, 1024), (1024, 256),
           (128, 10000), (256, 8000)]
ROWS = [1, 4, 16, 64, 256, 1024]
ATTENTION = [  # (batch, heads, queries, keys, masked): a step's self-attention (1 query) and cross-attention
    (4, 4, 1, 15, False), (256, 4, 1, 15, False), (1, 4, 4, 20, True), (64, 4, 4, 20, True)]
TOPK = [(4, 10000, 8), (64, 10000, 8), (256, 10000, 8), (256, 37000, 8), (64, 10000, 1)]  # (rows, V, k): beam 4's 2·beam, greedy's 1


def median_us(fn, calls: int = 200, runs: int = 7) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def explicit(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=positive, default=2)
    add_results_option(parser, "linear_kernels.json / .md")
    args = parser.parse_args()
    results = results_folder(parser, args.results)
    torch.set_num_threads(args.threads)
    linears, attention = [], []
    with torch.inference_mode():
        for k, n in LINEARS:
            w, b = torch.randn(n, k), torch.randn(n)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, None)  # as model.pack_for_inference
            for m in ROWS:
                x = torch.randn(m, k)
                blas = median_us(lambda: F.linear(x, w, b))
                onednn = median_us(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], ""))
                linears.append({"rows": m, "in": k, "out": n, "macs": m * k * n, "blas_us": round(blas, 1),
                                "onednn_us": round(onednn, 1), "onednn_faster": onednn < blas,
                                "model_picks": "onednn" if m * k * n >= ONEDNN_MIN_MACS else "blas"})
        for bsz, h, tq, tk, masked in ATTENTION:
            q, k_, v = torch.randn(bsz, h, tq, 32), torch.randn(bsz, h, tk, 32), torch.randn(bsz, h, tk, 32)
            mask = torch.rand(bsz, 1, 1, tk) > 0.1 if masked else None
            attention.append({"batch": bsz, "heads": h, "queries": tq, "keys": tk, "masked": masked,
                              "sdpa_us": round(median_us(lambda: F.scaled_dot_product_attention(q, k_, v, attn_mask=mask)), 1),
                              "explicit_us": round(median_us(lambda: explicit(q, k_, v, mask)), 1),
                              "model_picks": "sdpa" if bsz * h * tq <= 64 else "explicit"})
        topk = []
        for rows, vocab, k in TOPK:
            x = torch.randn(rows, vocab).log_softmax(-1)
            topk.append({"rows": rows, "vocab": vocab, "k": k, "topk_us": round(median_us(lambda: x.topk(k, -1)), 1),
                         "row_topk_us": round(median_us(lambda: row_topk(x, k)), 1)})
    picked_right = sum(r["onednn_faster"] == (r["model_picks"] == "onednn") for r in linears)
    result = {"date": datetime.date.today().isoformat(), **code_state(),
              "command": "python benchmarks/linear_kernels.py" + (f" --threads {args.threads}" if args.threads != 2 else ""),
              "machine": platform.processor() or platform.machine(), "threads": args.threads,
              "torch": torch.__version__, "onednn_min_macs": ONEDNN_MIN_MACS, "linear": linears,
              "attention": attention, "topk": topk, "rule_picks_faster": f"{picked_right} of {len(linears)}"}
    write_result(results, "linear_kernels", result, indent=1)  # the reading, then its page
    lines = [f"# Kernels for a decoding step's products ({result['date']}, commit {result['commit']}, torch "
             f"{result['torch']}, {args.threads} threads)", "", f"`{result['command']}`. Median of 7 × 200 calls, µs "
             "per call, fp32. The model sends a product to oneDNN when rows × in × out ≥ "
             f"{ONEDNN_MIN_MACS:,} and no gradient is needed; that rule picks the faster kernel in "
             f"{result['rule_picks_faster']} shapes below.", "",
             "| rows | in | out | BLAS (MKL) | oneDNN (packed) | rule picks |", "|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {r['rows']} | {r['in']} | {r['out']} | {r['blas_us']} | {r['onednn_us']} | {r['model_picks']} |"
              for r in linears]
    lines += ["", "Attention (d = 32 per head): SDPA's one call against the explicit path's five.", "",
              "| batch | heads | queries | keys | mask | SDPA | explicit | rule picks |",
              "|---:|---:|---:|---:|---|---:|---:|---|"]
    lines += [f"| {a['batch']} | {a['heads']} | {a['queries']} | {a['keys']} | {'yes' if a['masked'] else 'no'} | "
              f"{a['sdpa_us']} | {a['explicit_us']} | {a['model_picks']} |" for a in attention]
    lines += ["", "Each row's k best of log-probabilities [rows, V]: one `torch.topk` against `row_topk` (two stages "
              "on a CPU from 16 rows: chunk maxima, then the best chunks' columns).", "",
              "| rows | V | k | torch.topk | row_topk |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {t['rows']} | {t['vocab']} | {t['k']} | {t['topk_us']} | {t['row_topk_us']} |" for t in topk]
    write_whole(results / "linear_kernels.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
