"""Multi30k quality benchmark: train a recipe from scratch, average, translate test2016, score.

    python benchmarks/multi30k.py --pair en_de [--minutes 90] [--out runs/bench_en_de] [--decode-only]

Writes benchmarks/results/multi30k_{pair}.json and .md with test2016 BLEU in both forms (detokenized
cased sacreBLEU with its signature; the Multi30k literature's tokenized lowercased BLEU against
multi30k/tok/), chrF, training wall time and tokens/s, and a curve: BLEU of the checkpoint reached
after 15, 30, 60, ... minutes. Run it alone on the machine: it is a timing, too.
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

import sacrebleu
import torch

from transformer.checkpoint import list_checkpoints, load_checkpoint
from transformer.data import read_lines, resolve_data_path
from transformer.evaluate import sacrebleu_scores, tok_lc_bleu
from transformer.translator import Translator

from common import train_or_reread

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CURVE_MINUTES = (15, 30, 45, 60, 75, 90, 120)


def score(translator: Translator, src: list[str], ref: list[str], tok_ref: list[str], lang: str) -> dict:
    start = time.monotonic()
    hyps = translator.translate(src)
    seconds = time.monotonic() - start
    scores = sacrebleu_scores(hyps, ref)
    return {"tok_lc_bleu": round(tok_lc_bleu(hyps, tok_ref, lang), 2), "sacrebleu": round(scores["bleu"], 2),
            "chrf": round(scores["chrf"], 2), "signature": scores["signature"],
            "translate_seconds": round(seconds, 1), "hyps": hyps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="en_de", choices=["en_de", "en_fr"])
    parser.add_argument("--minutes", type=float, help="training budget (default: the recipe's max_minutes)")
    parser.add_argument("--out", type=Path, help="run folder (default runs/bench_{pair}); new, unless --decode-only")
    parser.add_argument("--set", action="append", default=[], help="extra config overrides")
    parser.add_argument("--decode-only", action="store_true", help="do not train: score the checkpoints of the "
                        "finished run in --out again (after a change to decoding)")
    args = parser.parse_args()
    config = ROOT / "configs" / f"multi30k_{args.pair}.toml"
    out = args.out or ROOT / "runs" / f"bench_{args.pair}"
    # every checkpoint is kept, so the curve can score the one reached after 15, 30, ... minutes
    cfg, summary, overrides = train_or_reread(config, out, args.set, args.minutes, args.decode_only)
    d, lang = cfg.data, cfg.data.tgt_lang
    src, ref = read_lines(resolve_data_path(d.test_src)), read_lines(resolve_data_path(d.test_tgt))
    tok_ref = read_lines(resolve_data_path(d.test_tok_ref))

    curve = []
    checkpoints = [(load_checkpoint(p, with_state=False).meta, p) for p in list_checkpoints(out)]
    for minutes in CURVE_MINUTES:
        reached = [(m, p) for m, p in checkpoints if m["train_state"]["elapsed_s"] <= 60 * minutes + 30]
        if not reached or minutes > summary["train_minutes"] + 1:
            continue
        meta, path = reached[-1]
        s = score(Translator(out, path, log=lambda m: None), src, ref, tok_ref, lang)
        curve.append({"minutes": minutes, "step": meta["step"], "checkpoint": path.stem,
                      "tok_lc_bleu": s["tok_lc_bleu"], "sacrebleu": s["sacrebleu"]})
        print(f"curve: {curve[-1]}", flush=True)

    meta, path = checkpoints[-1]  # the last checkpoint alone, beside the average the recipe decodes with
    s = score(Translator(out, path, log=lambda m: None), src, ref, tok_ref, lang)
    last = {"step": meta["step"], "checkpoint": path.stem, "tok_lc_bleu": s["tok_lc_bleu"], "sacrebleu": s["sacrebleu"]}
    print(f"last checkpoint: {last}", flush=True)

    final = score(Translator(out, log=print), src, ref, tok_ref, lang)  # average of the last N (§6.1)
    (out / "test2016.hyp").write_text("".join(h + "\n" for h in final.pop("hyps")), encoding="utf-8")
    result = {
        "pair": args.pair, "tok_lc_bleu": final["tok_lc_bleu"], "sacrebleu": final["sacrebleu"],
        "sacrebleu_signature": final["signature"], "chrf": final["chrf"],
        "train_minutes": round(summary["train_minutes"], 2), "train_tokens_per_s": round(summary["tokens_per_s"]),
        "steps": summary["step"], "valid_ppl": round(summary["valid_ppl"], 3),
        "averaged_checkpoints": cfg.decode.average_last, "beam": cfg.decode.beam_size, "alpha": cfg.decode.alpha,
        "translate_seconds": final["translate_seconds"], "last_checkpoint": last, "curve": curve,
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "config": str(config.relative_to(ROOT)), "overrides": overrides,
        "date": datetime.date.today().isoformat(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "sacrebleu": sacrebleu.__version__},
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, threads {torch.get_num_threads()}",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"multi30k_{args.pair}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    rows = "\n".join(f"| {c['minutes']} | {c['step']} | {c['tok_lc_bleu']} | {c['sacrebleu']} |" for c in curve)
    (RESULTS / f"multi30k_{args.pair}.md").write_text(f"""# Multi30k {args.pair.replace('_', '→').upper()}, test2016

`{result['command']}` — {result['date']}, {result['machine']}; torch {torch.__version__}, sacrebleu {sacrebleu.__version__}

| metric | value |
|---|---|
| tokenized lowercased BLEU (Moses lc+norm+tok, multi30k/tok refs) | **{result['tok_lc_bleu']}** |
| sacreBLEU (detokenized, cased) | {result['sacrebleu']} |
| signature | `{result['sacrebleu_signature']}` |
| chrF | {result['chrf']} |
| training | {result['train_minutes']} min, {result['steps']} steps, {result['train_tokens_per_s']} target tokens/s |
| decoding | average of last {result['averaged_checkpoints']} checkpoints, beam {result['beam']}, α {result['alpha']}: {result['translate_seconds']} s for 1,000 sentences |
| last checkpoint alone (step {last['step']}) | tok. lc BLEU {last['tok_lc_bleu']}, sacreBLEU {last['sacrebleu']} |

BLEU of the single checkpoint reached after N minutes of training:

| minutes | step | tok. lc BLEU | sacreBLEU |
|---|---|---|---|
{rows}
""", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
