"""`transformer serve`: an HTTP API and a web page for a trained run (FastAPI + uvicorn).

Requests from all clients are batched together: a request waits at most ``max_wait_ms`` for others
to join it, and a batch holds at most ``max_batch_tokens`` source tokens x beam (the memory bound);
one worker thread runs the model, so torch's own threads are never oversubscribed and a slow or
bad request cannot stall the event loop. Limits answer with JSON errors: 413 body too large, 422
too many sentences / too long a sentence / beam or alpha out of range, 400 malformed JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, Field

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


class TranslateRequest(BaseModel):
    text: list[str] = Field(description="sentences to translate, one output per input")
    beam: int | None = Field(None, description="beam size (default: the run's, 4 in the paper §6.1); 1 = greedy")
    alpha: float | None = Field(None, ge=0.0, le=2.0, description="GNMT length penalty α (default 0.6, §6.1)")


class TranslateResponse(BaseModel):
    translations: list[str]


class AttentionRequest(BaseModel):
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


def serve(run_dir: Path, host: str, port: int, limits: Limits, checkpoint: Path | None = None,
          int8: bool = False) -> None:
    import uvicorn

    translator = Translator(run_dir, checkpoint, int8=int8)
    app = create_app(translator, limits, name=Path(run_dir).resolve().name)
    print(f"serving {run_dir} on http://{host}:{port}/ (API docs: /docs)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
