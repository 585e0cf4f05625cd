"""How much decoder work each beam-search stopping rule does: decoder rows (one row = one prefix
advanced one token) over test2016, beam 4, α 0.6, max length input + 50.

    python benchmarks/search_work.py RUN_DIR [--batch-size 64] > benchmarks/results/search_work.json

Rules: "bound", the paper's exact early stop (§6.1, A11); "top", OpenNMT-py's and CTranslate2's
(`--early-stop top`). Rows, not seconds: the count does not depend on the machine, so it explains
the speed ratios of benchmarks/speed.py between systems that stop differently. Prints JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from common import trained_run
from provenance import code_state
from transformer.checkpoint import list_checkpoints
from transformer.data import encode_for_decoding, read_lines
from transformer.prepare import resolve_data_path
from transformer.config import EARLY_STOPS
from transformer.decode import translate_ids
from transformer.evaluate import sacrebleu_scores
from transformer.translator import Translator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="run folder (its last checkpoint is used)")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    state = code_state()  # the code at the start: a commit made during the run must not be recorded
    trained_run(args.run)
    translator = Translator(args.run, list_checkpoints(args.run)[-1], log=lambda m: None)
    model = translator.model
    lines = read_lines(resolve_data_path("multi30k/test_2016_flickr.en.gz"))
    refs = read_lines(resolve_data_path("multi30k/test_2016_flickr.de.gz"))
    sources = encode_for_decoding(lines, translator.tokenizer)
    rows = 0
    step = model.decode_step

    def counting_step(tokens: torch.Tensor, cache):  # every decoder step passes here, one row per token
        nonlocal rows
        rows += tokens.numel()
        return step(tokens, cache)

    model.decode_step = counting_step
    result = {}
    for rule in EARLY_STOPS:
        rows = 0
        outputs = translate_ids(model, sources, 4, 0.6, 50, args.batch_size, early_stop=rule)
        tokens = sum(len(o) + 1 for o in outputs)  # + EOS
        bleu = sacrebleu_scores([translator.tokenizer.decode(o) for o in outputs], refs)["bleu"]
        result[rule] = {"decoder_rows": rows, "output_tokens": tokens, "rows_per_token": round(rows / tokens, 2),
                        "bleu": round(bleu, 2)}
    print(json.dumps({"run": str(args.run), "checkpoint": "last", "batch_size": args.batch_size,
                      "command": " ".join(["benchmarks/search_work.py", *sys.argv[1:]]),
                      "date": datetime.date.today().isoformat(), **state, "torch": torch.__version__,
                      **result}, indent=2))


if __name__ == "__main__":
    main()
