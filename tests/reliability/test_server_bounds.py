"""No request can take `transformer serve` down: the worst attention requests against a base-sized
model, and a flood of translation requests, against real servers on loopback, with the server's
resident memory sampled throughout."""

from __future__ import annotations

import asyncio
import json
import resource
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from transformer.checkpoint import save_checkpoint
from transformer.config import ServeLimits, load_config
from transformer.model import Transformer
from tests.conftest import start_server
from transformer.tokenizer import Tokenizer

ATTENTION_BYTES_BOUND = 20_000_000  # a worst-case response of the base-sized model
RSS_GROWTH_BOUND_MIB = 300


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, fuzz_run: Path) -> Path:
    """A randomly initialised `base`-preset model (6+6 layers, 8 heads, d_model 512) with the fuzz run's
    vocabulary: the attention maps of the paper's own size."""
    run = tmp_path_factory.mktemp("base") / "run"
    run.mkdir()
    shutil.copyfile(fuzz_run / "spm.model", run / "spm.model")
    tokenizer = Tokenizer(run / "spm.model")
    cfg = load_config("base", [f"data.vocab_size={tokenizer.vocab_size}"])
    torch.manual_seed(0)
    model = Transformer(cfg.model, tokenizer.vocab_size)
    meta = {"config": cfg.to_dict(), "vocab_sha256": tokenizer.sha256, "model_hash": cfg.model_hash(),
            "vocab_size": tokenizer.vocab_size, "train_state": {"step": 0, "elapsed_s": 0.0}}
    save_checkpoint(run, 0, model.state_dict(), {}, meta, keep_last=1)
    return run


def longest_allowed(tokenizer: Tokenizer, word: str, pieces: int) -> str:
    """A sentence of repeated ``word`` with exactly ``pieces`` pieces, EOS included."""
    n = 1
    while len(tokenizer.pieces(" ".join([word] * (n + 1)))) + 1 <= pieces:
        n += 1
    text = " ".join([word] * n)
    assert len(tokenizer.pieces(text)) + 1 == pieces, "the word must be one piece"
    return text


@pytest.fixture
def raise_open_files() -> Iterator[None]:
    """A thousand connections at once need more than the usual 1024 descriptors (server and client)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 8192), hard), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_worst_case_attention_requests_cost_a_bounded_amount(base_run, ledger):
    """20 concurrent attention requests at the limit (128 pieces a side, the base model: 6 layers, 8
    heads, 3 kinds): at most 2 run at once, the rest get 503 with Retry-After; every answer is within
    20 MB; a translation request is answered meanwhile; the server's memory grows by < 300 MiB."""
    proc, url = start_server(base_run, ["--max-attention-queued", "2", "--beam", "1"])
    try:
        tokenizer = Tokenizer(base_run / "spm.model")
        cap = ServeLimits().max_attention_pieces
        worst = {"text": longest_allowed(tokenizer, "a", cap), "translation": longest_allowed(tokenizer, "a", cap)}
        assert httpx.post(url + "/v1/translate", json={"text": ["a a a"]}, timeout=120).status_code == 200

        async def flood() -> tuple[list[httpx.Response], httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=30)) as http:
                attention = [asyncio.create_task(http.post("/v1/attention", json=worst)) for _ in range(20)]
                await asyncio.sleep(0.5)
                normal = await http.post("/v1/translate", json={"text": ["a a a"]})
                return await asyncio.gather(*attention), normal

        kind = "20 concurrent worst-case attention requests (base model)"
        with ledger.server_damage(kind, proc, RSS_GROWTH_BOUND_MIB) as rss:  # and memory bounded, server alive
            responses, normal = asyncio.run(flood())
            statuses = [r.status_code for r in responses]
            biggest = max((len(r.content) for r in responses if r.status_code == 200), default=0)
            ledger.measure("attention_requests", len(responses), sum)
            ledger.measure("attention_requests_shed_503", statuses.count(503), sum)
            ledger.measure("attention_worst_response_bytes", biggest)
            assert set(statuses) <= {200, 503} and statuses.count(200) >= 2, statuses
            assert all(r.headers.get("retry-after") for r in responses if r.status_code == 503)
            assert normal.status_code == 200
            data = next(r.json() for r in responses if r.status_code == 200)
            assert data["shape"]["cross"] == [6, 8, cap, cap] and biggest <= ATTENTION_BYTES_BOUND
        print(f"attention: {statuses.count(200)} answered, {statuses.count(503)} shed, largest {biggest:,} bytes, "
              f"server RSS +{rss.growth:.0f} MiB at peak")
    finally:
        proc.terminate()
        proc.wait(30)


async def post(port: int, body: bytes) -> tuple[int, float]:
    """One POST /v1/translate on a connection of its own: (status, seconds to the whole answer)."""
    start = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    data = await reader.read()
    writer.close()
    return int(data.split(b" ", 2)[1]), time.monotonic() - start


def test_a_flood_of_requests_is_shed_at_once_and_nobody_waits_past_the_deadline(fuzz_run, ledger, raise_open_files):
    """1,000 translation requests at once: beyond the connections and the queue the server can take,
    503 at once (most within half the queue deadline, where a server that shed them by their deadline
    would take all of it; on this 2-core machine the flood's own client shares the cores, and in a slow
    hour the median refusal took 1.2 s); the rest are answered, none after its queue deadline plus one
    batch; the server's memory stays bounded and it answers afterwards."""
    deadline = 4.0
    proc, url = start_server(fuzz_run, ["--max-queued", "64", "--max-connections", "100", "--queue-timeout",
                                        str(deadline), "--beam", "2"])
    port = int(url.rsplit(":", 1)[1])
    try:
        bodies = [json.dumps({"text": [f"A dog number {i} runs on the beach."]}).encode() for i in range(1000)]

        async def flood() -> list[tuple[int, float]]:
            return await asyncio.gather(*(post(port, body) for body in bodies))

        with ledger.server_damage("1,000 translation requests at once", proc, RSS_GROWTH_BOUND_MIB) as rss:
            results = asyncio.run(flood())
            shed = [t for status, t in results if status == 503]
            answered = [t for status, t in results if status == 200]
            ledger.measure("flood_requests", len(results), sum)
            ledger.measure("flood_requests_shed_503", len(shed), sum)
            assert len(shed) + len(answered) == 1000 and shed and answered
            assert max(shed) < 1.0 + deadline  # refused at once, or when their deadline passed
            assert sorted(shed)[len(shed) // 2] < deadline / 2  # most of them at once, not by the deadline
            assert max(answered) < deadline + 10  # nobody answered long after the deadline
            assert httpx.post(url + "/v1/translate", json={"text": ["A dog."]}, timeout=60).status_code == 200
        print(f"flood: {len(answered)} answered (slowest {max(answered):.1f} s), {len(shed)} shed "
              f"(median {sorted(shed)[len(shed) // 2]:.2f} s), server RSS +{rss.growth:.0f} MiB at peak")
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("inherited", [signal.default_int_handler, signal.SIG_IGN], ids=["terminal", "ignored"])
def test_ctrl_c_stops_a_long_request_at_its_next_batch_and_the_server_exits(fuzz_run, inherited):
    """One request in the limits (64 sentences, 16 draws each, outputs up to 300 pieces past the input,
    --max-batch-tokens: a batch a sentence) is minutes of decoding on a CPU, and uvicorn waits for the
    requests in progress before it exits: Ctrl-C waited for it, then a second one printed tracebacks.
    Now the decoding stops at its next batch, the client gets 503, and the server exits as an interrupted
    command does (130, "interrupted"): started from a terminal (Ctrl-C's default action; a Python handler
    becomes the default in the child) or with SIGINT ignored, as a non-interactive shell starts a job in the
    background (uvicorn still stops on it, and the server exited 0)."""
    previous = signal.signal(signal.SIGINT, inherited)
    try:
        proc, url = start_server(fuzz_run, ["--max-batch-tokens", "64"])
    finally:
        signal.signal(signal.SIGINT, previous)
    body = {"text": [f"a dog runs on the beach number {i} ." for i in range(64)], "sample": True, "nbest": 16,
            "temperature": 100.0, "max_len_offset": 300}
    answer: list[httpx.Response] = []
    client = threading.Thread(target=lambda: answer.append(httpx.post(url + "/v1/translate", json=body, timeout=600)),
                              daemon=True)
    try:
        client.start()
        deadline = time.monotonic() + 60  # Ctrl-C once decoding has begun (a fixed wait raced a slow client)
        while httpx.get(url + "/health").json()["batches"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        status = proc.wait(120)
        client.join(30)
    finally:
        proc.kill()
        proc.wait()
    assert status == 130 and answer, f"exit status {status}; the server did not answer before it exited"
    assert answer[0].status_code == 503 and answer[0].json() == {"error": "the server is shutting down"}, answer[0].text[:300]
