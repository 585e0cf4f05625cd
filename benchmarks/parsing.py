"""Parsing benchmark (§6.3, Table 4 in miniature): the Penn Treebank WSJ sample, trained from scratch.

    python benchmarks/parsing.py [--minutes 60] [--out runs/bench_parse]

Trains configs/ptb_sample_parse.toml on wsj_0001-0159, picks the decoding weights on the dev files
(0160-0174: the last checkpoint, or the average of the last 5 or 10, by F1), and reports labelled
bracket F1 on the test files (0175-0189) with the paper's parsing decoder (beam 21, α 0.3, input +
300) and its beam constrained to well-formed trees of the input (trees.TreeConstraint), scored as
EVALB with COLLINS.prm, plus the share of outputs that were well-formed trees before repair; the
picked weights are also scored on test without the constraint (the model's own well-formed share).
Writes benchmarks/results/parsing.json and .md. Run it alone on the machine.
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

from transformer.data import read_lines

from transformer.prepare import resolve_data_path
from transformer.translator import Translator
from transformer.evaluate import score_trees
from transformer.trees import read_trees

from common import train_or_reread, weight_candidates
from provenance import add_results_option, code_state, commit_text, results_folder, write_result, write_whole

ROOT = Path(__file__).resolve().parent.parent


def parse(translator: Translator, words_file: str, gold_file: str) -> dict:
    lines = read_lines(resolve_data_path(words_file))
    gold = read_trees(resolve_data_path(gold_file))
    start = time.monotonic()
    outputs = translator.translate(lines)
    seconds = time.monotonic() - start
    results = translator.trees(lines, outputs)  # as `transformer parse` rebuilds them
    score = score_trees(gold, [t for t, _ in results]).as_dict()
    score["well_formed_before_repair"] = round(sum(ok for _, ok in results) / len(results), 4)
    score["parse_seconds"] = round(seconds, 1)
    return score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, help="training budget (default: the recipe's max_minutes)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_parse", help="run folder (new, unless --decode-only)")
    parser.add_argument("--set", action="append", default=[], help="extra config overrides")
    parser.add_argument("--decode-only", action="store_true", help="do not train: pick and score the checkpoints "
                        "of the finished run in --out again (after a change to decoding or tree repair)")
    add_results_option(parser, "parsing.json / .md")
    args = parser.parse_args()
    results = results_folder(parser, args.results)
    code = code_state()
    config = ROOT / "configs" / "ptb_sample_parse.toml"
    cfg, summary, overrides = train_or_reread(config, args.out, args.set, args.minutes, args.decode_only)
    d = cfg.data

    candidates = weight_candidates(args.out)
    dev = {}
    for name, path in candidates.items():
        dev[name] = parse(Translator(args.out, path, log=lambda m: None), d.valid_src,
                          d.valid_src.replace(".words", ".gold"))
        print(f"dev {name}: {json.dumps(dev[name])}", flush=True)
    picked = max(dev, key=lambda name: dev[name]["f1"])
    translator = Translator(args.out, candidates[picked], log=lambda m: None)
    test = parse(translator, d.test_src, d.test_tgt)
    translator.constraint = None  # the same weights decoding freely, repaired afterwards
    free = parse(translator, d.test_src, d.test_tgt)

    result = {
        "f1": test["f1"], "precision": test["precision"], "recall": test["recall"],
        "well_formed_before_repair": test["well_formed_before_repair"],
        "train_minutes": round(summary["train_minutes"], 2), "steps": summary["step"],
        "train_tokens_per_s": round(summary["tokens_per_s"]), "valid_ppl": round(summary["valid_ppl"], 3),
        "picked_on_dev": picked, "dev": dev, "test": test, "test_unconstrained": free,
        "decode": {"beam": cfg.decode.beam_size, "alpha": cfg.decode.alpha, "max_len_offset": cfg.decode.max_len_offset,
                   "constrained": cfg.decode.constrained},
        "scoring": "EVALB COLLINS.prm rules (transformer/evaluate.py): labelled brackets, punctuation by gold tag "
                   "removed, ADVP = PRT, POS nodes not counted, micro-averaged",
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "config": str(config.relative_to(ROOT)), "overrides": overrides, **code,
        "date": datetime.date.today().isoformat(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, threads {torch.get_num_threads()}",
    }
    write_result(results, "parsing", result)  # the reading, then its page
    dev_rows = "\n".join(f"| {name} | {v['f1']} | {v['precision']} | {v['recall']} | {v['well_formed_before_repair']} |"
                         for name, v in dev.items())
    write_whole(results / "parsing.md", f"""# Constituency parsing, Penn Treebank WSJ sample (§6.3)

`{result['command']}` — {result['date']}, {commit_text(result)}, {result['machine']}; torch {torch.__version__}

Trained on wsj_0001-0159 for {result['train_minutes']} min ({result['steps']} steps); picked on
wsj_0160-0174 ({picked}); tested on wsj_0175-0189. Beam {cfg.decode.beam_size}, α {cfg.decode.alpha},
max length input + {cfg.decode.max_len_offset}, beam constrained to well-formed trees of the input
(`decode.constrained`, trees.TreeConstraint; not in the paper). {result['scoring']}.

| test | value |
|---|---|
| F1 | **{result['f1']}** |
| precision | {result['precision']} |
| recall | {result['recall']} |
| well-formed before repair | {result['well_formed_before_repair']:.1%} |
| sentences / brackets (gold, test, matched) | {test['sentences']} / {test['gold_brackets']}, {test['test_brackets']}, {test['matched']} |
| same weights, unconstrained beam then repair: F1 | {free['f1']} (well-formed before repair {free['well_formed_before_repair']:.1%}) |

Dev (wsj_0160-0174):

| weights | F1 | precision | recall | well-formed |
|---|---|---|---|---|
{dev_rows}
""")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
