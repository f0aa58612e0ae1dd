"""The HTTP face of `labkit serve`: a FastAPI (ASGI) app, run by uvicorn, in front of the engine thread.

Routes: `POST /v1/chat/completions`, `POST /v1/completions` (plain prompt), `GET /v1/models`,
`GET /v1/models/{id}`, `GET /health` (the engine loop answers a ping), `GET /metrics`
(Prometheus text format). Errors are OpenAI's error object with a 4xx for anything the
client got wrong, 429 + Retry-After when the queue is full, 5xx only for the engine's own
failures.

HTTP parsing, keep-alive, idle timeouts and disconnect detection are uvicorn's and
Starlette's. This file adds what an API server must decide itself: the body's size and how
long it may take to arrive, what a client that leaves cancels (its requests, in the
scheduler, before the next pass), and how tokens become text (`ReplyText`: the tokenizer's
`StreamDecoder`, stop strings held back until they can no longer match).
"""
from __future__ import annotations

import asyncio
import json
import time

from fastapi import FastAPI, Request as HttpRequest
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from labkit.serving.http.openai_api import ApiError, parse_chat, parse_completion
from labkit.serving.http.reply_text import ReplyText, logprob_entry, legacy_logprobs
from labkit.serving.engine.runtime import Overloaded

__all__ = ["create_app", "read_json"]

POLL_S = 0.25  # how often a waiting handler checks that its client is still there


async def read_json(request: HttpRequest, limit: int, timeout_s: float):
    """The body as JSON: at most `limit` bytes, arriving within `timeout_s` seconds, or an ApiError (4xx)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {declared} bytes, more than the limit of {limit}", code="too_large")

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"the request body is more than the limit of {limit} bytes", code="too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        body = await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout_s:g} s", code="body_timeout",
                       headers={"Connection": "close"}) from None
    try:
        value = json.loads(body)
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not valid UTF-8", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "the request body nests too deeply to be a request", code="invalid_json") from None
    except ValueError as exc:  # malformed JSON, or an integer literal too long to convert
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    where = _lone_surrogate(value, "")
    if where is not None:  # JSON may escape half a UTF-16 pair ("\ud800"): no text can hold it
        raise ApiError(400, f"{where or 'the body'} holds a lone UTF-16 surrogate escape, which is not text",
                       code="invalid_json", param=where or None)
    return value


def _lone_surrogate(value, path: str) -> str | None:
    """The path of the first string (value or key) that cannot be encoded as UTF-8, or None."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return where
        elif isinstance(item, dict):
            for key, sub in item.items():
                stack.append((key, where))
                stack.append((sub, f"{where}.{key}" if where else str(key)))
        elif isinstance(item, list):
            stack.extend((sub, f"{where}[{i}]") for i, sub in enumerate(item))
    return None


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def create_app(srv) -> FastAPI:
    """The app for a `labkit.serving.http.server.Server` (its tokenizer, engine thread, limits and metrics)."""
    app = FastAPI(title="labkit", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def api_error(request, err: ApiError):
        return _error(err)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        hint = "; try POST /v1/chat/completions" if exc.status_code == 404 else ""
        return _error(ApiError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}{hint}",
                               code="not_found" if exc.status_code == 404 else None))

    @app.get("/health")
    async def health():
        alive = await asyncio.get_running_loop().run_in_executor(None, srv.engine.ping, 5.0)
        body = {"status": "ok" if alive else "engine not responding", "policy": srv.engine.engine.policy,
                **srv.engine.stats()}
        return JSONResponse(body, status_code=200 if alive else 503)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(srv.metrics.render(srv.engine.stats()), media_type=srv.metrics.content_type)

    def model_card() -> dict:
        return {"id": srv.model_name, "object": "model", "created": srv.created, "owned_by": "labkit"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != srv.model_name:
            raise ApiError(404, f"the model {model_id!r} does not exist; this server runs {srv.model_name!r}",
                           param="model", code="model_not_found")
        return model_card()

    @app.post("/v1/chat/completions")
    async def chat(request: HttpRequest):
        job = parse_chat(await read_json(request, srv.max_body, srv.body_timeout_s), srv.model_name)
        return await _serve(srv, request, job)

    @app.post("/v1/completions")
    async def completions(request: HttpRequest):
        job = parse_completion(await read_json(request, srv.max_body, srv.body_timeout_s), srv.model_name)
        return await _serve(srv, request, job)

    return app


class _Run:
    """The n requests of one job, their token events (from the engine thread) and their text."""

    def __init__(self, srv, job, reqs):
        self.srv, self.job, self.reqs = srv, job, reqs
        self.events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.sink = lambda req, token: loop.call_soon_threadsafe(self.events.put_nowait, (req, token))
        self.texts = {r.id: ReplyText(srv.tok, job.stop) for r in reqs}
        self.index = {r.id: i for i, r in enumerate(reqs)}
        self.seen = {r.id: 0 for r in reqs}
        self.heard = {r.id: 0 for r in reqs}  # tokens each request's events have delivered: logprobs read up to here
        self.offsets: dict = {}  # characters of each reply reported so far (the completions format's text_offset)
        self.open = set(self.index)
        self.checked = time.monotonic()
        self.id, self.created = f"{'chatcmpl' if job.kind == 'chat' else 'cmpl'}-{reqs[0].id}", int(time.time())

    def submit(self) -> None:
        try:
            for req in self.reqs:
                self.srv.engine.submit(req, self.sink)
        except Overloaded as exc:
            self.abort()
            self.srv.metrics.rejected.inc()
            raise ApiError(429, str(exc), code="overloaded", headers={"Retry-After": str(exc.retry_after)}) from None
        except ValueError as exc:
            self.abort()
            raise ApiError(400, str(exc), param="max_tokens", code="too_long") from None

    def abort(self) -> None:
        for req in self.reqs:
            if req.id in self.open:
                self.srv.engine.abort(req)

    async def next(self, request: HttpRequest):
        """The next (request, token) event, or None if the client has gone (checked every POLL_S)."""
        while True:
            now = time.monotonic()
            if now - self.checked >= POLL_S:
                self.checked = now
                if await request.is_disconnected():
                    return None
            try:
                return await asyncio.wait_for(self.events.get(), POLL_S)
            except asyncio.TimeoutError:
                continue

    def take(self, req, token):
        """Text (and logprob entries) a token event adds; at the end, the finish reason (or an ApiError)."""
        text = self.texts[req.id]
        if token is not None:
            if not text.stopped:  # logprobs end with the token that completed the stop string, as the text does
                self.heard[req.id] += 1
            piece = text.push(token)
            if text.stopped:  # a stop string: end this request now, in the scheduler too
                self.srv.engine.abort(req, "stop")
            return piece, None
        self.open.discard(req.id)
        if req.finish_reason == "rejected":  # its parameters could not sample these logits
            raise ApiError(400, req.error, code="invalid_value")
        if req.finish_reason == "error":
            raise ApiError(500, req.error or "the engine failed", code="engine_error")
        if req.finish_reason == "timeout":
            raise ApiError(504, req.error, code="timeout")
        if req.finish_reason == "abort" and not text.stopped:
            raise ApiError(503, req.error or "the request was cancelled", code="aborted")
        return text.finish(), "stop" if text.stopped else req.finish_reason

    def logprobs(self, req):
        """Log-probabilities of the tokens not yet reported: chat's `content` list, or the completions format."""
        if self.job.logprobs is None:
            return None
        # up to the tokens delivered, never len(req.token_logprobs): the engine thread appends to it while this runs,
        # an entry ahead of its token (its event still queued), which would be skipped for good
        start, end = self.seen[req.id], self.heard[req.id]
        self.seen[req.id] = end
        if self.job.kind == "completion":
            lp = legacy_logprobs(self.srv.tok, req, start, end, self.offsets.get(req.id, 0))
            self.offsets[req.id] = self.offsets.get(req.id, 0) + sum(len(t) for t in lp["tokens"])
            return lp
        return [logprob_entry(self.srv.tok, t, *req.token_logprobs[k])
                for k, t in zip(range(start, end), req.output[start:end])]

    def usage(self) -> dict:
        n_prompt, n_out = len(self.reqs[0].prompt), sum(len(r.output) for r in self.reqs)
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
                 "prompt_tokens_details": {"cached_tokens": min(self.reqs[0].cached_tokens, n_prompt)}}  # prefix cache
        if self.srv.engine.engine.speculator is not None:  # labkit's own field: OpenAI's accepted_prediction_tokens
            # count a client's Predicted Output, which this server does not take; these are the server's own drafts
            usage["speculation"] = {"drafted_tokens": sum(r.drafted for r in self.reqs),
                                    "accepted_tokens": sum(r.accepted for r in self.reqs)}
        return usage


async def _serve(srv, request: HttpRequest, job):
    run = _Run(srv, job, srv.requests_for(job))
    run.submit()
    if job.stream:
        return StreamingResponse(_stream(run, request), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    try:
        pieces, reasons = {r.id: [] for r in run.reqs}, {}
        while run.open:
            event = await run.next(request)
            if event is None:
                return JSONResponse({}, status_code=499)  # the client left; nobody reads this
            req, token = event
            piece, reason = run.take(req, token)
            pieces[req.id].append(piece)
            if token is None:
                reasons[req.id] = reason
    finally:
        run.abort()
    choices = []
    for i, req in enumerate(run.reqs):
        text = "".join(pieces[req.id])
        if job.kind == "chat":
            lp = run.logprobs(req)
            choices.append({"index": i, "message": {"role": "assistant", "content": text},
                            "logprobs": None if lp is None else {"content": lp}, "finish_reason": reasons[req.id]})
        else:
            choices.append({"index": i, "text": text, "logprobs": run.logprobs(req), "finish_reason": reasons[req.id]})
    return {"id": run.id, "object": "chat.completion" if job.kind == "chat" else "text_completion",
            "created": run.created, "model": srv.model_name, "choices": choices, "usage": run.usage()}


def _sse(payload) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


async def _stream(run: _Run, request: HttpRequest):
    job, srv = run.job, run.srv
    head = {"id": run.id, "object": "chat.completion.chunk" if job.kind == "chat" else "text_completion",
            "created": run.created, "model": srv.model_name}

    def chunk(i, content=None, reason=None, logprobs=None, first=False):
        if job.kind == "chat":
            delta = {"role": "assistant", "content": ""} if first else ({} if content is None else {"content": content})
            choice = {"index": i, "delta": delta, "logprobs": None if logprobs is None else {"content": logprobs},
                      "finish_reason": reason}
        else:
            choice = {"index": i, "text": content or "", "logprobs": logprobs, "finish_reason": reason}
        return _sse({**head, "choices": [choice], **({"usage": None} if job.include_usage else {})})

    try:
        if job.kind == "chat":
            for i in range(len(run.reqs)):
                yield chunk(i, first=True)
        while run.open:
            event = await run.next(request)
            if event is None:
                return  # the client left: `finally` cancels its requests
            req, token = event
            try:
                piece, reason = run.take(req, token)
            except ApiError as err:
                yield _sse(err.body())
                return
            i = run.index[req.id]
            lp = run.logprobs(req)
            if piece or (lp and (lp.get("tokens") if isinstance(lp, dict) else lp) and token is not None):
                yield chunk(i, piece, logprobs=lp)
            if token is None:
                yield chunk(i, reason=reason)
        if job.include_usage:
            yield _sse({**head, "choices": [], "usage": run.usage()})
        yield _sse("[DONE]")
    finally:
        run.abort()
