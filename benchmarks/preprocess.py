"""Token store speed and memory: encode N sentence pairs with `write_store`, in a child process.

    python benchmarks/preprocess.py [--pairs 1000000] [--vocab-size 8000] [--max-len 256]

§5.1 trains on 4.5M (EN-DE) and 36M (EN-FR) pairs; this measures whether encoding a corpus of
that order streams in bounded memory. The corpus is Multi30k train (29,000 pairs) repeated to
--pairs lines, written to a temporary folder with a joint sentencepiece BPE trained on it; then a
child process runs `write_store` alone, so its peak resident memory
(getrusage(RUSAGE_CHILDREN).ru_maxrss) is the store writer's and not this script's. Also times
opening the store and §5.1 length batching of it (25,000 tokens per side, as in the paper).

Writes benchmarks/results/preprocess.json and preprocess.md. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import sentencepiece
import torch

from transformer.data import make_batches_from_lengths, read_lines

from transformer.prepare import resolve_data_path
from transformer.store import TokenStore
from transformer.tokenizer import Tokenizer

from common import positive
from provenance import add_results_option, code_state, commit_text, results_folder, write_result, write_whole

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, resource, sys, time
from pathlib import Path
from transformer.store import write_store
from transformer.tokenizer import Tokenizer
src, tgt, model, out, max_len, chunk_pairs = sys.argv[1:]
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
meta = write_store(Path(src), Path(tgt), Tokenizer(Path(model)), Path(out), int(max_len), int(chunk_pairs))
print(json.dumps({"seconds": time.perf_counter() - start, "baseline_kib": baseline, "meta": meta}))
"""


def write_corpus(folder: Path, pairs: int) -> tuple[Path, Path]:
    """Multi30k train repeated to ``pairs`` lines per side, streamed to plain files."""
    paths = []
    for lang in ("en", "de"):
        lines = read_lines(resolve_data_path(f"multi30k/train.{lang}.gz"))
        block = "".join(line + "\n" for line in lines)
        path = folder / f"train.{lang}"
        with path.open("w", encoding="utf-8") as f:
            for _ in range(pairs // len(lines)):
                f.write(block)
            f.write("".join(line + "\n" for line in lines[:pairs % len(lines)]))
        paths.append(path)
    return paths[0], paths[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=positive, default=1_000_000)
    parser.add_argument("--vocab-size", type=int, default=8000, help="joint BPE pieces (default 8000)")
    parser.add_argument("--max-len", type=int, default=256, help="data.max_len (default 256)")
    parser.add_argument("--chunk-pairs", type=int, default=50_000)
    parser.add_argument("--max-tokens", type=int, default=25_000, help="batching budget per side (§5.1)")
    add_results_option(parser, "preprocess.json / .md")
    args = parser.parse_args()
    results = results_folder(parser, args.results)
    state = code_state()  # the code at the start: a commit made during the run must not be recorded

    with tempfile.TemporaryDirectory(prefix="preprocess-bench-") as work:
        work_dir = Path(work)
        src, tgt = write_corpus(work_dir, args.pairs)
        tokenizer = Tokenizer.train(read_lines(resolve_data_path("multi30k/train.en.gz"))
                                    + read_lines(resolve_data_path("multi30k/train.de.gz")),
                                    work_dir / "spm.model", args.vocab_size, 100_000)
        out = work_dir / "store"
        command = [sys.executable, "-c", CHILD, str(src), str(tgt), str(tokenizer.path), str(out),
                   str(args.max_len), str(args.chunk_pairs)]
        start = time.perf_counter()
        child = subprocess.run(command, check=True, capture_output=True, text=True,
                               env=os.environ | {"PYTHONPATH": str(ROOT)})
        process_seconds = time.perf_counter() - start
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
        report = json.loads(child.stdout.strip().splitlines()[-1])
        meta = report["meta"]

        start = time.perf_counter()
        store = TokenStore(out, vocab_sha256=tokenizer.sha256)
        open_seconds = time.perf_counter() - start
        start = time.perf_counter()
        batches = make_batches_from_lengths(store.src_lengths, store.tgt_lengths, args.max_tokens)
        batch_seconds = time.perf_counter() - start
        store_bytes = sum(p.stat().st_size for p in out.iterdir())
        corpus_bytes = src.stat().st_size + tgt.stat().st_size

    result = {
        "pairs": args.pairs, "pairs_kept": meta["n_kept"], "skipped_empty": meta["skipped_empty"],
        "skipped_long": meta["skipped_long"], "seconds": round(report["seconds"], 2),
        "process_seconds": round(process_seconds, 2), "pairs_per_s": round(args.pairs / report["seconds"]),
        "peak_rss_mib": round(peak_kib / 1024, 1), "baseline_rss_mib": round(report["baseline_kib"] / 1024, 1),
        "store_mib": round(store_bytes / 2**20, 1), "corpus_mib": round(corpus_bytes / 2**20, 1),
        "open_seconds": round(open_seconds, 3), "batch_seconds": round(batch_seconds, 2),
        "batches": len(batches), "max_tokens": args.max_tokens, "vocab_size": tokenizer.vocab_size,
        "dtype": meta["dtype"], "max_len": args.max_len, "chunk_pairs": args.chunk_pairs,
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(), **state,
        "versions": {"python": platform.python_version(), "numpy": np.__version__,
                     "sentencepiece": sentencepiece.__version__, "torch": torch.__version__},
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}",
    }
    write_result(results, "preprocess", result)  # the reading, then its page
    r = result
    write_whole(results / "preprocess.md", f"""# Token store: `write_store` on {r['pairs']:,} pairs

`{r['command']}` — {r['date']}, {commit_text(r)}, {r['machine']};
numpy {np.__version__}, sentencepiece {sentencepiece.__version__}

Multi30k train repeated to {r['pairs']:,} pairs ({r['corpus_mib']} MiB of text), joint BPE of
{r['vocab_size']} pieces, max_len {r['max_len']}, chunks of {r['chunk_pairs']:,} pairs, in a child process.

| measure | value |
|---|---|
| encoding time (`write_store` alone) | **{r['seconds']} s** ({r['pairs_per_s']:,} pairs/s) |
| child process wall time (with imports) | {r['process_seconds']} s |
| peak resident memory of the child | **{r['peak_rss_mib']} MiB** (peak before encoding, imports: {r['baseline_rss_mib']} MiB) |
| store size | {r['store_mib']} MiB ({r['dtype']} ids) |
| pairs kept / too long / empty | {r['pairs_kept']:,} / {r['skipped_long']:,} / {r['skipped_empty']:,} |
| opening the store | {r['open_seconds']} s |
| §5.1 batching of its lengths ({r['max_tokens']:,} tokens per side) | {r['batch_seconds']} s, {r['batches']:,} batches |
""")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
