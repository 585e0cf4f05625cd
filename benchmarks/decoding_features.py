"""What the decoding features after the paper do on Multi30k EN→DE test2016: n-best, scoring, constraints, ensembles.

    python benchmarks/decoding_features.py [--run RUN_DIR] [--out runs] [--ensemble-steps 1100]

1. n-best: the recipe's run (--run, default the EN→DE recipe's own run of benchmarks/multi30k.py)
   decodes test2016 with beam 4 and --nbest 4; `nbest_matches_plain` is the fraction of sentences
   whose first hypothesis is the plain 1-best output, token for token.
2. Scoring: every hypothesis of those lists is scored again by forced decoding (`decode.score_ids`, the
   same ids); `score_matches_beam` is the largest difference from the beam's own score.
3. Constraints: per sentence, one word of its reference (the longest of those the plain output does not
   contain; seeded choice among equals), given as a lexical constraint. `constraint_coverage` is the
   fraction of constraints present in the outputs (as written, after detokenization); BLEU with them
   against without (`constraints_bleu_delta`: the constraints come from the references, so this is the
   gain an oracle terminology list brings), and sentences/s of both (`constrained_sents_per_s`,
   `plain_sents_per_s`; one process, warm, best of 2).
4. Ensembles: two runs of the quick recipe (configs/multi30k_en_de_quick.toml) with seeds 1 and 2,
   step-bounded at --ensemble-steps updates so that their quality does not depend on what else the
   machine does (the recipe itself is bounded by 10 minutes), trained into OUT/features_quick_seed{1,2}
   or read back; test2016 BLEU of each alone (`single_bleu`: their mean, and both) and of the ensemble
   (`ensemble_bleu`).

BLEU is tokenized lowercased (the Multi30k literature's, as benchmarks/multi30k.py) and sacreBLEU.
Writes benchmarks/results/decoding_features.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import sacrebleu
import torch

from transformer.config import load_config
from transformer.data import encode_for_decoding
from transformer.decode import decode_ids, score_ids
from transformer.evaluate import sacrebleu_scores, tok_lc_bleu
from transformer.request import DecodeRequest
from transformer.translator import Translator

from common import ROOT, recipe_run, test_set, train_or_resume, trained_run
from provenance import add_results_option, git, results_folder, write_result



def bleu(hyps: list[str], refs: list[str], tok_refs: list[str]) -> dict:
    return {"tok_lc_bleu": round(tok_lc_bleu(hyps, tok_refs, "de"), 2),
            "sacrebleu": round(sacrebleu_scores(hyps, refs)["bleu"], 2)}


def timed(fn, repeat: int = 2) -> tuple[float, object]:
    """Best wall time of ``repeat`` calls, and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def reference_constraints(hyps: list[str], refs: list[str], seed: int = 1) -> list[list[str]]:
    """One word per sentence from its reference that the plain output lacks: the longest such (ties by a
    seeded draw), so that the constraint changes the output; none where the output has every word."""
    rng = random.Random(seed)
    constraints = []
    for hyp, ref in zip(hyps, refs):
        words = [w.strip(".,;:!?\"'") for w in ref.split()]
        missing = [w for w in words if len(w) >= 3 and w not in hyp]
        longest = max(map(len, missing), default=0)
        constraints.append([rng.choice([w for w in missing if len(w) == longest])] if missing else [])
    return constraints


def quick_run(out: Path, seed: int, steps: int) -> Path:
    """The quick recipe with ``seed``, step-bounded at ``steps`` updates, trained or read back."""
    run = out / f"features_quick_seed{seed}"
    train_or_resume(load_config(str(ROOT / "configs" / "multi30k_en_de_quick.toml"),
                                [f"train.seed={seed}", f"train.max_steps={steps}", "train.max_minutes=0"]), run)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, help="the EN→DE run to decode (default: the recipe's own run of "
                        "benchmarks/multi30k.py, as multi30k_en_de.json names it)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs", help="where the ensemble's two runs go")
    parser.add_argument("--ensemble-steps", type=int, default=1100, help="updates of each quick-recipe run")
    add_results_option(parser, "decoding_features.json / .md")
    args = parser.parse_args()
    results = results_folder(parser, args.results)
    # the code that runs is the code at the start: later commits during the run must not be recorded
    commit = git("rev-parse", "--short", "HEAD")
    uncommitted = git("status", "--porcelain", "--untracked-files=no").splitlines()
    args.run = trained_run(args.run or recipe_run(), "; run benchmarks/multi30k.py first (or give --run)")

    translator = Translator(args.run, log=print)
    cfg = translator.cfg
    src, refs, tok_refs = test_set(cfg)
    d = cfg.decode
    ids = encode_for_decoding(src, translator.tokenizer)
    result: dict = {"run": os.path.relpath(args.run, ROOT), "sentences": len(src), "beam": d.beam_size,
                    "alpha": d.alpha}

    # 1-2. n-best and scoring, by ids
    plain_s, plain = timed(lambda: translator.translate(src))
    lists = decode_ids(translator.model, ids, d.beam_size, d.alpha, d.max_len_offset, d.batch_size, nbest=d.beam_size)
    plain_ids = decode_ids(translator.model, ids, d.beam_size, d.alpha, d.max_len_offset, d.batch_size)
    result["nbest_matches_plain"] = sum(l[0].tokens == p[0].tokens for l, p in zip(lists, plain_ids)) / len(src)
    flat = [(i, h) for i, hyps in enumerate(lists) for h in hyps]
    forced = score_ids(translator.model, [ids[i] for i, _ in flat], [h.tokens for _, h in flat], d.alpha)
    result["score_matches_beam"] = max(abs(f.score - h.score) for f, (_, h) in zip(forced, flat))
    result["nbest_hypotheses"] = len(flat)

    # 3. constraints from the references
    constraints = reference_constraints(plain, refs)
    cons_s, constrained = timed(lambda: [h[0][0] for h in translator.decode(src, DecodeRequest(constraints=constraints))])
    wanted = [(c, out) for cs, out in zip(constraints, constrained) for c in cs]
    result["constraints"] = len(wanted)
    result["constraint_coverage"] = sum(c in out for c, out in wanted) / max(1, len(wanted))
    plain_bleu, cons_bleu = bleu(plain, refs, tok_refs), bleu(constrained, refs, tok_refs)
    result["plain_bleu"], result["constrained_bleu"] = plain_bleu, cons_bleu
    result["constraints_bleu_delta"] = round(cons_bleu["tok_lc_bleu"] - plain_bleu["tok_lc_bleu"], 2)
    result["plain_sents_per_s"] = round(len(src) / plain_s, 1)
    result["constrained_sents_per_s"] = round(len(src) / cons_s, 1)

    # 4. ensembles of two quick-recipe runs
    runs = [quick_run(args.out, seed, args.ensemble_steps) for seed in (1, 2)]
    singles = [bleu(Translator(r, log=print).translate(src), refs, tok_refs) for r in runs]
    pair = bleu(Translator(runs[0], log=print, ensemble=runs[1:]).translate(src), refs, tok_refs)
    result["single_bleu"] = round(sum(s["tok_lc_bleu"] for s in singles) / 2, 2)
    result["single_bleus"] = singles
    result["ensemble_bleu"] = pair["tok_lc_bleu"]
    result["ensemble_sacrebleu"] = pair["sacrebleu"]
    result["ensemble_runs"] = {"config": "configs/multi30k_en_de_quick.toml", "seeds": [1, 2],
                               "steps": args.ensemble_steps}

    result.update({
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "commit": commit,
        "uncommitted": uncommitted,
        "date": datetime.date.today().isoformat(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "sacrebleu": sacrebleu.__version__},
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, threads {torch.get_num_threads()}",
    })
    write_result(results, "decoding_features", result, markdown)
    print(json.dumps(result, indent=2))


def markdown(r: dict) -> str:
    rows = [("n-best first = plain 1-best (fraction of sentences)", r["nbest_matches_plain"]),
            ("forced score - beam score, largest difference", f"{r['score_matches_beam']:.2e}"),
            ("constraints present in the outputs (fraction)", f"{r['constraint_coverage']} of {r['constraints']}"),
            ("tok. lc BLEU, plain / with reference constraints",
             f"{r['plain_bleu']['tok_lc_bleu']} / {r['constrained_bleu']['tok_lc_bleu']} "
             f"({r['constraints_bleu_delta']:+})"),
            ("sentences/s, plain / constrained", f"{r['plain_sents_per_s']} / {r['constrained_sents_per_s']}"),
            ("quick recipe, seeds 1 and 2: tok. lc BLEU alone / ensemble",
             f"{r['single_bleus'][0]['tok_lc_bleu']}, {r['single_bleus'][1]['tok_lc_bleu']} / {r['ensemble_bleu']}")]
    text = (f"# Decoding features on Multi30k EN→DE test2016\n\n`{r['command']}` at {r['commit']}, {r['date']}, "
            f"{r['machine']}; run {r['run']}, beam {r['beam']}, α {r['alpha']}\n\n| | |\n|---|---|\n"
            + "".join(f"| {a} | {b} |\n" for a, b in rows))
    return text


if __name__ == "__main__":
    main()
