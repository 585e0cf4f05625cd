"""`transformer serve`: an HTTP API and a web page for a trained run (FastAPI + uvicorn).

Requests from all clients are batched together: a request waits at most ``max_wait_ms`` for others
to join it, and a batch holds at most ``max_batch_tokens`` source tokens x beam (the memory bound);
one worker thread runs the model, so torch's own threads are never oversubscribed and a slow or
bad request cannot stall the event loop. Limits answer with JSON errors: 413 body too large, 422
too many sentences / too long a sentence / beam or alpha out of range / a wrong type or unknown key,
400 malformed JSON. A
request must arrive whole within ``request_timeout`` seconds, else its connection is closed, so slow
or stalled clients (slowloris) cannot hold connections for ever; tests/reliability/test_server_abuse.py
checks all of this against a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from .figures import attention_maps, web_page
from .translator import Translator


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; the defaults suit a CPU server."""

    max_body_bytes: int = 1 << 20
    max_sentences: int = 64
    max_chars: int = 1000
    max_beam: int = 16
    max_batch_tokens: int = 8192  # source tokens x beam per decoding batch: bounds memory
    max_wait_ms: float = 10.0  # how long a request waits for others to batch with
    batching: bool = True  # False: one request at a time (what the load benchmark compares against)
    request_timeout: float = 20.0  # seconds for a request's headers and body to arrive (serve() only)


class TranslateRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")  # "beam": true or "4", or a misspelt key: 422

    text: list[str] = Field(description="sentences to translate, one output per input")
    beam: int | None = Field(None, description="beam size (default: the run's, 4 in the paper §6.1); 1 = greedy")
    alpha: float | None = Field(None, ge=0.0, le=2.0, description="GNMT length penalty α (default 0.6, §6.1)")


class TranslateResponse(BaseModel):
    translations: list[str]


class AttentionRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    text: str = Field(description="one source sentence")
    translation: str | None = Field(None, description="target to teacher-force (default: the model's own "
                                                      "translation with the run's beam settings)")


class LimitError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class _Pending:
    lines: list[str]
    beam: int
    alpha: float
    tokens: int  # source tokens x beam
    future: asyncio.Future = field(repr=False)


class Batcher:
    """Collects translation requests across clients and decodes them together (dynamic batching)."""

    def __init__(self, translator: Translator, limits: Limits, executor: ThreadPoolExecutor):
        self.translator, self.limits, self.executor = translator, limits, executor
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.batches = self.requests = 0

    async def translate(self, lines: list[str], beam: int, alpha: float) -> list[str]:
        tokens = beam * sum(len(ids) + 1 for ids in self.translator.tokenizer.encode_batch(lines))
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(_Pending(lines, beam, alpha, tokens, future))
        return await future

    async def run(self) -> None:
        held: _Pending | None = None  # a request that did not fit the previous batch
        while True:
            first = held or await self.queue.get()
            held, batch = None, [first]
            budget = self.limits.max_batch_tokens - first.tokens
            deadline = time.monotonic() + self.limits.max_wait_ms / 1000
            while self.limits.batching:
                try:
                    nxt = await asyncio.wait_for(self.queue.get(), max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    break
                if (nxt.beam, nxt.alpha) != (first.beam, first.alpha) or nxt.tokens > budget:
                    held = nxt
                    break
                batch.append(nxt)
                budget -= nxt.tokens
            await self._decode(batch)

    async def _decode(self, batch: list[_Pending]) -> None:
        lines = [line for p in batch for line in p.lines]
        beam, alpha = batch[0].beam, batch[0].alpha
        longest = max(len(ids) + 1 for ids in self.translator.tokenizer.encode_batch(lines))
        batch_size = max(1, self.limits.max_batch_tokens // (beam * longest))
        self.batches += 1
        self.requests += len(batch)
        try:
            outputs = await asyncio.get_running_loop().run_in_executor(
                self.executor, lambda: self.translator.translate(lines, beam, alpha, None, batch_size))
        except Exception as e:  # noqa: BLE001  every waiting client gets the error, the server goes on
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(e)
            return
        start = 0
        for p in batch:
            if not p.future.done():  # a client that went away has a cancelled future
                p.future.set_result(outputs[start: start + len(p.lines)])
            start += len(p.lines)


class BodyLimit:
    """ASGI middleware: refuses a body over ``limit`` bytes with 413, whether or not it says its length."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(send)
        received, started, refused = 0, False, False

        async def counting_receive():
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit and not started:  # answer now; the app sees the client leave
                    refused = True
                    await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            if not refused:
                await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except Exception:
            if not refused:
                raise

    async def _refuse(self, send) -> None:
        body = json.dumps({"error": f"request body larger than {self.limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def create_app(translator: Translator, limits: Limits = Limits(), name: str = "transformer") -> FastAPI:
    """The ASGI app; ``uvicorn`` serves it, tests call it in-process."""
    executor = ThreadPoolExecutor(1, thread_name_prefix="model")
    state: dict[str, Batcher] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state["batcher"] = batcher = Batcher(translator, limits, executor)
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()
        executor.shutdown(wait=False)

    app = FastAPI(title=f"transformer: {name}", lifespan=lifespan,
                  description="Translation with the Transformer of 'Attention Is All You Need' (beam search, "
                              "§6.1) and its attention weights (appendix figures).")
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)
    decode = translator.cfg.decode

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse({"error": "malformed JSON: " + errors[0].get("msg", "")}, status_code=400)
        detail = [{"field": ".".join(str(x) for x in e.get("loc", ())[1:]), "problem": e.get("msg", "")}
                  for e in errors]
        return JSONResponse({"error": "invalid request", "detail": detail}, status_code=422)

    @app.exception_handler(LimitError)
    async def limited(request: Request, exc: LimitError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        """FastAPI's own errors (a body it cannot parse, e.g. JSON nested too deep or invalid UTF-8 in a
        string; 404; 405) in the same {"error": ...} shape as ours."""
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    def check_sentence(text: str, where: str) -> None:
        if len(text) > limits.max_chars:
            raise LimitError(422, f"{where}: {len(text)} characters, more than the limit of {limits.max_chars}")

    @app.post("/v1/translate", response_model=TranslateResponse)
    async def translate(req: TranslateRequest) -> TranslateResponse:
        """Translate sentences with beam search; requests from all clients are decoded together."""
        if len(req.text) > limits.max_sentences:
            raise LimitError(422, f"text: {len(req.text)} sentences, more than the limit of {limits.max_sentences}")
        for i, line in enumerate(req.text):
            check_sentence(line, f"text[{i}]")
        beam = decode.beam_size if req.beam is None else req.beam
        if not 1 <= beam <= limits.max_beam:
            raise LimitError(422, f"beam: {beam} is outside 1..{limits.max_beam}")
        lines = [" ".join(line.split()) for line in req.text]  # a sentence is one line
        todo = [line for line in lines if line]
        outputs = iter(await state["batcher"].translate(todo, beam, decode.alpha if req.alpha is None else req.alpha)
                       if todo else [])
        return TranslateResponse(translations=[next(outputs) if line else "" for line in lines])

    @app.post("/v1/attention")
    async def attention(req: AttentionRequest) -> dict:
        """Every layer's attention weights for one sentence pair, as the page draws them: {"translation",
        "pieces": maps, "words": maps}, maps = {src, tgt_in, tgt_out, weights: {kind: [layer][head][query][key]}}."""
        check_sentence(req.text, "text")
        if not req.text.strip():
            raise LimitError(422, "text: empty sentence")
        if req.translation is not None:
            check_sentence(req.translation, "translation")

        def run() -> dict:
            tgt = req.translation if req.translation is not None else translator.translate([req.text])[0]
            maps = attention_maps(translator, req.text, tgt)
            return {"translation": tgt, "pieces": maps.to_json(), "words": maps.merged().to_json()}

        return await asyncio.get_running_loop().run_in_executor(executor, run)

    @app.get("/health")
    async def health() -> dict:
        batcher = state.get("batcher")
        return {"status": "ok", "model": name, "queued": batcher.queue.qsize() if batcher else 0,
                "batches": batcher.batches if batcher else 0, "requests": batcher.requests if batcher else 0}

    page = web_page("index.html", {"{{TITLE}}": name.replace("<", "&lt;"), "{{BEAM}}": str(decode.beam_size),
                                   "{{ALPHA}}": str(decode.alpha)})

    @app.get("/", response_class=HTMLResponse)
    async def index() -> str:
        return page

    return app


def deadline_protocol(seconds: float) -> type:
    """uvicorn's h11 protocol with a deadline: while the server waits for a request (from the connection's
    opening, or the end of the previous response, until the request's last body byte), at most ``seconds``
    may pass, else the connection is closed. uvicorn itself only closes keep-alive connections idle between
    requests: a client that trickles its headers or stalls mid-body (slowloris) would hold its connection
    and buffers for ever. Decoding time does not count. Always h11: uvicorn's httptools protocol, picked
    when httptools is installed, would need its own version."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    waiting = (h11.IDLE, h11.SEND_BODY)  # the client's states in which the server waits for it

    class DeadlineH11Protocol(H11Protocol):
        deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._start()

        def on_response_complete(self) -> None:
            self._start()  # before super(): it may read a pipelined request whole and stop the clock again
            super().on_response_complete()

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state not in waiting:
                self._stop()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop()
            super().connection_lost(exc)

        def _start(self) -> None:
            self._stop()
            self.deadline = self.loop.call_later(seconds, self._expire)

        def _stop(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def _expire(self) -> None:
            self.deadline = None
            if not self.transport.is_closing():
                self.transport.close()  # a waiting handler sees the client leave (http.disconnect)

    return DeadlineH11Protocol


def serve(run_dir: Path, host: str, port: int, limits: Limits, checkpoint: Path | None = None,
          int8: bool = False, device: str | None = None, decode: dict[str, object] | None = None) -> None:
    """``decode``: ``decode.*`` fields replacing the run's own (the command line's --beam, --alpha, ...),
    the defaults of requests that do not give them."""
    import uvicorn

    translator = Translator(run_dir, checkpoint, int8=int8, device=device, decode=decode)
    app = create_app(translator, limits, name=Path(run_dir).resolve().name)
    print(f"serving {run_dir} on http://{host}:{port}/ (API docs: /docs)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", http=deadline_protocol(limits.request_timeout),
                timeout_keep_alive=5)


def start_server(run_dir: Path, options: Sequence[str] = (), timeout: float = 120) -> tuple[subprocess.Popen, str]:
    """`transformer serve RUN_DIR` as a child process on a free loopback port, as a user runs it, returned
    once GET /health answers: (process, base URL). For tests and benchmarks; the caller terminates it.
    The server's warnings go to this process's stderr."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "transformer", "serve", str(run_dir), "--port", str(port),
                             *options], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"`transformer serve {run_dir}` did not start (exit status {proc.wait()}; "
                                   "its stderr is above)") from None
            time.sleep(0.2)
