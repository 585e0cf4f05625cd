"""Decoding speed before and after the decoder-step rewrite (issue 43), measured in one run on one device:
the quick-start model and bench-small on test2016, beam 4, α 0.6, input + 50, the paper's exact stop.

    python benchmarks/gpu_decode.py --before DIR [--device cuda] [--runs quick=RUN small=RUN]

``--before`` is a folder holding the package as it was (``git archive 979b027 transformer | tar -x -C DIR``);
the package of this checkout is "after". Every (code, model, batch size) is timed in a process of its
own: the model loaded and one batch decoded untimed, then test2016's sentences (at batch 1 the first
``--b1-sentences``) decoded ``--repeat`` times, the best kept; sentences/s counts sentences over the
decoding alone (sorting, batching and the search included; encoding the text and loading excluded).
Both codes must give the same number of outputs; how many outputs differ between them is counted
(near-ties can flip: the two do their sums in different orders). ``--rounds`` measures the codes in
alternating processes that many times and keeps each code's best: on a shared 2-core machine one
process can read 15% slower than the next, and the per-round speed-ups are recorded as the spread.

Writes benchmarks/results/gpu_decode.json and .md for cuda (cpu_decode.* for --device cpu, where
``--ctranslate2`` adds CTranslate2 fp32/int8 and our int8 on the same sentences, through speed.py's
workers, and the start-up of `translate` on one sentence beside `import torch`'s). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import add_results_option, code_state, results_folder, write_result, write_whole

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BATCHES = (1, 64, 512)


def as_this_package_reads(run: Path) -> Path:
    """``run`` as the package of this process reads it: a copy beside it whose configs (config.toml, each
    checkpoint record's) hold only the keys that package's Config knows, and a training precision it takes.
    A run trained by today's package holds keys added since the "before" package (train.init_qkv_gain, ...,
    precision "auto"), which that package refuses as unknown; none of them changes how the weights decode.
    The other files are links to the run's own (the records' checksums are of the weights)."""
    import dataclasses
    import tomllib

    import tomli_w

    from transformer.config import Config

    defaults = Config()
    known = {f.name: {g.name for g in dataclasses.fields(getattr(defaults, f.name))}
             for f in dataclasses.fields(Config)}

    def readable(config: dict) -> dict:
        out = {section: {k: v for k, v in values.items() if k in known.get(section, ())}
               for section, values in config.items() if section in known}
        if out.get("train", {}).get("precision") == "auto":  # before "auto" existed; training's, not decoding's
            out["train"]["precision"] = "fp32"
        return out

    copy = Path(tempfile.mkdtemp(prefix=f"{run.name}.", dir=run.parent))
    atexit.register(shutil.rmtree, copy, ignore_errors=True)
    (copy / "checkpoints").mkdir()
    for path in run.iterdir():
        if path.is_file() and path.name != "config.toml":
            (copy / path.name).symlink_to(path.resolve())
    if (run / "config.toml").is_file():
        (copy / "config.toml").write_text(tomli_w.dumps(readable(tomllib.loads((run / "config.toml").read_text()))))
    for path in (run / "checkpoints").iterdir():
        if path.suffix == ".json":
            record = json.loads(path.read_text())
            record["config"] = readable(record["config"])
            (copy / "checkpoints" / path.name).write_text(json.dumps(record))
        else:
            (copy / "checkpoints" / path.name).symlink_to(path.resolve())
    return copy


def worker(run: str, batch: int, sentences: int, repeat: int, device: str, data: str) -> dict:
    """Runs in a process whose PYTHONPATH holds the code measured; prints its result as JSON."""
    import torch

    from transformer.checkpoint import list_checkpoints
    from transformer.data import encode_for_decoding, read_lines
    from transformer.decode import decode_ids
    from transformer.translator import Translator

    run = as_this_package_reads(Path(run))
    translator = Translator(run, list_checkpoints(run)[-1], log=lambda m: None, device=device)
    lines = read_lines(Path(data))[:sentences]
    sources = encode_for_decoding(lines, translator.tokenizer)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    seconds, outputs = [], None
    with torch.inference_mode():
        decode_ids(translator.model, sources[:batch], batch_size=batch)  # warm-up: kernels, allocator
        for _ in range(repeat):
            sync()
            start = time.perf_counter()
            outputs = decode_ids(translator.model, sources, batch_size=batch)
            sync()
            seconds.append(time.perf_counter() - start)
    import transformer

    best = min(seconds)
    # the first pass meets most of the batches' shapes for the first time, as a file translated once does: on a
    # GPU, what per-shape work (cuDNN attention's execution plans) costs shows as its gap to the best
    return {"code": str(Path(transformer.__file__).parent), "sentences": len(sources), "seconds": round(best, 4),
            "sentences_per_s": round(len(sources) / best, 1),
            "first_pass_sentences_per_s": round(len(sources) / seconds[0], 1),
            "outputs": [h[0].tokens for h in outputs]}


def against_ctranslate2(run: Path, args) -> dict:
    """Ours (fp32, int8) and CTranslate2 (fp32, int8; ``transformer export`` of the same checkpoint) at
    batch 1 and 64 through benchmarks/speed.py's warm-process workers, with its process settings; the
    ratios speed.json reports (ours over CTranslate2's sentences/s)."""
    from speed import translation
    from transformer.checkpoint import list_checkpoints
    from transformer.data import read_lines
    from transformer.export import export_ctranslate2
    from transformer.prepare import resolve_data_path
    from transformer.tokenizer import Tokenizer

    work, last = ROOT / "runs" / "gpu_decode_cpu" / run.name, list_checkpoints(run)[-1]
    work.mkdir(parents=True, exist_ok=True)
    for q in ("float32", "int8"):
        export_ctranslate2(run, work / f"ct2_{q}", last, None if q == "float32" else "int8", overwrite=True,
                           log=lambda m: None)
    ours, py = {"run": str(run), "checkpoint": str(last)}, Path(sys.executable)
    systems = {"ours": (py, "speed_worker.py", "ours", ours), "ours_int8": (py, "speed_worker.py", "ours_int8", ours),
               "ctranslate2": (py, "speed_worker.py", "ctranslate2", {"model": str(work / "ct2_float32")}),
               "ctranslate2_int8": (py, "speed_worker.py", "ctranslate2", {"model": str(work / "ct2_int8")})}
    tok = Tokenizer(run / "spm.model")
    lines = read_lines(Path(args.data))
    refs = read_lines(resolve_data_path("multi30k/test_2016_flickr.de.gz"))
    vocab = tok.vocabulary()
    pieces = [[vocab[i] for i in ids] for ids in tok.encode_batch(lines)]
    pairs = {"translate_b64_vs_ctranslate2": ("ours_b64", "ctranslate2_b64"),
             "translate_b1_vs_ctranslate2": ("ours_b1", "ctranslate2_b1"),
             "int8_b64_vs_ctranslate2_int8": ("ours_int8_b64", "ctranslate2_int8_b64")}
    runs, per_round = {}, {k: [] for k in pairs}
    for _ in range(args.rounds):  # every system once per round; each one's best round kept
        got = translation(systems, pieces, args.b1_sentences, args.repeat, tok, refs, work)
        for key, (a, b) in pairs.items():
            per_round[key].append(round(got[a]["sents_per_s"] / got[b]["sents_per_s"], 3))
        runs = {k: max(v, runs.get(k, v), key=lambda r: r["sents_per_s"]) for k, v in got.items()}
    ratio = lambda a, b: round(runs[a]["sents_per_s"] / runs[b]["sents_per_s"], 3)  # noqa: E731
    return {"runs": runs, "ratios": {key: ratio(a, b) for key, (a, b) in pairs.items()}, "ratios_per_round": per_round}


def startup(run: Path, repeat: int = 5) -> dict:
    """Whole-process seconds, median of ``repeat``: ``python -c "import torch"`` and ``transformer translate
    RUN`` on one sentence (loading, the first step included), and what translating adds to the import."""
    import statistics
    import tempfile

    def seconds(cmd: list[str]) -> float:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            subprocess.run(cmd, input="", capture_output=True, text=True, check=True, cwd=ROOT)
            times.append(time.perf_counter() - start)
        return round(statistics.median(times), 3)

    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp) / "one.txt"
        one.write_text("A dog runs through the grass.\n", encoding="utf-8")
        torch_s = seconds([sys.executable, "-c", "import torch"])
        translate_s = seconds([sys.executable, "-m", "transformer", "translate", str(run), "--input", str(one)])
    return {"import_torch_s": torch_s, "translate_one_sentence_s": translate_s,
            "added_s": round(translate_s - torch_s, 3)}


def measure(code: Path, run: str, batch: int, args) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", run, str(batch),
           str(args.b1_sentences if batch == 1 else 1_000_000), str(args.repeat), args.device, args.data]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"{code} {run} batch {batch} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="folder holding the old transformer/ package (required)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--runs", nargs="+", default=["quick=runs/gpu/quick", "small=runs/gpu/small"],
                        help="NAME=RUN_DIR of each model measured")
    parser.add_argument("--data", default="runs/gpu/data/multi30k/test_2016_flickr.en.gz", help="test2016's English side")
    parser.add_argument("--b1-sentences", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure before and after (and the CTranslate2 comparison) in this many alternating rounds")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--ctranslate2", action="store_true",
                        help="CPU only: also CTranslate2 fp32 and int8 (and ours int8) on the same sentences, in "
                             "speed.py's workers and process settings, after the before/after pairs")
    add_results_option(parser, "gpu_decode.json / .md (cpu_decode.* on the CPU)")
    parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run, batch, sentences, repeat, device, data = args.worker
        print(json.dumps(worker(run, int(batch), int(sentences), int(repeat), device, data)))
        return
    if args.before is None:
        parser.error("--before DIR is required")
    results = results_folder(parser, args.results)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"benchmarks/{parser.prog} needs a CUDA GPU (or --device cpu)")
    name = "gpu_decode" if args.device.startswith("cuda") else "cpu_decode"
    state = code_state()
    result = {"date": datetime.date.today().isoformat(),
              "commit": state["commit"] or "unknown (no git where it ran)", "uncommitted": state["uncommitted"],
              "before": "979b027 (the search and step before issue 43's rewrite)",
              "command": "python benchmarks/gpu_decode.py " + " ".join(sys.argv[1:]),
              "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
              "torch": torch.__version__, "threads": torch.get_num_threads(), "models": {}}
    for spec in args.runs:
        label, run = spec.split("=", 1)
        rows = {}
        for batch in args.batches:
            before, after, speedups = None, None, []
            for _ in range(args.rounds):
                b, a = measure(args.before.resolve(), run, batch, args), measure(ROOT, run, batch, args)
                differ = sum(x != y for x, y in zip(b.pop("outputs"), a.pop("outputs")))
                assert b.pop("code") != a.pop("code"), "both processes imported the same package"
                speedups.append(round(b["seconds"] / a["seconds"], 2))
                before = b if before is None or b["seconds"] < before["seconds"] else before
                after = a if after is None or a["seconds"] < after["seconds"] else after
            rows[str(batch)] = {"before": before, "after": after, "speedup": round(before["seconds"] / after["seconds"], 2),
                                "speedup_per_round": speedups, "outputs_differing": differ}
            print(label, batch, rows[str(batch)], flush=True)
        result["models"][label] = {"run": run, "batches": rows}
        if args.ctranslate2:
            result["models"][label]["startup"] = startup(Path(run))
            result["models"][label]["ctranslate2"] = against_ctranslate2(Path(run), args)
            print(label, result["models"][label]["ctranslate2"], flush=True)
    write_result(results, name, result, indent=1)
    lines = [f"# Decoding before and after the step rewrite: {result['device']} ({result['date']}, commit "
             f"{result['commit']}, torch {result['torch']})", "", f"`{result['command']}`", "",
             f"Before: {result['before']}. test2016, beam 4, α 0.6, input + 50, the exact stop; sentences/s over "
             f"the decoding alone, best of the repeats, each setting in a process of its own; {args.rounds} "
             "alternating round(s), each code's best round kept, the rounds' own speed-ups beside it. The first pass "
             "of the best round's after-process meets most batch shapes for the first time, as a file translated "
             "once does.", "",
             "| model | batch | sentences | before (sent/s) | after (sent/s) | after, its first pass (sent/s) | "
             "speed-up | per round | outputs differing |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for label, m in result["models"].items():
        for batch, r in m["batches"].items():
            lines.append(f"| {label} | {batch} | {r['after']['sentences']} | {r['before']['sentences_per_s']} | "
                         f"{r['after']['sentences_per_s']} | {r['after']['first_pass_sentences_per_s']} | "
                         f"{r['speedup']}× | {', '.join(f'{x}×' for x in r['speedup_per_round'])} | "
                         f"{r['outputs_differing']} |")
    for label, m in result["models"].items():
        if "ctranslate2" in m:
            c = m["ctranslate2"]
            lines += ["", f"{label} against CTranslate2 {c['runs']['ctranslate2_b64'].get('version', '')}(speed.py's workers, "
                      "same sentences): sentences/s", "", "| batch | ours | ours int8 | CTranslate2 | CTranslate2 int8 |",
                      "|---:|---:|---:|---:|---:|"]
            for b in (1, 64):
                r = c["runs"]
                lines.append(f"| {b} | {r[f'ours_b{b}']['sents_per_s']} | {r[f'ours_int8_b{b}']['sents_per_s']} | "
                             f"{r[f'ctranslate2_b{b}']['sents_per_s']} | {r[f'ctranslate2_int8_b{b}']['sents_per_s']} |")
            lines += ["", "Ratios (best rounds): " + ", ".join(f"{k} {v}" for k, v in c["ratios"].items()),
                      "", "Ratios per round: " + "; ".join(f"{k} {', '.join(map(str, v))}"
                                                          for k, v in c["ratios_per_round"].items())]
            st = m["startup"]
            lines += ["", f"Start-up (whole processes, median of 5): `import torch` {st['import_torch_s']} s, "
                      f"`transformer translate` on one sentence {st['translate_one_sentence_s']} s: "
                      f"+{st['added_s']} s."]
    write_whole(results / f"{name}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
