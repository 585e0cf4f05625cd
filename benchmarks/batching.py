"""How much of a batch is padding with §5.1's batcher, against the orders it could sort pairs by.

    python benchmarks/batching.py [--max-tokens 25000]

The training pairs of three recipes, Multi30k EN→DE and EN→FR and the Penn Treebank sample's parsing
(§6.3), each encoded as its recipe encodes it (a joint BPE of its vocabulary size, its maximum length), cut
into batches by the package's greedy fill (`data.fill_batches`: a batch closes when the next pair would take
a side past the budget of padded tokens) after three sorts of the pairs:

- longer side, then target, then source: the package's (`data.make_batches`), the length the authors'
  code buckets by (IMPLEMENTATION-NOTES A10) and the one the budget binds on;
- target, then source: the package's order before 2026-12-02;
- source, then target: fairseq's (`LanguagePairDataset.ordered_indices`; it breaks ties at random, here
  by index).

Each recipe is cut at its own budget (train.max_tokens) and at each --max-tokens. Per order and budget:
the batches of an epoch, the share of padded positions that are PAD, and the positions computed (source +
target, as the batches are padded) relative to the package's order. The step's work is chiefly linear in
the positions, so the last column is the work per epoch that an order costs. Counting only: no timing, so
it may share the machine. Writes benchmarks/results/batching.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import platform
from pathlib import Path

import numpy as np
import torch

from common import recipe_lengths
from provenance import add_results_option, code_state, results_folder, write_result, write_whole
from transformer.config import load_config
from transformer.data import fill_batches, make_batches_from_lengths, padding_fraction

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ("multi30k_en_de", "multi30k_en_fr", "ptb_sample_parse")  # configs/NAME.toml
ORDERS = {  # name -> the pairs' order from (source lengths, target lengths); None: the package's own
    "longer side, target, source (ours)": None,
    "target, source (ours before 2026-12-02)": lambda s, t: np.lexsort((s, t)),
    "source, target (fairseq)": lambda s, t: np.lexsort((t, s)),
}


def measure(src: np.ndarray, tgt: np.ndarray, max_tokens: int) -> list[dict]:
    """One row per order: batches, padding share and positions computed at ``max_tokens`` per side."""
    real, rows = int(src.sum() + tgt.sum()), []
    for name, order in ORDERS.items():
        batches = (make_batches_from_lengths(src, tgt, max_tokens) if order is None else
                   fill_batches(order(src, tgt), src, tgt, max_tokens))
        padding = padding_fraction(src, tgt, batches)
        rows.append({"order": name, "max_tokens": max_tokens, "batches": len(batches),
                     "padding_fraction": round(padding, 4), "positions": round(real / (1 - padding))})
    for row in rows:
        row["positions_vs_ours"] = round(row["positions"] / rows[0]["positions"], 4)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[25000],
                        help="tokens per side per batch, besides each recipe's own: the paper's ~25,000 (§5.1)")
    add_results_option(parser, "batching.json / .md")
    args = parser.parse_args()
    if min(args.max_tokens) < 1:
        parser.error(f"--max-tokens {min(args.max_tokens)}: must be at least 1")
    results = results_folder(parser, args.results)
    corpora = []
    for recipe in RECIPES:
        cfg = load_config(str(ROOT / "configs" / f"{recipe}.toml"))
        src_lengths, tgt_lengths = map(np.asarray, recipe_lengths(cfg))
        budgets = sorted({cfg.train.max_tokens, *args.max_tokens})
        corpora.append({"recipe": f"configs/{recipe}.toml", "corpus": str(cfg.data.train_src),
                        "pairs": len(src_lengths), "vocab_size": cfg.data.vocab_size,
                        "target_longer": round(float(np.mean(tgt_lengths > src_lengths)), 4),
                        "rows": [r for n in budgets for r in measure(src_lengths, tgt_lengths, n)]})
    result = {"benchmark": "batching", "date": datetime.date.today().isoformat(), **code_state(),
              "command": "python benchmarks/batching.py --max-tokens " + " ".join(map(str, args.max_tokens)),
              "versions": {"python": platform.python_version(), "torch": torch.__version__}, "corpora": corpora}
    write_result(results, "batching", result)  # the reading, then its page
    lines = ["# Batching: padding by sort order", "",
             f"`{result['command']}` — {result['date']}, commit {result['commit']}, torch {torch.__version__}.", "",
             "Each recipe's training pairs as it encodes them, cut by the package's greedy fill after each sort, at "
             "the recipe's own budget and at the paper's; padding "
             "is the share of the batches' padded source + target positions that are PAD; positions are those "
             "computed in an epoch, relative to the package's order (a step's work is chiefly linear in them).", ""]
    for c in corpora:
        lines += [f"{c['recipe']}: {c['pairs']:,} pairs, joint BPE of {c['vocab_size']:,}; the target is the longer "
                  f"side in {100 * c['target_longer']:.1f}% of them.", "",
                  "| sorted by | tokens per side | batches | padding | positions vs ours |", "|---|---|---|---|---|"]
        lines += [f"| {r['order']} | {r['max_tokens']:,} | {r['batches']} | {100 * r['padding_fraction']:.1f}% | "
                  f"{r['positions_vs_ours']:.3f} |" for r in c["rows"]]
        lines.append("")
    write_whole(results / "batching.md", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
