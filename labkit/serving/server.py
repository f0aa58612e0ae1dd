"""An OpenAI-style chat-completions endpoint on 127.0.0.1, driven by the serving engine.

    server = Server(model, tok, "smollm2-135m", policy="chunked")   # port=0: a free port
    url = server.start()                                            # http://127.0.0.1:PORT
    # curl $url/v1/chat/completions -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}]}'
    server.stop()

Routes: `POST /v1/chat/completions` (with `"stream": true`, server-sent events: one
`data: {chunk}` per token and `data: [DONE]`), `GET /v1/models`, `GET /health`. Errors are
JSON, `{"error": {"message", "type", "param", "code"}}`, with 400 for a malformed body or
bad parameter, 404 for an unknown model or path.

Built on the standard library (`http.server.ThreadingHTTPServer`, one thread per
connection) rather than an ASGI stack: it adds no dependency, starts in milliseconds
inside a notebook, and the part that matters here, batching, is the engine's. One engine
thread owns the model and the cache; handler threads only queue requests and read the
tokens back, so nothing else touches the model concurrently. It binds 127.0.0.1 only.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from http.server import ThreadingHTTPServer

from labkit.generation.reply import encode_prompt
from labkit.serving._http import ApiError, ChatHandler, parse_chat_request
from labkit.serving.engine import Engine
from labkit.serving.request import Request

__all__ = ["Server", "EngineThread", "ApiError", "parse_chat_request"]


class EngineThread:
    """The engine in a background thread, on the real clock: `submit(request)` returns a token queue."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.inbox: queue.Queue = queue.Queue()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.t0 = time.perf_counter()
        self.thread = threading.Thread(target=self._loop, name="labkit-engine", daemon=True)
        self.error: BaseException | None = None

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    def submit(self, req: Request) -> queue.Queue:
        """Queue `req` (arrival = now); its tokens, then None when it ends, come out of the returned queue."""
        out: queue.Queue = queue.Queue()
        req.arrival = self.clock()
        self.engine.scheduler.check(req)  # in the caller's thread: a ValueError becomes the caller's 400
        self.inbox.put((req, out))
        self.wake.set()
        return out

    def _loop(self) -> None:
        def listener(q):
            return lambda req, token: q.put(token)
        queues: dict = {}
        try:
            while not self.stopping.is_set():
                while not self.inbox.empty():
                    req, out = self.inbox.get()
                    queues[req.id] = out
                    self.engine.add(req, listener(out))
                step = self.engine.step(self.clock(), draining=self.inbox.empty(), clock=self.clock)
                for rid in [rid for rid, q in queues.items() if rid not in self.engine.listeners]:
                    queues.pop(rid).put(None)  # finished: close its stream
                if step is None:
                    self.wake.wait(0.02)
                    self.wake.clear()
        except BaseException as exc:  # surface in every open stream instead of hanging them
            self.error = exc
            for q in queues.values():
                q.put(None)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.wake.set()
        self.thread.join(timeout)


class Server:
    """`labkit serve`: the engine behind an HTTP server on 127.0.0.1 (see the module docstring)."""

    def __init__(self, model, tok, model_name: str, *, host: str = "127.0.0.1", port: int = 0, **engine_opts):
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError(f"host must be 127.0.0.1 (this server is for this machine only), got {host!r}")
        self.tok, self.model_name = tok, model_name
        self.engine = EngineThread(Engine(model, **engine_opts))
        self.ids = itertools.count()
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="labkit-http", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> str:
        self.engine.start()
        self._thread.start()
        return self.url

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.engine.stop()
        self._thread.join(5)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def new_request(self, fields: dict) -> Request:
        messages = fields["messages"]
        if getattr(self.tok, "chat_template", None) is None:  # a base model: the messages as plain text to continue
            messages = "\n\n".join(m["content"] for m in messages)
        eos = getattr(self.tok, "eos_id", None)
        try:
            prompt = encode_prompt(self.tok, messages, chat=None)
            return Request(f"chatcmpl-{next(self.ids)}", prompt, fields["max_tokens"], params=fields["params"],
                           seed=fields["seed"], stop_ids=frozenset() if eos is None else frozenset([eos]))
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None


def _handler(server: Server):
    return type("Handler", (ChatHandler,), {"server_ref": server})

