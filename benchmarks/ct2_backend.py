"""Why CTranslate2's int8 is slow at batch 1 on this machine: its matrix-product backend, measured.

    python benchmarks/ct2_backend.py --run RUN_DIR [--b1-sentences 200] [--repeat 3]

speed.md reads CTranslate2 int8 at batch 1 far below its own fp32. CTranslate2 picks its GEMM backend
at start-up from the CPU's vendor (src/cpu/backend.cc): Intel MKL on a GenuineIntel CPU, oneDNN
(DNNL) on any other x86 one such as this AMD EPYC, unless CT2_USE_MKL=1 forces MKL (the PyPI wheel
carries both). Weight packing (CT2_PACKED_GEMM) exists only under MKL. This script translates the
same test2016 sentences with the run's weights exported to CTranslate2 fp32 and int8, at batch 64
and batch 1, once with the backend CTranslate2 picks here and once with MKL forced, each in a warm
process of its own with speed.py's process settings (speed_worker.py), and records the backend each
process reported (CT2_VERBOSE=1) beside its sentences/s; and, with the backend it picks, batch 1 on
one thread (intra_threads=1) against speed.py's two.

Writes benchmarks/results/ct2_backend.json and .md. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import sys
from pathlib import Path

import ctranslate2
import torch

from transformer.checkpoint import list_checkpoints
from transformer.data import read_lines
from transformer.export import export_ctranslate2
from transformer.prepare import resolve_data_path
from transformer.tokenizer import Tokenizer

from common import ROOT, trained_run
from provenance import add_results_option, code_state, results_folder, write_result
from speed import DECODE, cpu_model, log, worker

BACKENDS = {"picked": {}, "mkl_forced": {"CT2_USE_MKL": "1"}}
TEST = "multi30k/test_2016_flickr.en.gz"


def reported(log_text: str) -> dict[str, str]:
    """The lines CTranslate2 prints about its CPU set-up under CT2_VERBOSE=1 (vendor, ISA, backends)."""
    out = {}
    for line in log_text.splitlines():
        if m := re.search(r"\[info\]\s+(?:- )?(CPU|Selected ISA|Use Intel MKL|SGEMM backend|GEMM_S8 backend"
                          r"|GEMM_S16 backend):\s*(.*)$", line):
            out[m.group(1)] = m.group(2).strip()
    return out


def measure(run: Path, b1: int, repeat: int, work: Path) -> dict:
    tok = Tokenizer(run / "spm.model")
    vocab = tok.vocabulary()
    sources = [[vocab[i] for i in ids] for ids in tok.encode_batch(read_lines(resolve_data_path(TEST)))]
    last = list_checkpoints(run)[-1]
    models = {}
    for q in ("float32", "int8"):
        models[q] = work / f"ct2_{q}"
        export_ctranslate2(run, models[q], last, None if q == "float32" else "int8", overwrite=True, log=log)
    python = Path(sys.executable)
    runs = {}
    settings = [(backend, q, batch, 2) for backend in BACKENDS for q in models for batch in (64, 1)]
    settings += [("picked", q, 1, 1) for q in models]  # the same search on one thread
    for backend, q, batch, threads in settings:
        env, model, n = BACKENDS[backend], models[q], len(sources) if batch == 64 else b1
        name = f"{backend}_{q}_b{batch}" + ("_t1" if threads == 1 else "")
        r = worker((python, "speed_worker.py", "ctranslate2", {"model": str(model), "threads": threads}),
                   name, {"batch": batch, "repeat": repeat, "sources": sources[:n]}, work, {"CT2_VERBOSE": "1", **env})
        logged = (work / f"worker_{name}_b{batch}_beam{DECODE['beam']}.log").read_text(encoding="utf-8")
        runs[name] = {"backend": backend, "compute_type": q, "batch": batch, "threads": threads, "sentences": n,
                      "seconds": round(r["seconds"], 3), "sents_per_s": round(n / r["seconds"], 2),
                      "reported": reported(logged)}
        log(f"{name}: {runs[name]['sents_per_s']} sentences/s, {runs[name]['reported']}")
    return runs


def markdown(r: dict) -> str:
    rows = "\n".join(f"| {v['backend']} | {v['reported'].get('SGEMM backend', '?')} / "
                     f"{v['reported'].get('GEMM_S8 backend', '?')} | {v['compute_type']} | {v['batch']} | "
                     f"{v['threads']} | {v['sents_per_s']} |" for v in r["runs"].values())
    cpu = next(iter(r["runs"].values()))["reported"]
    return f"""# CTranslate2's CPU backend on this machine, fp32 and int8

`{r['command']}` — {r['date']}, commit {r['commit']}, {r['machine']} ({r['cpu_model']}); CTranslate2
{r['versions']['ctranslate2']}; the weights of `{r['run']}` on test2016 (batch 64: all
{r['sentences']} sentences; batch 1: the first {r['b1_sentences']}), beam 4, α 0.6, 2 threads, best of
{r['repeat']}.

CTranslate2 reports: CPU {cpu.get('CPU', '?')}, ISA {cpu.get('Selected ISA', '?')}, Intel MKL
{cpu.get('Use Intel MKL', '?')} when it picks for itself.

| backend | SGEMM / GEMM_S8 (as reported) | compute type | batch | threads | sentences/s |
|---|---|---|---|---|---|
{rows}

int8 ÷ fp32 at batch 1: {r['int8_over_fp32_b1']['picked']} with the backend CTranslate2 picks here,
{r['int8_over_fp32_b1']['mkl_forced']} with MKL forced, {r['int8_over_fp32_b1']['picked_one_thread']} on one thread.
int8 at batch 1, one thread ÷ two: {r['int8_b1_one_over_two_threads']}.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="a trained run folder (its last checkpoint is used)")
    parser.add_argument("--b1-sentences", type=int, default=200, help="sentences translated at batch 1")
    parser.add_argument("--repeat", type=int, default=3, help="timings per setting (best kept)")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "ct2_backend", help="exports and logs")
    add_results_option(parser, "ct2_backend.json / .md")
    args = parser.parse_args()
    results = results_folder(parser, args.results)
    trained_run(args.run)
    args.work.mkdir(parents=True, exist_ok=True)
    code = code_state()
    runs = measure(args.run, args.b1_sentences, args.repeat, args.work)

    def rate(name: str) -> float:
        return runs[name]["sents_per_s"]

    ratio = {b: round(rate(f"{b}_int8_b1") / rate(f"{b}_float32_b1"), 2) for b in BACKENDS}
    ratio["picked_one_thread"] = round(rate("picked_int8_b1_t1") / rate("picked_float32_b1_t1"), 2)
    result = {"runs": runs, "int8_over_fp32_b1": ratio,
              "int8_b1_one_over_two_threads": round(rate("picked_int8_b1_t1") / rate("picked_int8_b1"), 1),
              "run": os.path.relpath(args.run.resolve(), ROOT),
              "sentences": runs["picked_float32_b64"]["sentences"], "b1_sentences": args.b1_sentences,
              "repeat": args.repeat, "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
              **code,
              "date": datetime.date.today().isoformat(), "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}",
              "cpu_model": cpu_model(), "versions": {"python": platform.python_version(), "torch": torch.__version__,
                                                     "ctranslate2": ctranslate2.__version__}}
    write_result(results, "ct2_backend", result, markdown)
    print(markdown(result))


if __name__ == "__main__":
    main()
