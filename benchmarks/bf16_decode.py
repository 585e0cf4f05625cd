"""Decoding in bf16 (`translate --bf16`) against fp32 and int8: speed and BLEU on Multi30k EN→DE test2016.

    python benchmarks/bf16_decode.py [--device cpu|cuda] [--run RUN_DIR] [--out runs] [--steps 1300] [--repeat 3]
                                     [--b1-sentences 200]

The run (--run; default the quick recipe, configs/multi30k_en_de_quick.toml, step-bounded at --steps updates so
that it does not depend on the machine's speed, trained into OUT/bf16_quick or read back) decodes test2016 with
its own settings (beam 4, α 0.6, §6.1) three ways, each loaded once: fp32 (the default), bf16 (every weight, the
products and the cached keys and values in bf16; the search's scores fp32) and int8 (`--int8`, for scale; CPU
only: on a GPU the two others). Speed:
sentences per second over the decoding alone, at batch 1 on the first --b1-sentences sentences and at batch 64 on
all of them, the three ways interleaved --repeat times (median, and min–max: a shared machine's hour moves each
reading). Quality: tokenized lowercased BLEU (the Multi30k literature's) and sacreBLEU of each way's outputs, and
how many outputs differ from fp32's. Whether the processor multiplies bf16 itself (AVX512-BF16 or AMX; a GPU since
Ampere) is recorded: elsewhere bf16 is emulated and slower. Writes benchmarks/results/bf16_decode.json and .md
(bf16_decode_cuda.* with --device cuda).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import sacrebleu
import torch

from transformer.config import load_config
from transformer.evaluate import sacrebleu_scores, tok_lc_bleu
from transformer.request import DecodeRequest
from transformer.runtime import native_bf16
from transformer.translator import Translator

from common import ROOT, test_set, train_or_resume, trained_run
from provenance import add_results_option, code_state, commit_text, results_folder, write_result, write_whole

WAYS = {"fp32": {}, "bf16": {"bf16": True}, "int8": {"int8": True}}


def quick_run(out: Path, steps: int) -> Path:
    """The quick recipe, step-bounded at ``steps`` updates, trained or read back."""
    run = out / "bf16_quick"
    train_or_resume(load_config(str(ROOT / "configs" / "multi30k_en_de_quick.toml"),
                                [f"train.max_steps={steps}", "train.max_minutes=0"]), run)
    return run


def sents_per_s(translator: Translator, lines: list[str], batch: int) -> tuple[float, list[str]]:
    start = time.perf_counter()
    out = translator.translate(lines, DecodeRequest(batch_size=batch))
    return len(lines) / (time.perf_counter() - start), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to decode")
    parser.add_argument("--run", type=Path, help="the EN→DE run to decode (default: the quick recipe, trained)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs", help="where the default run goes")
    parser.add_argument("--steps", type=int, default=1300, help="updates of the default run")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds of the three ways")
    parser.add_argument("--b1-sentences", type=int, default=200, help="sentences decoded at batch 1")
    parser.add_argument("--markdown", action="store_true", help="rewrite the .md from the JSON already there "
                        "(with --device: which)")
    add_results_option(parser, "bf16_decode.json / .md (bf16_decode_cuda.* with --device cuda)")
    args = parser.parse_args()
    results = results_folder(parser, args.results, make=not args.markdown)
    name = "bf16_decode" + ("_cuda" if args.device == "cuda" else "")
    if args.markdown:
        if not (results / f"{name}.json").is_file():
            parser.error(f"--markdown: no {name}.json in {results} to rewrite the page from")
        recorded = json.loads((results / f"{name}.json").read_text(encoding="utf-8"))
        write_whole(results / f"{name}.md", markdown(recorded))
        return
    if args.repeat < 1 or args.b1_sentences < 1 or args.steps < 1:
        parser.error("--repeat, --b1-sentences and --steps must be at least 1")
    if args.run:
        trained_run(args.run)
    state = code_state()  # the code at the start: later commits during the run must not be recorded
    run = args.run or quick_run(args.out, args.steps)
    ways = [w for w in WAYS if not (w == "int8" and args.device != "cpu")]  # int8 kernels run on the CPU only
    translators = {name: Translator(run, log=print, device=args.device, **WAYS[name]) for name in ways}
    cfg = translators["fp32"].cfg
    src, refs, tok_refs = test_set(cfg)
    settings = {"batch 1": (1, src[:args.b1_sentences]), "batch 64": (64, src)}
    for t in translators.values():  # first calls (allocations, oneDNN's kernels) in no reading
        t.translate(src[:8], DecodeRequest(batch_size=8))
    readings: dict[str, dict[str, list[float]]] = {s: {w: [] for w in ways} for s in settings}
    outputs: dict[str, list[str]] = {}
    for _ in range(args.repeat):
        for setting, (batch, lines) in settings.items():
            for way, translator in translators.items():
                rate, out = sents_per_s(translator, lines, batch)
                readings[setting][way].append(rate)
                if batch == 64:
                    outputs[way] = out
    speed = {setting: {way: {"median": round(statistics.median(r), 1), "min": round(min(r), 1),
                             "max": round(max(r), 1), "runs": [round(x, 1) for x in r]}
                       for way, r in ways.items()} for setting, ways in readings.items()}
    quality = {way: {"tok_lc_bleu": round(tok_lc_bleu(out, tok_refs, "de"), 2),
                     "sacrebleu": round(sacrebleu_scores(out, refs)["bleu"], 2),
                     "outputs_differing_from_fp32": sum(a != b for a, b in zip(out, outputs["fp32"]))}
               for way, out in outputs.items()}
    result = {
        "run": os.path.relpath(run, ROOT), "sentences": len(src), "b1_sentences": len(settings["batch 1"][1]),
        "device": args.device, "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
        "beam": cfg.decode.beam_size, "alpha": cfg.decode.alpha, "native_bf16": native_bf16(torch.device(args.device)),
        "speed_sents_per_s": speed, "quality": quality,
        "bf16_vs_fp32": {s: round(v["bf16"]["median"] / v["fp32"]["median"], 3) for s, v in speed.items()},
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]), **state,
        "date": datetime.date.today().isoformat(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "sacrebleu": sacrebleu.__version__},
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, threads {torch.get_num_threads()}",
    }
    write_result(results, name, result, markdown)
    print(json.dumps(result, indent=2))


def markdown(r: dict) -> str:
    speed_rows = "".join(
        f"| {way} | " + " | ".join(f"{r['speed_sents_per_s'][s][way]['median']} "
                                   f"({r['speed_sents_per_s'][s][way]['min']}–{r['speed_sents_per_s'][s][way]['max']})"
                                   for s in r["speed_sents_per_s"])
        + f" | {r['quality'][way]['tok_lc_bleu']} | {r['quality'][way]['sacrebleu']} | "
          f"{r['quality'][way]['outputs_differing_from_fp32']} |\n" for way in r["quality"])
    ratio = ", ".join(f"{s} {v}×" for s, v in r["bf16_vs_fp32"].items())
    # the rounds interleave the ways: each round's bf16 against the same round's fp32, the spread a median hides
    paired = {s: [b / f for b, f in zip(v["bf16"]["runs"], v["fp32"]["runs"])]
              for s, v in r["speed_sents_per_s"].items()}
    rounds = ", ".join(f"{s} {min(x):.2f}–{max(x):.2f}×" for s, x in paired.items())
    where = r["gpu"] or "CPU"
    return (f"# Decoding in bf16: Multi30k EN→DE test2016, {where}\n\n`{r['command']}` — {r['date']}, "
            f"{commit_text(r)}, {r['machine']}, torch {r['versions']['torch']}; run `{r['run']}`, beam {r['beam']}, "
            f"α {r['alpha']}. This processor multiplies bf16 itself (AVX512-BF16 or AMX; a GPU since Ampere): "
            f"{'yes' if r['native_bf16'] else 'no (emulated: slower)'}.\n\n"
            f"| way | batch 1 ({r['b1_sentences']} sentences), sent/s | batch 64 ({r['sentences']}), sent/s | "
            f"tok. lc BLEU | sacreBLEU | outputs ≠ fp32 |\n|---|---|---|---|---|---|\n{speed_rows}\n"
            f"Median of {len(next(iter(r['speed_sents_per_s'].values()))['fp32']['runs'])} interleaved rounds "
            f"(min–max); bf16 against fp32, medians: {ratio}; round by round: {rounds}. Readings of one machine "
            "in one hour: "
            "a ratio is no firmer than the min–max ranges beside it.\n")


if __name__ == "__main__":
    main()
