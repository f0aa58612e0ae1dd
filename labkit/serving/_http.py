"""The HTTP side of `labkit.serving.server`: one handler thread per connection, JSON in, JSON or SSE out."""
from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler

from labkit.sampling.pipeline import SamplingParams

MAX_BODY = 1 << 20  # bytes: a chat request larger than 1 MiB is refused


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def parse_chat_request(body: bytes, model_name: str) -> dict:
    """Validate a chat-completions body; return the fields the engine needs (ApiError on bad input)."""
    try:
        data = json.loads(body or b"")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_request")
    if data.get("model", model_name) != model_name:
        raise ApiError(404, f"the model {data.get('model')!r} does not exist; this server runs {model_name!r}",
                       param="model", code="model_not_found")
    messages = data.get("messages")
    if not (isinstance(messages, list) and messages and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                             and m.get("role") in ("system", "user", "assistant")
                                                             for m in messages)):
        raise ApiError(400, "messages must be a non-empty list of {'role': 'system'|'user'|'assistant', 'content': str}",
                       param="messages")
    max_tokens = data.get("max_completion_tokens", data.get("max_tokens", 64))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ApiError(400, f"max_tokens must be a positive integer, got {max_tokens!r}", param="max_tokens")
    try:
        params = SamplingParams(temperature=float(data.get("temperature", 0.0)), top_p=float(data.get("top_p", 1.0)))
    except (TypeError, ValueError) as exc:
        raise ApiError(400, str(exc), param="temperature/top_p") from None
    seed = data.get("seed", 0)
    if seed is not None and not isinstance(seed, int):
        raise ApiError(400, f"seed must be an integer, got {seed!r}", param="seed")
    return {"messages": messages, "max_tokens": max_tokens, "params": params, "seed": seed,
            "stream": bool(data.get("stream", False))}


class ChatHandler(BaseHTTPRequestHandler):
    server_ref = None  # the labkit Server (set by a subclass per server)
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # keep a notebook's output clean
        pass

    # ---- plumbing ----------------------------------------------------------------------------

    def _send_json(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, err: ApiError) -> None:
        kind = "invalid_request_error" if err.status < 500 else "server_error"
        self._send_json(err.status, {"error": {"message": str(err), "type": kind, "param": err.param, "code": err.code}})

    def _event(self, payload) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    # ---- routes ------------------------------------------------------------------------------

    def do_GET(self):
        srv = self.server_ref
        if self.path == "/health":
            self._send_json(200, {"status": "ok", "policy": srv.engine.engine.policy})
        elif self.path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{"id": srv.model_name, "object": "model", "owned_by": "labkit"}]})
        else:
            self._error(ApiError(404, f"no route {self.path}; try POST /v1/chat/completions", code="not_found"))

    def do_POST(self):
        if self.path != "/v1/chat/completions":
            return self._error(ApiError(404, f"no route {self.path}; try POST /v1/chat/completions", code="not_found"))
        srv = self.server_ref
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                raise ApiError(413, f"the request body is {length} bytes, more than {MAX_BODY}")
            fields = parse_chat_request(self.rfile.read(length), srv.model_name)
            req = srv.new_request(fields)
            try:
                tokens = srv.engine.submit(req)
            except ValueError as exc:
                raise ApiError(400, str(exc), param="max_tokens") from None
        except ApiError as err:
            return self._error(err)
        except Exception as exc:  # never drop the connection without an answer
            return self._error(ApiError(500, f"{type(exc).__name__}: {exc}"))
        if fields["stream"]:
            return self._stream(req, tokens)
        while tokens.get() is not None:
            pass
        self._complete(req)

    def _check_engine(self):
        err = self.server_ref.engine.error
        if err is not None:
            raise ApiError(500, f"the engine stopped: {type(err).__name__}: {err}")

    def _text(self, ids) -> str:
        tok = self.server_ref.tok
        eos = getattr(tok, "eos_id", None)
        return tok.decode([i for i in ids if i != eos])

    def _complete(self, req) -> None:
        try:
            self._check_engine()
        except ApiError as err:
            return self._error(err)
        n_prompt, n_out = len(req.prompt), len(req.output)
        self._send_json(200, {
            "id": req.id, "object": "chat.completion", "created": int(time.time()), "model": self.server_ref.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": self._text(req.output)},
                         "finish_reason": req.finish_reason}],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
            "timing": {"ttft_s": req.ttft, "itl_s": req.itls}})

    def _stream(self, req, tokens) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        head = {"id": req.id, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.server_ref.model_name}
        self._event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        ids, sent = [], ""
        while (token := tokens.get()) is not None:
            ids.append(token)
            text = self._text(ids)
            if text.endswith("\ufffd"):
                continue  # half of a multi-byte character: wait for the rest
            if len(text) > len(sent):
                self._event({**head, "choices": [{"index": 0, "delta": {"content": text[len(sent):]}, "finish_reason": None}]})
                sent = text
        reason = req.finish_reason if self.server_ref.engine.error is None else "error"
        self._event({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
        self._event("[DONE]")
        self.close_connection = True
