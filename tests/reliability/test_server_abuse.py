"""`transformer serve` under fuzz and abuse: arbitrary Unicode never loses a line, and a real server on
loopback survives oversized bodies, malformed or mistyped JSON, slow clients and 100 concurrent clients,
then still answers correctly with its memory bounded.

The abuse tests share one server process and run in file order; the last one checks what the earlier
ones did to its memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
import httpx  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from tests.reliability.ledger import rss_mib  # noqa: E402
from tests.reliability.test_bad_input import LINES  # noqa: E402
from transformer.data import read_lines  # noqa: E402
from transformer.request import DecodeRequest  # noqa: E402
from tests.conftest import start_server  # noqa: E402
from transformer.serve import Limits, create_app  # noqa: E402
from transformer.translator import Translator  # noqa: E402

REQUEST_TIMEOUT = 5.0  # --request-timeout of the server under test: short, so stalled clients are cut quickly
BODY_LIMIT = 1 << 20  # the server's default --max-body-bytes
RSS_BOUND_MIB = 100  # allowed growth of the server's resident memory over the abuse (measured: +12 to +26)
BEAM = 2


# -- item 7, server half: arbitrary Unicode in, one translation per sentence out, in order --------------

# what a JSON client may send beyond what a file's lines hold: sentences with newlines inside
SENTENCES = st.one_of(LINES, st.lists(LINES.map("\n".join), min_size=1, max_size=3))


@pytest.fixture(scope="module")
def client(fuzz_translator: Translator) -> Iterator[TestClient]:
    with TestClient(create_app(fuzz_translator, Limits(max_chars=10_000))) as c:
        yield c


def answered(r: httpx.Response) -> list[str]:
    """The translations in a server's answer; an error status or a malformed body raises, so that every
    line of the request counts as lost."""
    assert r.status_code == 200 and isinstance(r.json().get("translations"), list), r.text
    return r.json()["translations"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(SENTENCES)
def test_server_never_loses_or_reorders_a_sentence(client, fuzz_translator, ledger, texts):
    """The documented contract: one translation per sentence, in order; a sentence's newlines count as
    spaces, so it is what `translate` gives for that one line, and a blank sentence gives an empty
    translation."""
    with ledger.translation(texts) as translations:
        translations.extend(answered(client.post("/v1/translate", json={"text": texts, "beam": BEAM})))
    assert len(translations) == len(texts)
    as_lines = [t.replace("\n", " ") for t in texts]
    assert translations == fuzz_translator.translate(as_lines, DecodeRequest(beam_size=BEAM))
    assert all(out == "" for t, out in zip(texts, translations) if not t.strip())
    assert all("\n" not in out for out in translations)


# -- item 8: a real server on loopback under abuse ----------------------------------------------------

@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    port: int
    rss_before_mib: float
    probe: list[str]  # sentences whose translations must never change
    expected: list[str]


@pytest.fixture(scope="module")
def server(fuzz_run: Path, fuzz_translator: Translator) -> Iterator[Server]:
    if not Path("/proc/self/status").is_file():
        pytest.skip("reads the server's memory from Linux's /proc")
    proc, url = start_server(fuzz_run, ["--request-timeout", str(REQUEST_TIMEOUT)])
    try:
        probe = ["A dog runs on the beach.", "", "Two men are talking to each other in a park."]
        expected = fuzz_translator.translate(probe, DecodeRequest(beam_size=BEAM))
        for _ in range(3):  # warm up: the first batches allocate what decoding keeps
            assert httpx.post(url + "/v1/translate", json={"text": probe, "beam": BEAM}, timeout=60).status_code == 200
        yield Server(proc, url, int(url.rsplit(":", 1)[1]), rss_mib(proc.pid), probe, expected)
    finally:
        proc.terminate()
        try:
            proc.wait(REQUEST_TIMEOUT + 10)  # uvicorn waits for open requests: the deadline bounds that
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


def assert_still_correct(server: Server) -> None:
    """A well-formed request gets the right answer (no time bound: a loaded CI machine may be slow)."""
    r = httpx.post(server.url + "/v1/translate", json={"text": server.probe, "beam": BEAM}, timeout=60)
    assert r.status_code == 200 and r.json()["translations"] == server.expected
    assert server.proc.poll() is None


def connect(server: Server) -> socket.socket:
    """A raw connection, for what well-behaved clients never send; a read that hangs fails the test."""
    return socket.create_connection(("127.0.0.1", server.port), timeout=3 * REQUEST_TIMEOUT)


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One HTTP response read off a raw socket: (status, body)."""
    data = b""
    while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
        data += chunk
    header, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in header.lower().split(b"\r\n")
                   if line.startswith(b"content-length:")), None)
    while length is not None and len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    return int(header.split()[1]), body


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed (monotonic)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data, time.monotonic()


def head(length: int | None = None) -> bytes:
    """A POST /v1/translate request's headers; no length: a chunked body."""
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    return (f"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{framing}\r\n"
            "\r\n").encode()


def test_oversized_bodies_are_refused_and_endless_ones_cut_off(server, ledger):
    """413 for a declared length over the limit (before any body byte is sent), for a sent one, and for a
    chunked body with no length as soon as it passes the limit; a body that never ends is not read for
    ever: its connection is closed within the request timeout while the client is still sending."""
    with ledger.damage("declared body length over the limit"), connect(server) as sock:
        sock.sendall(head(10 ** 12))
        status, body = read_response(sock)
        assert status == 413 and b"larger than 1048576 bytes" in body
        assert_still_correct(server)

    with ledger.damage("body over the limit"):
        r = httpx.post(server.url + "/v1/translate", content=b'{"text": ["' + b"a" * BODY_LIMIT + b'"]}',
                       headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 413 and "larger than" in r.json()["error"]
        assert_still_correct(server)

    with ledger.damage("chunked body without end"):
        endless_chunked_body(server)
        assert_still_correct(server)


def endless_chunked_body(server: Server) -> None:
    chunk = b"10000\r\n" + b"a" * 0x10000 + b"\r\n"  # 64 KiB chunks for as long as the server takes them
    with connect(server) as sock:
        sock.sendall(head() + b'c\r\n{"text": ["a\r\n')  # a 12-byte chunk
        start, sent = time.monotonic(), []

        def pour() -> None:
            with contextlib.suppress(OSError):
                while True:
                    sent.append(time.monotonic())  # before: the server may answer before sendall returns
                    sock.sendall(chunk)

        threading.Thread(target=pour, daemon=True).start()
        status, body = read_response(sock)
        refused = time.monotonic()
        _, closed = read_until_closed(sock)
    assert status == 413 and b"larger than" in body
    assert len([t for t in sent if t <= refused]) >= BODY_LIMIT // 0x10000  # refused once past the limit...
    assert sent[-1] > refused  # ...while the client went on sending,
    assert closed - start < 2 * REQUEST_TIMEOUT  # and cut off, not read for ever


BAD_REQUESTS = [  # body, status
    (b'{"text": ["a"', 400),  # cut short
    (b"\xff\xfe\x00 not JSON", 400),
    (b'{"text": ["\xff"]}', 400),  # invalid UTF-8 inside a string
    (b"[" * 100_000 + b"]" * 100_000, 400),  # nested deeper than the parser's recursion limit
    (b"", 400),  # no JSON at all: malformed, as a body cut short
    (b'"a string"', 422),
    (b'{"text": "not a list"}', 422),
    (b'{"text": [1, 2]}', 422),
    (b'{"text": null}', 422),
    (b'{"text": [["nested"]]}', 422),
    (b'{"text": ["a"], "beam": "four"}', 422),
    (b'{"text": ["a"], "beam": "4"}', 422),  # a string is not a number
    (b'{"text": ["a"], "beam": true}', 422),  # nor is a boolean
    (b'{"text": ["a"], "beam": 2.5}', 422),
    (b'{"text": ["a"], "beam": 1e308}', 422),
    (b'{"text": ["a"], "beam": 123456789012345678901234567890}', 422),
    (b'{"text": ["a"], "alpha": NaN}', 422),
    (b'{"text": ["a"], "alpha": -Infinity}', 422),
    (b'{"text": ["a"], "beem": 2}', 422),  # a misspelt key is not ignored
]


def test_malformed_and_mistyped_requests_get_json_errors(server, ledger):
    """Every bad body is answered with its status and a JSON {"error"}, never a 500 or a coerced value;
    broken HTTP (a garbage request line, a 1 MiB header) gets 400."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for body, status in BAD_REQUESTS:
            with ledger.damage(f"request body {body[:60]!r}{f' ({len(body):,} bytes)' if len(body) > 60 else ''}"):
                r = http.post("/v1/translate", content=body, headers={"content-type": "application/json"})
                assert (r.status_code, "error" in r.json()) == (status, True), (body[:40], r.text[:300])
                assert_still_correct(server)
        with ledger.damage("JSON sent as text/plain"):
            r = http.post("/v1/translate", content=b'{"text": ["a"]}', headers={"content-type": "text/plain"})
            assert r.status_code == 415 and "Content-Type: application/json" in r.json()["error"]
            assert_still_correct(server)
        with ledger.damage("GET on a POST route"):
            r = http.get("/v1/translate")
            assert r.status_code == 405 and "error" in r.json()
            assert_still_correct(server)
    for kind, raw in [("garbage request line", b"GARBAGE\r\n\r\n"),
                      ("1 MiB header", b"POST /v1/translate HTTP/1.1\r\nX-Big: " + b"a" * BODY_LIMIT + b"\r\n\r\n")]:
        with ledger.damage(kind), connect(server) as sock:
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # the server may close mid-send
                sock.sendall(raw)
            data, _ = read_until_closed(sock)
            assert data.startswith(b"HTTP/1.1 400"), data[:200]
            assert_still_correct(server)


def test_slow_clients_neither_block_others_nor_hold_their_connections(server, ledger):
    """Connections that send nothing, stop inside the headers or half-way through the body, or trickle
    a byte every 0.2 s (slowloris): the server answers others while they hang on, and closes each of
    them within the request timeout, tricklers included."""
    kinds = ["silent connection", "connection stopped mid-header", "connection stopped mid-body",
             "client trickling a byte every 0.2 s"]
    with contextlib.ExitStack() as faults:
        for kind in kinds:  # one outcome for all four: they are done at once
            faults.enter_context(ledger.damage(kind))
        slow_clients(server)
        assert_still_correct(server)


def slow_clients(server: Server) -> None:
    stalls = [b"", b"POST /v1/translate HTTP/1.1\r\nHo", head(100) + b'{"text": ["a do'] * 4
    trickled = head(100) + b'{"text": ["' + b"a" * 86 + b'"]}'
    socks = []
    for data in stalls:
        sock = connect(server)
        sock.sendall(data)
        socks.append(sock)
    for _ in range(3):
        sock = connect(server)
        socks.append(sock)

        def trickle(sock: socket.socket = sock) -> None:
            with contextlib.suppress(OSError):
                for i in range(len(trickled)):
                    sock.sendall(trickled[i: i + 1])
                    time.sleep(0.2)

        threading.Thread(target=trickle, daemon=True).start()
    opened = time.monotonic()

    assert httpx.get(server.url + "/health", timeout=60).json()["status"] == "ok"
    answered = time.monotonic()
    closes = []
    for sock in socks:
        with sock:
            data, closed = read_until_closed(sock)
            assert data == b""
            closes.append(closed)
    assert answered < min(closes)  # answered while the slow clients still held their connections
    assert max(closes) - opened < 2 * REQUEST_TIMEOUT  # trickling a byte every 0.2 s would take 30 s


def test_a_client_that_reads_none_of_its_answers_is_cut_off(server, ledger):
    """Pipelined requests whose answers the client never reads: the server's writes stall in the socket's
    buffers, and the connection was held for as long as the client kept it open (the request deadline
    stopped with the request read); 128 such clients locked everyone out. Cut off once writing has stalled
    for the request timeout: read afterwards, far fewer than the answers asked for ever arrive."""
    asked = 2000
    with ledger.damage("client reading none of its pipelined answers"):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once: the server must wait
        sock.settimeout(3 * REQUEST_TIMEOUT)
        with sock:
            sock.connect(("127.0.0.1", server.port))
            with contextlib.suppress(OSError):
                sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * asked)
            time.sleep(2 * REQUEST_TIMEOUT)  # reading nothing meanwhile
            assert httpx.get(server.url + "/health", timeout=60).json()["status"] == "ok"
            data, _ = read_until_closed(sock)
        assert data.count(b"HTTP/1.1 200") < asked // 2  # an RST may drop what was buffered: none, too
        assert_still_correct(server)


def test_a_hundred_concurrent_clients_each_get_their_own_translation(server, multi30k, fuzz_translator):
    """100 clients at once, one sentence each: all 200, each with its own sentence's translation
    (decoded in shared batches on the server, one by one in the expectation)."""
    sentences = read_lines(multi30k / "test_2016_flickr.en.gz")[:100]
    expected = [fuzz_translator.translate([s], DecodeRequest(beam_size=BEAM))[0] for s in sentences]
    assert len(set(expected)) >= 20  # different answers, so a mix-up between clients would show
    assert [r.json()["translations"] for r in hundred_clients(server, sentences)] == [[e] for e in expected]
    assert_still_correct(server)


def hundred_clients(server: Server, sentences: list[str]) -> list[httpx.Response]:
    """One concurrent client per sentence; every answer is a 200."""
    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=len(sentences), max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as http:
            return await asyncio.gather(*(http.post("/v1/translate", json={"text": [s], "beam": BEAM})
                                          for s in sentences))

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * len(sentences)
    return responses


def test_memory_stays_bounded_after_the_abuse(server, multi30k, ledger):
    """Runs last: after everything above and one more round (100 clients, 50 bodies of 2 MiB: 100 MiB
    that must not stay), the server's resident memory is within RSS_BOUND_MIB of what it was once
    warmed up."""
    sentences = read_lines(multi30k / "test_2016_flickr.en.gz")[100:200]
    hundred_clients(server, sentences)
    with ledger.damage("2 MiB bodies, 50 in a row"):
        with httpx.Client(base_url=server.url, timeout=30, headers={"content-type": "application/json"}) as http:
            assert [http.post("/v1/translate", content=b"[" * (2 * BODY_LIMIT)).status_code
                    for _ in range(50)] == [413] * 50
        assert_still_correct(server)
        after = rss_mib(server.proc.pid)
        print(f"server RSS: {server.rss_before_mib:.0f} MiB warmed up, {after:.0f} MiB after the abuse")
        assert after - server.rss_before_mib < RSS_BOUND_MIB
