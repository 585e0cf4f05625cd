"""A constraint the plain output already meets: how often lexically constrained beam search still returns
another output, of a lower score (docs/decoding.md, `--constraints`).

    python benchmarks/constraint_kept.py [--run RUN_DIR] [--sentences 40] [--before DIR [--before-label TEXT]]

For each of the first N test2016 sentences: the plain beam search's best output and its score, then the same
search with the longest word of that output as the sentence's one constraint. The plain output meets it, and
was the best the plain search found; a constrained output of a lower score is one the bank allocation lost on
the way. Beams 4 and 8. Default run: the tests' small reference model (tests/data/decode_reference), so the
reading needs no training and is the same on every machine (no timing). ``--before DIR``: a folder holding an
earlier ``transformer/`` package, measured in the same run, in a process of its own. Writes
benchmarks/results/constraint_kept.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from common import ROOT, positive, trained_run
from provenance import add_results_option, code_state, commit_text, results_folder, write_result

BEAMS = (4, 8)


def measure(run: Path, sentences: int) -> dict:
    """Per beam: the sentences with a word in their plain output, and how many constrained outputs scored
    lower, higher or the same (within 1e-4)."""
    import torch

    import transformer
    from transformer.data import read_lines
    from transformer.prepare import resolve_data_path
    from transformer.request import DecodeRequest
    from transformer.translator import Translator

    torch.set_num_threads(1)
    translator = Translator(run, log=lambda m: None, device="cpu")
    lines = read_lines(resolve_data_path("multi30k/test_2016_flickr.en.gz"))[:sentences]
    beams = {}
    for beam in BEAMS:
        plain = [hyps[0] for hyps in translator.decode(lines, DecodeRequest(beam_size=beam))]
        kept = [i for i, (text, _) in enumerate(plain) if text.split()]
        words = [max(plain[i][0].split(), key=len).strip(".,;:!?") for i in kept]
        constrained = translator.decode([lines[i] for i in kept],
                                        DecodeRequest(beam_size=beam, constraints=[[w] for w in words]))
        change = [hyps[0][1] - plain[i][1] for i, hyps in zip(kept, constrained)]
        beams[str(beam)] = {"sentences": len(kept), "lower": sum(d < -1e-4 for d in change),
                            "higher": sum(d > 1e-4 for d in change), "same": sum(abs(d) <= 1e-4 for d in change)}
    return {"package": str(Path(transformer.__file__).parent), "beams": beams}


def in_process(package_root: Path, run: Path, sentences: int) -> dict:
    """``measure`` in a fresh interpreter importing the ``transformer`` package under ``package_root``."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(package_root), str(ROOT / "benchmarks")])}
    done = subprocess.run([sys.executable, __file__, "--worker", str(run), str(sentences)], env=env,
                          capture_output=True, text=True, cwd=package_root)
    if done.returncode:
        sys.exit(f"the measurement with {package_root}/transformer failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def markdown(r: dict) -> str:
    rows = "\n".join(f"| {name} | {beam} | {b['sentences']} | {b['lower']} | {b['higher']} | {b['same']} |"
                     for name in ("before", "after") if name in r for beam, b in r[name]["beams"].items())
    before = f" Before: {r['before_package']}." if "before" in r else ""
    return f"""# A constraint the plain output already meets

`{r['command']}` — {r['date']}, {commit_text(r)}; torch {r['torch']}. Run: `{r['run']}`, the first
{r['sentences']} test2016 sentences; each one's constraint is the longest word of its plain beam output.{before}

| code | beam | sentences | constrained output scored lower | higher | the same |
|---|---|---|---|---|---|
{rows}

"lower": the constrained search lost the plain output (which meets the constraint) and returned a worse one.
"after" is this commit's search: hypotheses that have written every phrase and that plain beam search would
keep go first, before the banks take their turns (constraints.bank_order).
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, default=ROOT / "tests" / "data" / "decode_reference")
    parser.add_argument("--sentences", type=positive, default=40)
    parser.add_argument("--before", type=Path, help="a folder holding an earlier transformer/ package")
    parser.add_argument("--before-label", help="what --before holds, for the result (default: its path), e.g. "
                        "'the package of commit abc1234' after `git archive abc1234 transformer | tar -x -C DIR`")
    add_results_option(parser, "constraint_kept.json / .md")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(Path(args.worker[0]), int(args.worker[1]))))
        return
    results = results_folder(parser, args.results)
    run = trained_run(args.run.resolve())
    if args.before and not (args.before / "transformer" / "__init__.py").is_file():
        parser.error(f"--before {args.before}: no transformer/ package there")
    import torch

    state = code_state()
    result = {"date": datetime.date.today().isoformat(), **state,
              "command": shlex.join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
              "run": os.path.relpath(run, ROOT), "sentences": args.sentences, "torch": torch.__version__}
    if args.before:
        result["before"] = in_process(args.before.resolve(), run, args.sentences)
        result["before_package"] = args.before_label or str(args.before)
    result["after"] = in_process(ROOT, run, args.sentences)
    write_result(results, "constraint_kept", result, markdown)
    print(markdown(result))


if __name__ == "__main__":
    main()
