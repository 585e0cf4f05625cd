"""Load test of `transformer serve` on loopback: many concurrent clients, with and without batching.

    python benchmarks/serve_load.py [--run RUN_DIR] [--clients 50] [--requests 20]

Starts the server as a child process (its own interpreter, as a user would run it), then
``--clients`` concurrent clients each send ``--requests`` POST /v1/translate requests of one
test2016 sentence (beam 4, α 0.6, §6.1) one after another. Measures throughput and p50 / p99
latency, once with dynamic batching (the default) and once with --no-batching (one request at a
time), and reports ``batching_gain`` = requests/s batched ÷ requests/s unbatched.

Without --run it trains the quick Multi30k EN→DE recipe for --train-minutes into runs/serve_bench
(reused when it exists). Writes serve_load.json and .md into --results (default benchmarks/results). Run it
alone on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

from transformer.data import read_lines

from transformer.prepare import resolve_data_path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from common import positive, trained_run  # noqa: E402
from provenance import add_results_option, git, results_folder, write_result, write_whole  # noqa: E402
from tests.conftest import start_server  # noqa: E402  (the tests' launcher of `transformer serve`)


async def load(url: str, sentences: list[str], clients: int, requests: int) -> dict:
    latencies: list[float] = []
    errors = 0

    async def client(c: int, http: httpx.AsyncClient) -> None:
        nonlocal errors
        for r in range(requests):
            text = sentences[(c * requests + r) % len(sentences)]
            start = time.perf_counter()
            try:
                resp = await http.post(url + "/v1/translate", json={"text": [text], "beam": 4, "alpha": 0.6})
                ok = resp.status_code == 200 and len(resp.json()["translations"]) == 1
            except httpx.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - start)
            errors += not ok

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        await http.post(url + "/v1/translate", json={"text": [sentences[0]]})  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*(client(c, http) for c in range(clients)))
        wall = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100)
    return {"requests": len(latencies), "errors": errors, "seconds": round(wall, 2),
            "requests_per_s": round(len(latencies) / wall, 2), "p50_ms": round(q[49] * 1000, 1),
            "p99_ms": round(q[98] * 1000, 1)}


def measure(run: Path, extra: list[str], sentences: list[str], clients: int, requests: int) -> dict:
    proc, url = start_server(run, extra)
    try:
        result = asyncio.run(load(url, sentences, clients, requests))
        result["server_batches"] = httpx.get(url + "/health").json()["batches"]
        return result
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, help="trained run folder (default: runs/serve_bench, trained if absent)")
    parser.add_argument("--train-minutes", type=float, default=5.0, help="training budget when --run is not given")
    parser.add_argument("--clients", type=positive, default=50)
    parser.add_argument("--requests", type=int, default=20, help="requests per client")
    parser.add_argument("--max-wait-ms", type=float, default=10.0)
    add_results_option(parser, "serve_load.json / .md")
    args = parser.parse_args()
    results = results_folder(parser, args.results)

    run = args.run and trained_run(args.run)
    if run is None:
        run = ROOT / "runs" / "serve_bench"
        if not (run / "checkpoints").is_dir():
            subprocess.run([sys.executable, "-m", "transformer", "train", "multi30k_en_de_quick", "--out", str(run),
                            "--set", f"train.max_minutes={args.train_minutes}", "--quiet"], check=True)
    sentences = read_lines(resolve_data_path("multi30k/test_2016_flickr.en.gz"))
    print(f"{args.clients} clients x {args.requests} requests, one test2016 sentence each, beam 4", file=sys.stderr)
    batched = measure(run, ["--max-wait-ms", str(args.max_wait_ms)], sentences, args.clients, args.requests)
    print(f"batched:   {batched}", file=sys.stderr)
    single = measure(run, ["--no-batching"], sentences, args.clients, args.requests)
    print(f"unbatched: {single}", file=sys.stderr)

    import fastapi
    import uvicorn

    result = {
        "requests": batched["requests"], "errors": batched["errors"] + single["errors"],
        "requests_per_s": batched["requests_per_s"], "p50_ms": batched["p50_ms"], "p99_ms": batched["p99_ms"],
        "batching_gain": round(batched["requests_per_s"] / single["requests_per_s"], 2),
        "batched": batched, "unbatched": single, "clients": args.clients, "requests_per_client": args.requests,
        "max_wait_ms": args.max_wait_ms, "run": str(run), "beam": 4, "commit": git("rev-parse", "--short", "HEAD"),
        "command": " ".join(["python", "benchmarks/serve_load.py", *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "fastapi": fastapi.__version__,
                     "uvicorn": uvicorn.__version__, "httpx": httpx.__version__},
    }
    write_result(results, "serve_load", result)  # the reading, then its page
    rows = "\n".join(f"| {name} | {r['requests']} | {r['errors']} | {r['requests_per_s']} | {r['p50_ms']} | "
                     f"{r['p99_ms']} | {r['server_batches']} |" for name, r in (("dynamic batching", batched),
                                                                              ("one request at a time", single)))
    write_whole(results / "serve_load.md", f"""# `transformer serve` under load ({result['date']})

`{result['command']}`: {args.clients} concurrent clients on loopback, {args.requests} requests each, one test2016
sentence per request, beam 4, α 0.6; model `{run.name}`; commit {result['commit']}. {result['machine']};
versions {result['versions']}.

| server | requests | errors | requests/s | p50 ms | p99 ms | decoding batches |
| --- | ---: | ---: | ---: | ---: | ---: | ---: |
{rows}

Batching gain: **{result['batching_gain']}×** the throughput of one request at a time.
""")
    print(json.dumps({k: result[k] for k in ("requests", "errors", "requests_per_s", "p50_ms", "p99_ms",
                                             "batching_gain")}))


if __name__ == "__main__":
    main()
