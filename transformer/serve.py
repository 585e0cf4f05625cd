"""`transformer serve`: an HTTP API and a web page for a trained run (FastAPI + uvicorn).

Requests from all clients are batched together, those of the same settings in one batch: a request waits
at most ``max_wait_ms`` for others to join it, and a batch holds at most ``max_batch_tokens`` source tokens x
beam, a sentence's prefix, constraints or translation counted with it (the memory bound); one worker thread
runs the model, so torch's own threads are never oversubscribed and a slow or bad request cannot stall the
event loop.

No request can take the server down, and the work any one client can cause is bounded: at most
``max_queued`` sentences wait for decoding (beyond, 503 with Retry-After at once; a request of more
than that, 422), a request that has waited ``queue_timeout`` seconds without being decoded gets 503
(an attention request too), a request whose client has gone is dropped before it is decoded, or, once
begun, at the next search step (of the ``max_batch_tokens`` batch decoding it, once no other client waits for
that batch), at most ``max_attention_queued`` attention requests are in progress (beyond, 503), an attention
request holds at most ``max_attention_pieces`` pieces per side, and a connection opened while
``max_connections`` are open gets 503 for its request. Ctrl-C stops decoding at the next search step and
answers 503 to what waits. If decoding a batch raises, its requests get 500 and the server goes on; if the
decoding worker itself fails, the requests waiting for it get 500 and it is restarted, at most
``MAX_RESTARTS`` times: at the next failure every request (attention too) answers 503 and /health says why.
Every error is JSON, {"error": one line}: 413 body too large, 422 too many sentences / too long a sentence / a beam
over the limit / options that do not combine or a value out of range (``request.DecodeRequest.verify``, the same
table as the command line's) / a wrong type or unknown key / a lone surrogate in a string (the line names the
field), 400 malformed JSON, 500 anything that fails while answering. A request must arrive whole within
``request_timeout`` seconds, and an answer whose writing has stalled (a client that reads nothing) must move again
within as long, else its connection is closed, so slow or stalled clients (slowloris) cannot hold connections for
ever; tests/reliability/test_server_abuse.py checks all of this against a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import html
import itertools
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from starlette.exceptions import HTTPException

from . import __version__
from .config import MAX_ALPHA, ConfigError, ServeLimits as Limits
from .search import Stopped
from .errors import UserError
from .figures import align, attention_maps, target_pieces, web_page
from .request import API, DecodeRequest
from .translator import ModelOverflow, Translator

# seconds a stopping server waits for the connections still open (a client that stalled in its request's body
# held a SIGTERM for the whole --request-timeout); decoding stops at once, and what waits is answered 503
SHUTDOWN_GRACE_S = 5
MAX_ERRORS_SHOWN = 10  # of an invalid request's problems, in its answer (the count of the others after them)
SHUTTING_DOWN = "the server is shutting down"  # the 503 every request still waiting gets at Ctrl-C or SIGTERM
_LOG = logging.getLogger("uvicorn.error")  # where uvicorn logs an endpoint's failure, with its traceback
MAX_RESTARTS = 3  # restarts of a failed decoding worker; the failure after them stops decoding, and the server says so


def _unicode(text: str) -> str:
    """A request's text as it is, if it is Unicode text: a JSON string may hold a lone surrogate ("\\ud800"),
    which is no character, and the tokenizer would fail on it (a 500)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not Unicode text: a lone surrogate (U+{ord(text[e.start]):04X}) at character "
                         f"{e.start + 1}") from None
    return text


Text = Annotated[str, AfterValidator(_unicode)]
_JSON_KINDS = {str: "a string", bool: "true or false", int: "a number", float: "a number", type(None): "null",
               list: "an array", dict: "an object"}


def _all_strings(value: object, depth: int = 1) -> object:
    """A list of strings (``depth`` 2: of lists of strings) refused at its first item of another kind, in one
    problem: item by item, a list of 340,000 numbers took the server 3 s and answered 38 MB of problems."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            if depth > 1 and isinstance(item, list):
                try:
                    _all_strings(item, depth - 1)
                except ValueError as e:
                    raise ValueError(f"item {i}: {e}") from None
            elif depth > 1 or not isinstance(item, str):
                wanted = "an array of strings" if depth > 1 else "a string"
                raise ValueError(f"item {i} is {_JSON_KINDS.get(type(item), type(item).__name__)}, not {wanted}")
    return value


Texts = Annotated[list[Text], BeforeValidator(_all_strings)]
Phrases = Annotated[list[list[Text]], BeforeValidator(lambda value: _all_strings(value, depth=2))]


class TranslateRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")  # "beam": true or "4", or a misspelt key: 422

    # the fields of a request.DecodeRequest, checked there (its table of options, spelt as the API spells them)
    text: Texts = Field(description="sentences to translate, one output per input")
    beam: int | None = Field(None, description="beam size (default: the run's, 4 in the paper §6.1); 1 = greedy")
    alpha: float | None = Field(None, description="length penalty α >= 0, GNMT's exponent (length_norm "
                                 "'length': of |Y|) (default: the run's, 0.6 in §6.1)")
    nbest: int | None = Field(None, description="also answer the nbest (<= beam) best hypotheses of each "
                                                "sentence with their scores, best first (with constraints, only "
                                                "those that meet them, when any does: maybe fewer)")
    scores: bool = Field(False, description="also answer each translation's score, log P / lp(|Y|) (not with "
                                            "nbest, whose hypotheses carry theirs)")
    alignment: bool = Field(False, description="also answer each translation's word alignment: 0-based [source "
                                               "word, target word] pairs from the cross-attention (as translate "
                                               "--alignment)")
    prefix: Texts | None = Field(None, description="one target prefix per sentence (\"\": none); each "
                                                   "translation starts with its prefix")
    constraints: Phrases | None = Field(None, description="per sentence, the phrases its translation must "
                                                          "contain (lexically constrained beam search)")
    sample: bool = Field(False, description="draw the outputs from the model's distribution instead of "
                                            "searching (with nbest: that many draws); not with beam")
    seed: int | None = Field(None, description="sample: the random seed, 0 .. 2^64 - 1 (default 1; same seed, "
                                               "same outputs)")
    topk: int | None = Field(None, description="sample: among the topk most probable tokens only (0: all)")
    topp: float | None = Field(None, description="sample: nucleus, the most probable tokens whose probability "
                                                 "reaches topp, in (0, 1]")
    temperature: float | None = Field(None, description="sample: divides the log-probs (1.2e-38 .. 3.4e38)")
    early_stop: Text | None = Field(None, description="when the beam stops a sentence: \"bound\" (§6.1: once no alive "
                                                     "hypothesis can beat its best finished one) or \"top\" (also once "
                                                     "the step's best candidate ends); default: the run's")
    length_norm: Text | None = Field(None, description="what log P is divided by: \"gnmt\" (§6.1, ((5 + |Y|) / 6)^α) "
                                                      "or \"length\" (|Y|^α); default: the run's")
    max_len_offset: int | None = Field(None, description="outputs of at most input length + this pieces (default: "
                                                         "the run's, 50 in §6.1)")


class Hypothesis(BaseModel):
    text: str
    score: float
    alignment: list[tuple[int, int]] | None = None


class TranslateResponse(BaseModel):
    translations: list[str]
    scores: list[float] | None = None
    alignments: list[list[tuple[int, int]]] | None = None
    nbest: list[list[Hypothesis]] | None = None


class ScoreRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    text: Texts = Field(description="source sentences")
    translation: Texts = Field(description="their translations to score, one per source sentence")
    alpha: float | None = Field(None, description="length penalty α >= 0 of the score, GNMT's exponent "
                                 "(length_norm 'length': of |Y|)")
    length_norm: Text | None = Field(None, description="what log P is divided by, as translate's \"length_norm\": "
                                                      "\"gnmt\" or \"length\"; default: the run's")


class ScoreResponse(BaseModel):
    scores: list[float] = Field(description="log P / lp(|Y|), as beam search ranks hypotheses")
    log_probs: list[float] = Field(description="log P(translation | text), EOS included")


class AttentionRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    text: Text = Field(description="one source sentence")
    translation: Text | None = Field(None, description="target to teacher-force (default: the model's own "
                                                      "translation with the run's beam settings)")


class AttentionResponse(BaseModel):  # the schema /openapi.json shows: the answer is written as JSON directly
    translation: str = Field(description="the target the maps are of (the one sent, else the model's own)")
    src: list[str] = Field(description="the source's pieces, EOS included")
    tgt_in: list[str] = Field(description="the decoder's input pieces (the target shifted right)")
    tgt_out: list[str] = Field(description="the pieces it predicts, EOS included")
    scale: int = Field(description="a weight is its integer / scale")
    shape: dict[str, list[int]] = Field(description="per kind (enc_self, dec_self, cross): [layers, heads, "
                                                    "queries, keys]")
    weights: dict[str, list[int]] = Field(description="per kind: the weights × scale, row-major over shape")
    unknown: list[str] = Field(description="the characters of text or translation that the vocabulary has no "
                                           "piece for: the model reads each as its unknown piece, whatever the "
                                           "labels show")


class ErrorDetail(BaseModel):
    field: str = Field(description="the request's field, as text[0] or constraints[1][0] (\"\": the body)")
    problem: str


class ErrorResponse(BaseModel):
    error: str = Field(description="what is wrong, in one line")
    detail: list[ErrorDetail] | None = Field(None, description="422 for fields of the wrong kind: each field "
                                                               "and its problem (the first ten)")


_ERRORS = {status: {"model": ErrorResponse, "description": text} for status, text in (
    (400, "malformed JSON"), (413, "a body over the server's --max-body-bytes (a list or a text over "
                                                     "its limits: 422)"),
    (415, "a body not sent as application/json"),
    (422, "an invalid request: a field of the wrong kind (with detail), options the search refuses together, a "
          "value out of range or over the server's limits"),
    (500, "a decoding batch or the model thread failed (the server's fault, its traceback in the server's log)"),
    (503, "busy or shutting down: try again after Retry-After seconds"))}


class LimitError(Exception):
    def __init__(self, status: int, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after


@dataclass(frozen=True)
class Job:
    """What a request asks of the model, beyond its sentences; requests with equal jobs are decoded
    together. A sampling job carries its request's own number, so it is decoded alone and its seed
    alone decides its draws."""

    kind: str  # "translate" or "score"
    request: DecodeRequest  # checked, the run's defaults in, without its per-sentence prefixes and constraints
    number: int | None = None  # sampling: the request's own number

    @property
    def rows(self) -> int:
        """Decoder rows per sentence: the beam, or the number of draws (scoring: one)."""
        return (self.request.nbest or 1) if self.request.sample else self.request.beam_size or 1


@dataclass
class _Pending:
    lines: list[str]
    extra: dict[str, list] | None  # per line: "prefix", "constraints" (translate) or "translation" (score)
    job: Job
    tokens: int  # the pieces (EOS each) of its lines and their prefixes, constraints or translations, x beam
    future: asyncio.Future = field(repr=False)
    started: bool = False  # taken into a batch: decoding it has begun
    abandoned: bool = False  # its client went away or its wait timed out: not decoded (further)
    counted: bool = True  # its lines count in Batcher.queued (until taken into a batch, or abandoned)


class Batcher:
    """Collects translation requests across clients and decodes them together (dynamic batching), with
    bounded waiting: a full queue refuses at once, a long wait ends in a 503, a gone client's request
    is dropped, and a failed worker is restarted (``supervise``)."""

    def __init__(self, translator: Translator, limits: Limits, executor: ThreadPoolExecutor):
        self.translator, self.limits, self.executor = translator, limits, executor
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.queued = 0  # sentences waiting to be decoded, of requests still wanted
        self.batches = self.requests = self.dropped = self.shed = self.timed_out = 0
        self.failures: list[str] = []  # why the worker died, each time
        self.alive = True  # False once supervise has given up restarting the worker
        self.current: list[_Pending] = []  # the batch the worker decodes: taken from the queue, not yet answered
        # taken from the queue by the worker but in no batch yet (another job's than the batch's, or past its token
        # bound), in the order they came: they lead the next batches, and count as queued until then
        self.waiting: list[_Pending] = []
        self.lock = threading.Lock()  # a request's started / abandoned flags, set from two threads
        self.stopping = False  # the server is shutting down: what is decoding stops at its next search step
        # set as it is: attention requests waiting for the model thread, outside the queue, are answered then too
        self.stopped = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None  # the worker's (``run``), where the futures are answered

    def stop(self) -> None:
        """Decoding stops at the next search step, and every request not answered yet gets 503 at once: the server
        is shutting down (a signal handler's call, so that Ctrl-C does not wait for a long request to finish).
        Answered only when the batch ended, a request waiting on a batch longer than uvicorn's grace
        (SHUTDOWN_GRACE_S) was cancelled by uvicorn, whose client got a plain-text 500."""
        self.stopping = True
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._refuse_all, 503, SHUTTING_DOWN)
            self.loop.call_soon_threadsafe(self.stopped.set)
        else:
            self.stopped.set()

    def _refuse_all(self, status: int, message: str) -> None:
        """A LimitError to every request not answered yet that a client waits for: in the batch decoding, taken
        but waiting, queued (one given up on is not answered: no one would read it, and asyncio would say so)."""
        while not self.queue.empty():
            self.waiting.append(self.queue.get_nowait())
        for pending in [*self.current, *self.waiting]:
            self._count_out(pending)
            if not (pending.future.done() or pending.abandoned):
                pending.future.set_exception(LimitError(status, message))
        self.current, self.waiting = [], []

    async def translate(self, lines: list[str], request: DecodeRequest = DecodeRequest(),
                        disconnected: asyncio.Future | None = None) -> list[str]:
        """The translations of ``lines`` (``submit`` of a translation job without per-sentence options)."""
        job = Job("translate", self.translator.check(request))
        return [hyps[0][0] for hyps in await self.submit(lines, job, None, disconnected)]

    def refusal(self) -> LimitError | None:
        """The 503 every request gets once the server is shutting down or decoding has stopped (``supervise``
        gave up): attention requests too, which run on the model thread without the queue. None otherwise."""
        if self.stopping:
            return LimitError(503, SHUTTING_DOWN)
        if not self.alive:
            return LimitError(503, f"decoding has stopped after {len(self.failures)} failures "
                                   f"(last: {self.failures[-1] if self.failures else 'none'})")
        return None

    async def submit(self, lines: list[str], job: Job, extra: dict[str, list] | None = None,
                     disconnected: asyncio.Future | None = None) -> list:
        """What ``job`` gives for each of ``lines`` once decoded (translate: its hypotheses as (text,
        score), best first; score: ``decode.Scored``); LimitError (503) when the queue is full, the
        wait for decoding passes ``queue_timeout``, or decoding has stopped. ``disconnected``
        completes when the client goes away: the request is then dropped, not decoded."""
        if (refusal := self.refusal()) is not None:
            raise refusal
        if len(lines) > self.limits.max_queued:  # a 503 would be retried for ever
            raise LimitError(422, f"{len(lines)} sentences, more than this server queues at once (the limit is "
                                  f"{self.limits.max_queued}, --max-queued): send them in smaller requests")
        if self.queued + len(lines) > self.limits.max_queued:
            self.shed += 1
            raise LimitError(503, f"busy: {self.queued} sentences are waiting to be decoded (the limit is "
                                  f"{self.limits.max_queued}); try again shortly", retry_after=1)
        texts = lines + [t for values in (extra or {}).values() for v in values for t in ([v] if isinstance(v, str) else v)]
        tokens = job.rows * sum(len(ids) + 1 for ids in self.translator.tokenizer.encode_batch(texts))
        pending = _Pending(lines, extra, job, tokens, asyncio.get_running_loop().create_future())
        self.queued += len(lines)
        await self.queue.put(pending)
        watch = {pending.future} | ({disconnected} if disconnected else set())
        done, _ = await asyncio.wait(watch, timeout=self.limits.queue_timeout, return_when=asyncio.FIRST_COMPLETED)
        with self.lock:  # against the model thread starting it at this moment (_decode)
            late = pending.future not in done and not pending.started
            pending.abandoned = late
        if late:
            self._count_out(pending)  # a request no one waits for does not keep others out
            if disconnected is not None and disconnected in done:
                raise LimitError(499, "the client went away")
            self.timed_out += 1
            raise LimitError(503, f"waited {self.limits.queue_timeout:g} s without being decoded (the server is "
                                  "busy); try again shortly", retry_after=max(1, round(self.limits.queue_timeout)))
        if pending.future not in done:  # decoding has begun: it runs on while the client waits for it
            done, _ = await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
            if pending.future not in done:  # gone mid-decode: the batches left of its work are not decoded
                with self.lock:
                    pending.abandoned = True
                raise LimitError(499, "the client went away")
        return pending.future.result()

    def _count_out(self, pending: _Pending) -> None:
        """``pending``'s lines out of ``queued``, once (taken into a batch, abandoned, or refused)."""
        if pending.counted:
            self.queued -= len(pending.lines)
            pending.counted = False

    def _take(self, pending: _Pending) -> bool:
        """Counts ``pending`` out of the queue (into a batch, or dropped); whether it is still to be decoded."""
        self._count_out(pending)
        if pending.abandoned or pending.future.done():
            self.dropped += 1
            return False
        return True

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        while True:
            if not self.waiting:
                self.waiting.append(await self.queue.get())
            first = self.waiting.pop(0)  # the request that has waited longest
            if not self._take(first):
                continue
            batch, budget, full = [first], self.limits.max_batch_tokens - first.tokens, False
            self.current = batch  # taken from the queue, not yet answered: failed if the worker dies

            def join(nxt: _Pending) -> bool:
                """``nxt`` into the batch if it is of the batch's job and fits (a request of another job waits
                for a batch of its own, and those of this job behind it join this one: one request of other
                settings in a stream of the same ones broke every batch in two); whether the batch is full."""
                nonlocal budget
                if nxt.job != first.job:
                    self.waiting.append(nxt)
                    return False
                if nxt.tokens > budget:
                    self.waiting.append(nxt)
                    return True
                if self._take(nxt):
                    batch.append(nxt)
                    budget -= nxt.tokens
                return False

            if self.limits.batching:
                waited, self.waiting = self.waiting, []
                for i, nxt in enumerate(waited):  # in the order they came, as far as the batch has room
                    if full := join(nxt):
                        self.waiting.extend(waited[i + 1:])
                        break
            deadline = time.monotonic() + self.limits.max_wait_ms / 1000
            while self.limits.batching and not full:
                left = deadline - time.monotonic()
                try:  # no time left (--max-wait-ms 0): what is queued, taken at once; wait_for(0) took nothing
                    nxt = self.queue.get_nowait() if left <= 0 else await asyncio.wait_for(self.queue.get(), left)
                except (TimeoutError, asyncio.QueueEmpty):
                    break
                full = join(nxt)
            batch = [p for p in batch if not (p.abandoned or p.future.done())]  # gone, or refused, meanwhile
            if batch:
                await self._decode(batch)
            self.current = []

    async def _decode(self, batch: list[_Pending]) -> None:
        job = batch[0].job
        self.batches += 1

        def work() -> tuple[list[_Pending], list]:
            """In the model thread: the requests still wanted when it gets to them are started and decoded."""
            with self.lock:
                live = [p for p in batch if not p.abandoned]
                for p in live:
                    p.started = True
            lines = [line for p in live for line in p.lines]
            if not lines:
                return live, []
            def joined(key: str, empty: object) -> list | None:  # the requests' values, in line order
                values = [x for p in live for x in (p.extra or {}).get(key) or [empty] * len(p.lines)]
                return values if any(values) else None

            if job.kind == "score":
                return live, self.translator.score(lines, [t for p in live for t in p.extra["translation"]],
                                                   job.request.alpha, self.limits.max_batch_tokens,
                                                   job.request.length_norm)
            longest = max(len(ids) + 1 for ids in self.translator.tokenizer.encode_batch(lines))
            request = dataclasses.replace(job.request, prefixes=joined("prefix", ""),
                                          constraints=joined("constraints", []),
                                          batch_size=min(self.translator.cfg.decode.batch_size,  # serve --batch-size
                                                         max(1, self.limits.max_batch_tokens // (job.rows * longest))))
            # between two search steps the work stops when no client waits for it any more, or the server stops
            found = self.translator.decode(lines, request,
                                           stop=lambda: self.stopping or all(p.abandoned for p in live))
            if job.request.alignment:  # each hypothesis with its word alignment: (text, score, pairs)
                found = [[(t, x, align(self.translator, line, t)) for t, x in hyps] for line, hyps in zip(lines, found)]
            return live, found

        try:
            live, outputs = await asyncio.get_running_loop().run_in_executor(self.executor, work)
        except Stopped:  # no one waits for it, or the server stops: whoever still waits is told so
            for p in batch:
                if p.future.done():
                    continue
                if self.stopping:
                    p.future.set_exception(LimitError(503, SHUTTING_DOWN))
                else:
                    p.future.cancel()
            self.dropped += len(batch)
            return
        except Exception as e:  # noqa: BLE001  every waiting client gets the error, the server goes on
            if (answer := _answerable(e)).status == 500:  # the server's fault: its traceback in the log, as promised
                _LOG.error("a decoding batch failed", exc_info=e)
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(answer)
            return
        self.requests += len(live)
        self.dropped += len(batch) - len(live)
        start = 0
        for p in live:
            if not p.future.done():
                p.future.set_result(outputs[start: start + len(p.lines)])
            start += len(p.lines)

    async def supervise(self) -> None:
        """Runs the worker; when it fails, every request waiting for it gets a 500, and it is restarted,
        at most MAX_RESTARTS times: then decoding stops and /health and every request say so."""
        while True:
            try:
                await self.run()
            except Exception as e:  # noqa: BLE001  a bug in the worker itself, not in one batch's decoding
                self.failures.append(f"{type(e).__name__}: {e}")
                last = len(self.failures) > MAX_RESTARTS  # the last one was told "it is restarted"
                _LOG.error(f"the decoding worker failed ({len(self.failures)} of at most {MAX_RESTARTS + 1})",
                           exc_info=e)
                self._refuse_all(500, f"the decoding worker failed ({self.failures[-1]}); "
                                      + ("decoding has stopped" if last else "it is restarted"))
                if last:
                    self.alive = False
                    return

    def health(self) -> dict:
        return {"queued_sentences": self.queued, "batches": self.batches, "requests": self.requests,
                "dropped_gone_or_late": self.dropped, "refused_busy": self.shed, "timed_out": self.timed_out,
                "worker_failures": self.failures}


class BodyLimit:
    """ASGI middleware: refuses a body over ``limit`` bytes with 413, whether or not it says its length, and a
    compressed one (Content-Encoding) with 415: it was read as JSON as sent, "the body is not UTF-8 text". A body
    still coming in when the server stops is answered 503 at once, as the requests waiting to be decoded are (its
    task cancelled after SHUTDOWN_GRACE_S, uvicorn answered a plain-text 500)."""
    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if (coding := headers.get(b"content-encoding", b"").strip().lower()) not in (b"", b"identity"):
            return await send_error(send, 415, f"Content-Encoding {coding.decode('latin-1')}: the server reads a body "
                                               "as it is sent; send it uncompressed")
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(send)
        received, started, refused, whole = 0, False, False, False
        batcher = getattr(getattr(scope.get("app"), "state", None), "batcher", None)
        pending: asyncio.Future | None = None  # a receive a cancelled call left: its message is the next one

        async def counting_receive():
            nonlocal received, refused, whole, pending
            if refused:  # answered here (413, 503): the request is over
                return {"type": "http.disconnect"}
            if pending is None and (whole or batcher is None):  # the body read (the client's leaving is awaited)
                message = await receive()
            else:
                pending = pending or asyncio.ensure_future(receive())
                # raced against the server's stop while the body comes in (the app reads it, the client sends it)
                stopping = asyncio.ensure_future(batcher.stopped.wait()) if batcher and not whole else None
                try:
                    await asyncio.wait([f for f in (pending, stopping) if f], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if stopping is not None:
                        stopping.cancel()
                if not pending.done():  # the server stops while the body comes in
                    pending.cancel()
                    pending = None
                    if not started:
                        refused = True
                        await send_error(send, 503, SHUTTING_DOWN)
                    return {"type": "http.disconnect"}
                message, pending = pending.result(), None
            if message["type"] == "http.request":
                whole = not message.get("more_body", False)
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
        await send_error(send, 413, f"request body larger than {self.limit} bytes")


async def send_error(send, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """An error answered below FastAPI (from ASGI middleware or a bare ASGI app), in the API's own form:
    ``{"error": message}`` as JSON."""
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), *headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _answerable(e: Exception, doing: str = "decoding") -> LimitError:
    """What clients get for an exception raised while answering them (in the decoding thread, say): a
    LimitError as it is; a user error the checks before queueing let through, 422; anything else, 500
    "``doing`` failed"; the message one line, as every error of the API."""
    if isinstance(e, LimitError):
        return e
    first = (str(e).splitlines() or [""])[0]
    if isinstance(e, UserError) and not isinstance(e, ModelOverflow):  # the model's fault, whatever was asked
        return LimitError(422, first)
    return LimitError(500, f"{doing} failed: {type(e).__name__}: {first}")


def _no_query(request: Request) -> None:
    """422 for a query string on an endpoint that reads its options from the body: `?nbest=2` was dropped
    without a word, while a misspelt key in the body is refused."""
    if request.query_params:
        # each as Python writes a string with a line break or a control character in it: the error is one line
        names = (n if n.isprintable() else repr(n) for n in sorted(set(request.query_params)))
        raise LimitError(422, f"query parameters are not read ({', '.join(names)}): "
                              "send every option in the JSON body")


def _check_chars(limits: Limits, text: str, where: str) -> None:
    if len(text) > limits.max_chars:
        raise LimitError(422, f"{where}: {len(text)} characters, more than the limit of {limits.max_chars}")


def _check_sentences(limits: Limits, lines: list[str], where: str) -> None:
    if len(lines) > limits.max_sentences:
        raise LimitError(422, f"{where}: {len(lines)} sentences, more than the limit of {limits.max_sentences}")
    for i, line in enumerate(lines):
        _check_chars(limits, line, f"{where}[{i}]")


def _check_score(req: ScoreRequest, limits: Limits) -> None:
    if len(req.translation) != len(req.text):
        # worded as a translation's prefix or constraints of another count are
        raise LimitError(422, f"translation: {len(req.translation)} given for {len(req.text)} input "
                              f"line{'s' * (len(req.text) != 1)}")
    _check_sentences(limits, req.text, "text")
    _check_sentences(limits, req.translation, "translation")


def _health(batcher: Batcher | None, name: str, weights: list[str], ensemble: list[dict]) -> JSONResponse:
    """200 while the decoding worker runs, 503 once it has stopped (or before it starts), with this package's
    version, the worker's counts and the weight files served (a run still training has newer ones by now: which
    the server loaded was said only at its start), an --ensemble's other runs' by run."""
    ok = batcher is not None and batcher.alive
    return JSONResponse({"status": "ok" if ok else "error", "version": __version__, "model": name,
                         "weights": weights,
                         **({"ensemble": ensemble} if ensemble else {}),
                         **(batcher.health() if batcher else {})}, status_code=200 if ok else 503)


def _check_translate(req: TranslateRequest, limits: Limits) -> None:
    """422 for more sentences, or longer ones, prefixes or constraints, than the limits."""
    _check_sentences(limits, req.text, "text")
    for i, line in enumerate(req.prefix or []):
        _check_chars(limits, line, f"prefix[{i}]")
    for i, phrases in enumerate(req.constraints or []):
        _check_chars(limits, " ".join(phrases), f"constraints[{i}]")


def _decode_request(req: TranslateRequest, translator: Translator, lines: list[str], max_beam: int,
                    limit: str = "--max-beam") -> DecodeRequest:
    """The request's options as a ``DecodeRequest`` for ``lines`` (its sentences), checked by the translator
    (422 with its one line, options spelt as the API spells them) and against the beam limit; the run's
    defaults filled in. Texts go on as sent, as `translate` reads its files' lines (the endpoint says why)."""
    asked = DecodeRequest(beam_size=req.beam, alpha=req.alpha, length_norm=req.length_norm,  # type: ignore[arg-type]
                          early_stop=req.early_stop, max_len_offset=req.max_len_offset,  # type: ignore[arg-type]
                          nbest=req.nbest, scores=req.scores, alignment=req.alignment,
                          prefixes=None if req.prefix is None else list(req.prefix),
                          constraints=None if req.constraints is None else [list(cs) for cs in req.constraints],
                          sample=req.sample, topk=req.topk, topp=req.topp, temperature=req.temperature, seed=req.seed)
    # the server's limit first: a beam past the vocabulary's size too was refused as "wider than the vocabulary"
    if req.sample and (req.nbest or 1) > max_beam:  # the run's own beam (req.beam None) is within max_beam
        raise LimitError(422, f"nbest: {req.nbest} draws, more than the limit of {max_beam} ({limit})")
    if not req.sample and req.beam is not None and req.beam > max_beam:
        raise LimitError(422, f"beam: {req.beam}, more than the limit of {max_beam} ({limit})")
    try:
        return translator.check(asked, lines, API)
    except ConfigError as e:
        raise LimitError(422, str(e)) from None


def _answer(req: TranslateRequest, found: list[list[tuple]]) -> TranslateResponse:
    """The response: the translations, and the scores, alignments or n-best lists when the request asked for
    them (``found``: per sentence its hypotheses, (text, score), with the alignment third when asked)."""
    return TranslateResponse(translations=[h[0][0] for h in found],
                             scores=[h[0][1] for h in found] if req.scores else None,
                             alignments=[h[0][2] for h in found] if req.alignment and req.nbest is None else None,
                             nbest=[[Hypothesis(text=x[0], score=x[1], alignment=x[2] if req.alignment else None)
                                     for x in h] for h in found] if req.nbest is not None else None)


async def _queued(batcher: Batcher, request: Request, lines: list[str], job: Job,
                  extra: dict[str, list] | None) -> list:
    """``batcher``'s results for ``lines`` (none to decode: none, unless the server is stopping or decoding has
    stopped: the 503 every request gets), dropped if the client goes away first."""
    if not lines:
        if (refusal := batcher.refusal()) is not None:
            raise refusal
        return []
    # once the body is read, the next message from the client is its leaving (http.disconnect)
    gone = asyncio.ensure_future(request.receive())
    try:
        return await batcher.submit(lines, job, extra, gone)
    finally:
        gone.cancel()


async def _in_model_thread(executor: ThreadPoolExecutor, request: Request, timeout: float, work,
                           stopped: asyncio.Event):
    """``work()`` in the model thread, for a request outside the batcher (attention): as a queued one, it
    is dropped if its client goes away (499) or it has waited ``timeout`` seconds (503) before the thread
    takes it up, and its client's leaving frees its attention slot at once. Once ``stopped`` is set (the
    server shutting down) it is answered 503 at once, as queued translations are: waiting on a long batch, it
    was cancelled by uvicorn's grace, whose client got a plain-text 500."""
    lock, flags = threading.Lock(), {"started": False, "dropped": False}

    def guarded():
        with lock:
            if flags["dropped"]:
                return None
            flags["started"] = True
        return work()

    result = asyncio.get_running_loop().run_in_executor(executor, guarded)
    result.add_done_callback(lambda f: f.cancelled() or f.exception())  # an error after the client left: no one's
    gone = asyncio.ensure_future(request.receive())  # the body is read: the next message is the client leaving
    stopping = asyncio.ensure_future(stopped.wait())
    try:
        done, _ = await asyncio.wait({result, gone, stopping}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        with lock:
            flags["dropped"] = result not in done and not flags["started"]
        if result not in done and stopping in done:
            raise LimitError(503, SHUTTING_DOWN)
        if flags["dropped"]:
            if gone in done:
                raise LimitError(499, "the client went away")
            raise LimitError(503, f"waited {timeout:g} s for the model (the server is busy); try again shortly",
                             retry_after=max(1, round(timeout)))
        if result not in done:
            done, _ = await asyncio.wait({result, gone, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if result not in done:
                if stopping in done:
                    raise LimitError(503, SHUTTING_DOWN)
                raise LimitError(499, "the client went away")
        return result.result()
    finally:
        gone.cancel()
        stopping.cancel()


def _check_pieces(translator: Translator, limits: Limits, text: str | None, where: str) -> None:
    """422 for an empty source sentence, or a side of more pieces (with EOS) than --max-attention-pieces."""
    if where == "text" and translator.blank([text])[0]:
        raise LimitError(422, f"{where}: empty sentence")
    if text is not None and (n := target_pieces(translator, text)) + 1 > limits.max_attention_pieces:
        raise LimitError(422, f"{where}: {n} pieces and EOS, more than the limit of {limits.max_attention_pieces} "
                              "(--max-attention-pieces): send a shorter text, or a shorter translation")


def _attention(translator: Translator, limits: Limits, text: str, translation: str | None) -> dict:
    """In the model thread: the maps of ``text`` and its translation (given, else the model's own). A user's
    error (a side past a learned position table) is a 422, as /v1/translate answers it; it was a 500."""
    try:
        _check_pieces(translator, limits, translation, "translation")
        tgt = translation if translation is not None else translator.translate([text])[0]
        _check_pieces(translator, limits, tgt, "the model's translation")
        unknown = list(dict.fromkeys(translator.unknown(text, source=True) + translator.unknown(tgt, source=False)))
        return {"translation": tgt, **attention_maps(translator, text, tgt).to_json(), "unknown": unknown}
    except UserError as e:
        if (answer := _answerable(e)).status != 422:  # the model's own failing: a 500, its traceback logged
            raise
        raise answer from None


def _answer_errors_in_json(app: FastAPI) -> None:
    """Every error in one shape, {"error": ...}: invalid requests (422, 400 for malformed JSON, 415 for a
    body not sent as JSON), our limits (with Retry-After on a 503), and FastAPI's own (a body it cannot
    parse, 404, 405)."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        kind = request.headers.get("content-type", "")
        mime = kind.split(";")[0].strip().lower()
        if mime != "application/json" and not mime.endswith("+json"):  # FastAPI reads it as no object at all
            return JSONResponse({"error": f"the body must be JSON, sent with Content-Type: application/json (this "
                                          f"request's: {kind or 'none'})"}, status_code=415)
        if bad := next((e for e in errors if e.get("type") == "json_invalid"), None):
            # the parser's reason and where ("JSON decode error" alone said neither): loc is ("body", its offset)
            reason = str((bad.get("ctx") or {}).get("error") or bad.get("msg", ""))
            at = [x for x in bad.get("loc", ())[1:] if isinstance(x, int)]
            return JSONResponse({"error": f"malformed JSON: {reason}" + (f" at character {at[0] + 1}" if at else "")},
                                status_code=400)
        if [(e.get("type"), tuple(e.get("loc", ()))) for e in errors] == [("missing", ("body",))]:
            return JSONResponse({"error": "malformed JSON: the body is empty (send a JSON object)"}, status_code=400)
        # the first few: a problem in each item of a long list was answered with every one of them (MBs)
        shown = errors[:MAX_ERRORS_SHOWN]
        # a validator's own ValueError: its message alone (pydantic puts "Value error, " before it)
        detail = [{"field": "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in e.get("loc", ())[1:])
                   .removeprefix("."),
                   "problem": e.get("msg", "").removeprefix("Value error, ")} for e in shown]
        # the one line names each field and its problem (a client, or the web page, shows only the line)
        line = " ".join("; ".join(f"{d['field'] or 'body'}: {d['problem']}" for d in detail).split())
        more = f"; and {len(errors) - len(shown):,} more" if len(errors) > len(shown) else ""
        return JSONResponse({"error": f"invalid request: {line}{more}", "detail": detail}, status_code=422)

    @app.exception_handler(LimitError)
    async def limited(request: Request, exc: LimitError) -> JSONResponse:
        headers = {"Retry-After": str(round(exc.retry_after))} if exc.retry_after else None
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":  # FastAPI's, raised from
            if type(exc.__cause__) is ValueError:  # JSON, but Python reads no integer of more digits
                return JSONResponse({"error": f"the body holds a number of more than {sys.get_int_max_str_digits():,} "
                                              "digits"}, status_code=400)
            why = {UnicodeDecodeError: "is not UTF-8 text", RecursionError: "nests arrays or objects too deeply"}.get(
                type(exc.__cause__), "cannot be read")  # what json.loads raised
            return JSONResponse({"error": f"malformed JSON: the body {why}"}, status_code=400)
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> JSONResponse:  # a bug: still JSON, still one line
        return JSONResponse({"error": _answerable(exc, "answering").message}, status_code=500)


def create_app(translator: Translator, limits: Limits = Limits(), name: str = "transformer") -> FastAPI:
    """The ASGI app; ``uvicorn`` serves it, tests call it in-process."""
    executor = ThreadPoolExecutor(1, thread_name_prefix="model")
    attention_slots = asyncio.Semaphore(limits.max_attention_queued)
    decode = translator.cfg.decode
    max_beam = max(limits.max_beam, decode.beam_size)  # the run's own beam (21 for parsing, §6.3) is allowed
    beam_limit = ("--max-beam" if max_beam == limits.max_beam else
                  "the server's own beam (--beam or the run's), above --max-beam")
    numbers = itertools.count()  # sampling requests, each decoded on its own

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.batcher = batcher = Batcher(translator, limits, executor)  # serve's Ctrl-C stops it
        worker = asyncio.create_task(batcher.supervise())
        yield
        worker.cancel()
        executor.shutdown(wait=False)

    app = FastAPI(title=f"transformer: {name}", version=__version__, lifespan=lifespan,
                  description="Translation with the Transformer of 'Attention Is All You Need' (beam search, "
                              "§6.1) and its attention weights (appendix figures).")
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)

    _answer_errors_in_json(app)

    @app.post("/v1/translate", response_model=TranslateResponse, response_model_exclude_none=True, responses=_ERRORS)
    async def translate(req: TranslateRequest, request: Request) -> TranslateResponse:
        """Translate sentences with beam search (or, with "sample", by drawing from the model); requests
        from all clients with the same settings are decoded together."""
        _no_query(request)
        _check_translate(req, limits)
        # as sent: the translator strips each, as it does a line of `translate`'s input, and the vocabulary's
        # normalisation makes a line break a space; splitting on Python's whitespace made spaces of characters
        # the vocabulary removes or keeps (U+000B, U+001C..U+001F, U+0085): other pieces than `translate` read
        lines = list(req.text)
        asked = _decode_request(req, translator, lines, max_beam, beam_limit)
        keep = [i for i, blank in enumerate(translator.blank(lines)) if not blank]
        extra = {key: [values[i] for i in keep] for key, values in (("prefix", asked.prefixes),
                                                                     ("constraints", asked.constraints)) if values}
        job = Job("translate", dataclasses.replace(asked, prefixes=None, constraints=None, scores=False),
                  next(numbers) if asked.sample else None)
        outputs = await _queued(app.state.batcher, request, [lines[i] for i in keep], job, extra or None)
        found: list[list[tuple]] = [[("", 0.0, [])] * (asked.nbest or 1) for _ in lines]  # empty line: empty outputs
        for i, hyps in zip(keep, outputs):
            found[i] = hyps
        return _answer(req, found)

    @app.post("/v1/score", response_model=ScoreResponse, responses=_ERRORS)
    async def score(req: ScoreRequest, request: Request) -> ScoreResponse:
        """Score given translations (forced decoding): the beam's length-normalised score of each and
        its log-probability; queued and batched like translations."""
        _no_query(request)
        _check_score(req, limits)
        try:
            # the length normalisation too, as `score --length-norm`: a hypothesis of a "length_norm" translation
            # request scored without it got another score than the one it was answered with
            given = DecodeRequest(alpha=req.alpha, length_norm=req.length_norm)  # type: ignore[arg-type]
            asked = translator.check(given, names=API)
        except ConfigError as e:
            raise LimitError(422, str(e)) from None
        job = Job("score", DecodeRequest(alpha=asked.alpha, length_norm=asked.length_norm))
        results = await _queued(app.state.batcher, request, list(req.text), job,  # as sent, as in translate()
                                {"translation": list(req.translation)})
        return ScoreResponse(scores=[r.score for r in results], log_probs=[r.log_prob for r in results])

    @app.post("/v1/attention", responses={200: {"model": AttentionResponse}} | _ERRORS)
    async def attention(req: AttentionRequest, request: Request) -> Response:
        """Every layer's attention weights for one sentence pair, in the compact form the page draws:
        {"translation", "src", "tgt_in", "tgt_out", "scale", "shape": {kind: [L, H, Tq, Tk]},
        "weights": {kind: flat integers}}; weight = integer / scale (figures.AttentionMaps.to_json)."""
        _no_query(request)
        _check_chars(limits, req.text, "text")
        if req.translation is not None:
            _check_chars(limits, req.translation, "translation")
        _check_pieces(translator, limits, req.text, "text")
        if translator.setup.ensemble:  # as "alignment" (request.REFUSED): the models' attentions are not one
            raise LimitError(422, "attention with --ensemble: an ensemble has no one attention to draw")
        if (refusal := app.state.batcher.refusal()) is not None:
            raise refusal
        if attention_slots.locked():
            app.state.batcher.shed += 1  # /health's refused_busy: the requests refused for a full queue
            n = limits.max_attention_queued
            raise LimitError(503, f"busy: {n} attention request{'s are' if n != 1 else ' is'} in progress, the limit "
                                  "(--max-attention-queued); try again shortly", retry_after=1)
        async with attention_slots:
            maps = await _in_model_thread(executor, request, limits.queue_timeout,
                                          lambda: _attention(translator, limits, req.text, req.translation),
                                          app.state.batcher.stopped)
            body = await asyncio.to_thread(lambda: json.dumps(maps).encode())  # MBs: not on the event loop
        return Response(body, media_type="application/json")

    weights = [p.name for p in translator.weights_from]  # names alone: the server's paths are its own
    ensemble = [{"run": run.name, "weights": [p.name for p in read]} for run, read in translator.ensemble_from]

    @app.get("/health", responses={200: {"description": "the decoding worker runs"},
                                   503: {"description": "the decoding worker has stopped (or not started): the same "
                                                        "body, its status \"error\""}})
    async def health() -> JSONResponse:
        return _health(getattr(app.state, "batcher", None), name, weights, ensemble)

    page = web_page("index.html", {"{{TITLE}}": html.escape(name), "{{BEAM}}": str(decode.beam_size),
                                   "{{MAX_BEAM}}": str(max_beam), "{{ALPHA}}": str(decode.alpha),
                                   "{{MAX_ALPHA}}": f"{MAX_ALPHA:g}",
                                   "{{DRAWN}}": "false" if translator.setup.ensemble else "true"})

    @app.get("/", response_class=HTMLResponse)
    async def index() -> str:
        return page

    # HEAD, what uptime checkers send: GET's headers (the page's own type, not JSON), without the body
    for path, answer, kind in (("/health", health, JSONResponse), ("/", index, HTMLResponse)):
        app.add_api_route(path, answer, methods=["HEAD"], include_in_schema=False, response_class=kind)

    return app


async def _busy(scope, receive, send) -> None:
    """The ASGI app that answers a connection over --max-connections: 503, try again in a second."""
    await send_error(send, 503, "busy: too many connections are open; try again shortly",
                     ((b"retry-after", b"1"), (b"connection", b"close")))


def deadline_protocol(seconds: float, max_connections: int) -> type:
    """uvicorn's h11 protocol with a deadline: while the server waits for a request (from the connection's
    opening, or the end of the previous response, until the request's last body byte), at most ``seconds``
    may pass, else the connection is closed. uvicorn itself only closes keep-alive connections idle between
    requests: a client that trickles its headers or stalls mid-body (slowloris) would hold its connection
    and buffers for ever. Decoding time does not count. Always h11: uvicorn's httptools protocol, picked
    when httptools is installed, would need its own version.

    The answer has a deadline of its own: a client that stops reading (pipelined requests whose answers
    fill the socket's buffers) is cut off once writing has stalled for ``seconds``; else it held its
    connection for as long as it stayed open, and as many such clients as ``max_connections`` locked
    everyone else out.

    A connection opened while ``max_connections`` others are open gets 503 for its request (read whole,
    so the client sees the answer) and is closed; the earlier ones are served. uvicorn's own
    limit_concurrency counts at request time, so a burst of connections would refuse them all."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    waiting = (h11.IDLE, h11.SEND_BODY)  # the client's states in which the server waits for it

    class DeadlineH11Protocol(H11Protocol):
        deadline: asyncio.TimerHandle | None = None
        stalled: asyncio.TimerHandle | None = None  # the answer's: writing has paused (the client reads nothing)

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self.app = _busy
            self._start()

        def on_response_complete(self) -> None:
            self._start()  # before super(): it may read a pipelined request whole and stop the clock again
            super().on_response_complete()

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state not in waiting:
                self._stop()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self.stalled is None:
                self.stalled = self.loop.call_later(seconds, self.transport.abort)  # close() would flush first

        def resume_writing(self) -> None:
            super().resume_writing()
            self._resumed()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop()
            self._resumed()
            super().connection_lost(exc)

        def _resumed(self) -> None:
            if self.stalled is not None:
                self.stalled.cancel()
                self.stalled = None

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
          int8: bool = False, device: str | None = None, decode: dict[str, object] | None = None,
          ensemble: Sequence[Path] = (), bf16: bool = False) -> None:
    """``decode``: ``decode.*`` fields replacing the run's own (the command line's --beam, --alpha, ...),
    the defaults of requests that do not give them; ``ensemble``: more runs that decode with this one, as
    `translate --ensemble` (docs/decoding.md's table is the server's too). Every option is checked, and the
    port taken, before the model is loaded; the server says where it listens once it does."""
    import uvicorn

    if not 1 <= port <= 65535:
        raise ConfigError(f"--port {port}: give a TCP port, 1 .. 65535")
    defaults = DecodeRequest(**(decode or {}))  # checked as a request's options, naming them, before loading
    defaults.verify()
    sock = listen(host, port)
    try:
        said: list[str] = []  # what loading says, once it has passed its checks: an error comes alone
        translator = Translator(run_dir, checkpoint, log=said.append, int8=int8, device=device, decode=decode,
                                ensemble=ensemble, bf16=bf16)
        translator.check(defaults)  # and against the model
        for message in said:
            print(message, file=sys.stderr)
        app = create_app(translator, limits, name=Path(run_dir).resolve().name)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_keep_alive=5,
                                http=deadline_protocol(limits.request_timeout, limits.max_connections),
                                timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
        print(f"serving {run_dir} on http://{host}:{port}/ (API schema: /openapi.json; /docs shows it, with "
              "Swagger UI's scripts from the network)", flush=True)

        class Server(uvicorn.Server):
            """On Ctrl-C (or SIGTERM), the batcher stops first: uvicorn waits for the requests in progress to
            be answered before it exits, and one long request would hold it for minutes."""

            def handle_exit(self, sig, frame) -> None:
                if (batcher := getattr(app.state, "batcher", None)) is not None:
                    batcher.stop()
                # a request still coming in (a stalled client's body) is cut short at shutdown, as asked: not an
                # error of the application to log with its traceback (a second Ctrl-C printed two)
                logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
                super().handle_exit(sig, frame)

        if threading.current_thread() is threading.main_thread():
            # uvicorn takes SIGINT and SIGTERM while it serves and raises the one it got again once it has
            # stopped; where the signal was ignored (a job that a non-interactive shell put in the background)
            # that did nothing, and a server stopped by Ctrl-C exited 0, as if it had ended by itself
            for signum, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
                if signal.getsignal(signum) == signal.SIG_IGN:
                    signal.signal(signum, default)
        Server(config).run(sockets=[sock])
    finally:
        sock.close()


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port``, or a UserError in one line saying why not (uvicorn binding
    it would log its own error after the server had said it was serving, and exit 3)."""
    sock = None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn: "localhost" is 127.0.0.1, not ::1
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart need not wait
        sock.bind(address)
        sock.listen(2048)  # uvicorn's own backlog
        return sock
    except OSError as e:
        if sock is not None:
            sock.close()
        hint = ": another program listens there; give another --port" if e.errno == errno.EADDRINUSE else ""
        raise UserError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e}){hint}") from None
