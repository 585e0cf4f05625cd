"""The decoder's reference answers: test2016 decoded by a named run in four settings, outputs and scores
kept as piece ids, so that a rewritten search or decoder step can be held to what the code gave before.

    python benchmarks/decode_reference.py [--run tests/data/decode_reference] [--out .../test2016.json]

Settings: "plain" (§6.1: beam 4, α 0.6, maximum length input + 50, the exact early stop), "nbest" (the
same search's 4-best lists), "top" (`--early-stop top`) and "greedy" (beam 1). Batches of 64, fp32, CPU.

The default run is the small model committed under tests/data/decode_reference (the `tiny` preset,
2+2 layers, d_model 64, trained 3,000 updates on Multi30k EN→DE; its config is in the checkpoint), so
that `tests/test_search_reference.py` checks a slice of these answers in CI. Writes JSON: the commit
the answers came from, the settings, and per setting one list per test sentence of [tokens, score].
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch

from common import ROOT, trained_run
from provenance import code_state
from transformer.checkpoint import list_checkpoints
from transformer.data import encode_for_decoding, read_lines
from transformer.decode import decode_ids
from transformer.prepare import resolve_data_path
from transformer.translator import Translator

RUN = ROOT / "tests" / "data" / "decode_reference"
SETTINGS = {  # name -> decode_ids keywords (beam, α, +50 and batch 64 unless given)
    "plain": {},
    "nbest": {"nbest": 4},
    "top": {"early_stop": "top"},
    "greedy": {"beam_size": 1},
}
BASE = {"beam_size": 4, "alpha": 0.6, "max_len_offset": 50, "batch_size": 64}


def reference(run: Path, sentences: int | None = None) -> dict[str, list[list[tuple[list[int], float]]]]:
    """Each setting's hypotheses for the first ``sentences`` of test2016 (all by default)."""
    translator = Translator(run, list_checkpoints(run)[-1], log=lambda m: None, device="cpu")
    lines = read_lines(resolve_data_path("multi30k/test_2016_flickr.en.gz"))[:sentences]
    sources = encode_for_decoding(lines, translator.tokenizer)
    out = {}
    with torch.inference_mode():
        for name, kw in SETTINGS.items():
            lists = decode_ids(translator.model, sources, **{**BASE, **kw})
            out[name] = [[(h.tokens, h.score) for h in hyps] for hyps in lists]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, default=RUN)
    parser.add_argument("--out", type=Path, default=RUN / "test2016.json")
    args = parser.parse_args()
    trained_run(args.run)
    torch.set_num_threads(2)
    result = {"date": datetime.date.today().isoformat(), **code_state(),
              "command": "python benchmarks/decode_reference.py" + ("" if args.run == RUN else f" --run {args.run}"),
              "run": str(args.run.resolve().relative_to(ROOT)) if args.run.resolve().is_relative_to(ROOT) else str(args.run),
              "torch": torch.__version__, "settings": {k: {**BASE, **v} for k, v in SETTINGS.items()},
              "outputs": reference(args.run)}
    args.out.write_text(json.dumps(result, separators=(",", ":")) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
