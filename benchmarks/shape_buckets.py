"""What train.shape_buckets costs in padding, and how few shapes it leaves (CUDA graphs replay one each).

    python benchmarks/shape_buckets.py [--pairs en_de] [--max-tokens 4096]

Multi30k train encoded as the recipe encodes it (configs/multi30k_en_de.toml: a joint BPE of its
vocabulary size, its maximum length), batched by §5.1's batcher without buckets and with N = 4, 8, 16
lengths per doubling (data.ShapeBuckets): per setting the batches, the distinct batch shapes, the share of
padded positions, and the positions computed relative to no buckets. Counting only: no timing, so it may
share the machine. Writes benchmarks/results/shape_buckets.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import platform
from pathlib import Path

import numpy as np
import torch

from common import positive, recipe_lengths
from provenance import add_results_option, code_state, results_folder, write_result, write_whole
from transformer.config import load_config
from transformer.data import ShapeBuckets, make_batches_from_lengths, padding_fraction

ROOT = Path(__file__).resolve().parent.parent
PER_DOUBLING = (0, 4, 8, 16)  # 0: the batches as §5.1 makes them


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", default="en_de", choices=("en_de", "en_fr"), help="the Multi30k recipe")
    parser.add_argument("--max-tokens", type=positive, help="tokens per side per batch (default: the recipe's)")
    add_results_option(parser, "shape_buckets.json / .md")
    args = parser.parse_args()
    results = results_folder(parser, args.results)
    cfg = load_config(str(ROOT / "configs" / f"multi30k_{args.pairs}.toml"))
    max_tokens = args.max_tokens or cfg.train.max_tokens
    src_lengths, tgt_lengths = map(np.asarray, recipe_lengths(cfg))
    real = int(src_lengths.sum() + tgt_lengths.sum())
    rows = []
    for n in PER_DOUBLING:
        buckets = ShapeBuckets(n, max_tokens) if n else None
        batches = make_batches_from_lengths(src_lengths, tgt_lengths, max_tokens, buckets)
        shapes = (buckets.shapes(src_lengths, tgt_lengths, batches) if buckets else
                  {(len(b), int(src_lengths[b].max()), int(tgt_lengths[b].max())) for b in batches})
        padding = padding_fraction(src_lengths, tgt_lengths, batches, buckets)
        rows.append({"per_doubling": n, "batches": len(batches), "shapes": len(shapes),
                     "padding_fraction": round(padding, 4), "positions": round(real / (1 - padding))})
    for row in rows:
        row["positions_vs_none"] = round(row["positions"] / rows[0]["positions"], 4)
    result = {"benchmark": "shape_buckets", "date": datetime.date.today().isoformat(), **code_state(),
              "command": f"python benchmarks/shape_buckets.py --pairs {args.pairs} --max-tokens {max_tokens}",
              "versions": {"python": platform.python_version(), "torch": torch.__version__},
              "corpus": str(cfg.data.train_src), "pairs": len(src_lengths), "vocab_size": cfg.data.vocab_size,
              "max_tokens": max_tokens, "rows": rows}
    write_result(results, "shape_buckets", result)  # the reading, then its page
    lines = ["# Shape buckets: padding and shapes", "",
             f"`{result['command']}` — {result['date']}, commit {result['commit']}, torch {torch.__version__}.", "",
             f"Multi30k train ({len(src_lengths):,} pairs, joint BPE of {cfg.data.vocab_size:,} as the recipe trains "
             f"it), batched at {max_tokens:,} tokens per side. N = 0 is §5.1's batching; N > 0 pads both sides of "
             "a batch to the bucket of its longest sentence (8 · 2^(k/N)) and adds rows up to the budget "
             "(`train.shape_buckets`).", "",
             "| N (lengths per doubling) | batches | shapes | padding | positions computed vs N = 0 |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['per_doubling']} | {r['batches']} | {r['shapes']} | {100 * r['padding_fraction']:.1f}% | "
              f"{r['positions_vs_none']:.3f} |" for r in rows]
    write_whole(results / "shape_buckets.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
