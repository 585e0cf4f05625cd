"""The README's two commands on a fresh clone, timed: what a new user gets.

    python benchmarks/fresh_clone.py [--keep]

Clones this repository's HEAD (committed files only) into a temporary folder, with the data beside
it as CI has it (``shared`` → this checkout's ../shared), and runs there, each timed from start to
exit: `bash scripts/quickstart.sh` (install, train Multi30k EN→DE for 10 minutes, translate, BLEU on
test2016), then `bash scripts/test.sh` (install, the whole test suite). Records the wall times, the
quick start's updates, tokens/s and BLEU, and the suite's counts. Writes
benchmarks/results/fresh_clone.json and .md. Run it alone on the machine: the quick start's
training is bounded by minutes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import add_results_option, results_folder, write_result, write_whole  # noqa: E402
from speed import cpu_model  # noqa: E402  (the quick start's precision "auto" follows the CPU)


def trained_in(train_log: str) -> str:
    """The precision a run trained in, as its train.log's model line says it ("bf16 (auto)"): the quick start's
    "auto" takes bf16 on a CPU with bf16 units and fp32 elsewhere, which halves or doubles its updates."""
    match = re.search(r"; (\w+(?: \(auto\))?) on \w+;", train_log)
    return match.group(1) if match else "unknown"


def timed(command: list[str], cwd: Path, log: Path) -> tuple[float, str]:
    """Runs ``command`` in ``cwd`` as a user would (a clean environment but for PATH and HOME);
    returns (seconds, output). Fails with the output's tail."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    start = time.monotonic()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    log.write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode:
        sys.exit(f"{' '.join(command)} failed ({proc.returncode}) on the fresh clone; log: {log}\n"
                 f"{(proc.stdout + proc.stderr)[-3000:]}")
    return seconds, proc.stdout + proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    add_results_option(parser, "fresh_clone.json / .md")
    args = parser.parse_args()
    results = results_folder(parser, args.results)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    if subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                      text=True, check=True).stdout.strip():
        print(f"note: the working tree has uncommitted changes; the clone is of HEAD ({commit}) only")
    base = Path(tempfile.mkdtemp(prefix="transformer-fresh-"))
    try:
        clone = base / "transformer"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        (base / "shared").symlink_to((ROOT.parent / "shared").resolve())
        print(f"quick start on a fresh clone of {commit} in {clone}", flush=True)
        quick_s, _ = timed(["bash", "scripts/quickstart.sh"], clone, base / "quickstart.log")
        summary = json.loads((clone / "runs/quickstart/summary.json").read_text())
        precision = trained_in((clone / "runs/quickstart/train.log").read_text(encoding="utf-8"))
        scores = json.loads((clone / "runs/quickstart/test2016.json").read_text())
        print("tests on the fresh clone", flush=True)
        test_s, out = timed(["bash", "scripts/test.sh"], clone, base / "test.log")
        # pytest's summary line (pip may print notices after it)
        summary_line = [line for line in out.splitlines() if re.search(r"\d+ passed", line)][-1]
        counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|skipped|failed|deselected)", summary_line)}
    finally:
        if args.keep:
            print(f"kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    result = {
        "commit": commit, "date": datetime.date.today().isoformat(),
        "quickstart": {"command": "bash scripts/quickstart.sh", "seconds": round(quick_s),
                       "updates": summary["step"], "train_minutes": round(summary["train_minutes"], 2),
                       "precision": precision,
                       "tokens_per_s": round(summary["tokens_per_s"]), "sacrebleu": round(scores["bleu"], 2),
                       "chrf": round(scores["chrf"], 2), "tok_lc_bleu": round(scores["tok_lc_bleu"], 2)},
        "tests": {"command": "bash scripts/test.sh", "seconds": round(test_s), **counts},
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}", "cpu_model": cpu_model(),
    }
    write_result(results, "fresh_clone", result)  # the reading, then its page
    q, t = result["quickstart"], result["tests"]
    write_whole(results / "fresh_clone.md", f"""# The README's two commands on a fresh clone of {commit}

`python benchmarks/fresh_clone.py` — {result['date']}, {result['machine']} ({result['cpu_model']})

| command | wall time | result |
|---|---|---|
| `{q['command']}` | {q['seconds'] // 60} min {q['seconds'] % 60} s | {q['updates']:,} updates in {q['train_minutes']} min in {q['precision']} ({q['tokens_per_s']:,} target tokens/s); test2016 sacreBLEU {q['sacrebleu']}, chrF {q['chrf']}, tok. lc BLEU {q['tok_lc_bleu']} |
| `{t['command']}` | {t['seconds'] // 60} min {t['seconds'] % 60} s | {', '.join(f'{n} {k}' for k, n in counts.items())} |
""")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
