"""`labkit serve`: the serving engine behind an OpenAI-compatible HTTP API on 127.0.0.1.

    server = Server(model, tok, "smollm2-135m", policy="chunked")   # port=0: a free port
    url = server.start()                                            # http://127.0.0.1:PORT
    # any OpenAI client: OpenAI(base_url=url + "/v1", api_key="none").chat.completions.create(...)
    server.stop()

The stack is the one this field's servers use: a FastAPI app (`labkit.serving.http.app`) on
uvicorn, here in a background thread so a notebook can start and stop it; the engine runs
in a thread of its own (`labkit.serving.engine.runtime.EngineThread`) and is the only code that
touches the model. It binds 127.0.0.1; another host needs `allow_remote=True` and warns.

The KV pool is sized by memory, not by the model's whole context times the batch:
`kv_memory` is bytes (`"256MiB"`, an int) or a fraction of the memory free now (`0.1`); the
startup line says how many tokens it holds. Requests are bounded too: `max_tokens` at most
`max_tokens_limit`, a deadline of `request_timeout` seconds, `max_waiting` requests queued
before new ones get 429 with Retry-After.
"""
from __future__ import annotations

import itertools
import re
import socket
import threading
import time
import warnings

import torch

from labkit import checks
from labkit.kvcache.memory import kv_bytes_per_token
from labkit.sampling.constrained import make_constraint
from labkit.serving.engine.loop import Engine
from labkit.serving.http.metrics import ServerMetrics
from labkit.serving.http.openai_api import ApiError, Job
from labkit.serving.engine.request import Request
from labkit.serving.engine.runtime import EngineThread

__all__ = ["Server", "EngineThread", "ApiError", "kv_pool_blocks", "DEFAULT_KV_MEMORY"]

DEFAULT_KV_MEMORY = "256MiB"  # SmolLM2 in float32: about 5,800 tokens of KV, and `labkit serve` under ~1.5 GB RSS
_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read MemAvailable from /proc/meminfo: give kv_memory in bytes")


def kv_pool_blocks(model, kv_memory, block_size: int) -> int:
    """Blocks of `block_size` tokens that fit in `kv_memory` (bytes, '512MiB', or a fraction of free memory).

    >>> from labkit.model.config import ModelConfig
    >>> kv_pool_blocks(ModelConfig.from_name("smollm2-135m"), "256MiB", 16)   # float32 cache
    364
    """
    if isinstance(kv_memory, float) and 0 < kv_memory < 1:
        nbytes = kv_memory * _available_bytes()
    elif checks.is_int(kv_memory) and kv_memory > 0:
        nbytes = kv_memory
    elif isinstance(kv_memory, str) and (m := re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", kv_memory)) \
            and m.group(2).lower() in _UNITS:
        nbytes = float(m.group(1)) * _UNITS[m.group(2).lower()]
    else:
        raise ValueError(f"kv_memory must be bytes (an int or e.g. '512MiB') or a fraction of free memory in (0, 1), "
                         f"got {kv_memory!r}")
    dtype = getattr(model, "dtype", torch.float32)
    per_block = kv_bytes_per_token(model, bits=torch.finfo(dtype).bits) * block_size
    blocks = int(nbytes // per_block)
    if blocks < 1:
        raise ValueError(f"kv_memory={kv_memory!r} holds no block of {block_size} tokens ({per_block:.0f} bytes each)")
    return blocks


def _http_protocol():
    """uvicorn's h11 protocol, with its keep-alive timeout armed from the first moment of a connection.

    uvicorn starts that timer only after a response, so a client that connects and never
    sends a request would hold its connection (and a slot) forever; here it is closed after
    `timeout_keep_alive` seconds of silence, like an idle keep-alive connection.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class IdleClosingH11(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    return IdleClosingH11


class Server:
    """`labkit serve`: the engine behind the HTTP API (see the module docstring)."""

    def __init__(self, model, tok, model_name: str, *, host: str = "127.0.0.1", port: int = 0,
                 allow_remote: bool = False, kv_memory=DEFAULT_KV_MEMORY, max_waiting: int = 64,
                 request_timeout: float | None = 600.0, max_tokens_limit: int = 1024, max_body: int = 1 << 20,
                 body_timeout_s: float = 10.0, idle_timeout_s: float = 5.0, **engine_opts):
        if host not in ("127.0.0.1", "localhost") and not allow_remote:
            raise ValueError(f"host must be 127.0.0.1 (this server is for this machine only), got {host!r}; "
                             "pass allow_remote=True (labkit serve --allow-remote) to serve other machines")
        if host not in ("127.0.0.1", "localhost"):
            warnings.warn(f"labkit serve listens on {host}: anyone who can reach this machine can use the model",
                          stacklevel=2)
        for name, value in (("max_tokens_limit", max_tokens_limit), ("max_body", max_body)):
            checks.positive_int(name, value)
        engine_opts.setdefault("policy", "chunked")  # as `labkit serve`: a long prompt never stalls the others
        engine_opts.setdefault("keep_steps", 1024)  # a server runs for weeks: a bounded window of its passes
        if engine_opts.get("num_blocks") is None:
            engine_opts["num_blocks"] = kv_pool_blocks(model, kv_memory, engine_opts.get("block_size", 16))
        self.tok, self.model_name, self.created = tok, model_name, int(time.time())
        self.max_tokens_limit, self.max_body, self.body_timeout_s = max_tokens_limit, max_body, body_timeout_s
        self.idle_timeout_s = idle_timeout_s  # a connection silent this long is closed (before or between requests)
        self.context = model.config.max_seq_len
        engine = Engine(model, **engine_opts)
        self.metrics = ServerMetrics(model_name, None if engine.speculator is None else engine.speculator.name)
        self.engine = EngineThread(engine, max_waiting=max_waiting, request_timeout=request_timeout,
                                   on_finish=self.metrics.finished)
        self.ids = itertools.count()
        self.host, self.port = host, port
        self._sock: socket.socket | None = None
        self._uvicorn = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    @property
    def kv_tokens(self) -> int:
        return self.engine.stats()["kv_tokens"]

    def start(self, timeout: float = 30.0) -> str:
        import uvicorn

        from labkit.serving.http.app import create_app

        self._sock = socket.create_server((self.host, self.port), backlog=1024)
        config = uvicorn.Config(create_app(self), http=_http_protocol(), log_level="warning", access_log=False,
                                lifespan="off", timeout_keep_alive=self.idle_timeout_s,
                                timeout_graceful_shutdown=5)
        self._uvicorn = uvicorn.Server(config)
        self.engine.start()
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [self._sock]},
                                        name="labkit-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        self.engine.stop()
        if self._thread is not None:
            self._thread.join(10)
        if self._sock is not None:
            self._sock.close()
        speculator = self.engine.engine.speculator
        close = getattr(getattr(speculator, "drafter", None), "close", None)
        if close is not None and not self.engine.thread.is_alive():  # a head's hooks come off the model
            close()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def encode(self, job: Job) -> list[int]:
        """The prompt's token ids: chat messages in the chat template (their content as text, never as control
        tokens), a completion prompt as plain text, or token ids as they are."""
        prompt = job.prompt
        if job.kind == "completion":
            if isinstance(prompt, list):
                bad = [t for t in prompt if not 0 <= t < self.tok.vocab_size]
                if bad:
                    raise ApiError(400, f"prompt: token id {bad[0]} is outside the vocabulary [0, {self.tok.vocab_size})",
                                   param="prompt")
                return list(prompt)
            return self.tok.encode_ordinary(prompt)
        if getattr(self.tok, "chat_template", None) is None:  # a base model: the messages as plain text to continue
            return self.tok.encode_ordinary("\n\n".join(m["content"] for m in prompt))
        return self.tok.encode_chat(prompt)

    def requests_for(self, job: Job) -> list[Request]:
        """The job's n requests (choice i sampled with seed + i), each checked against the limits."""
        prompt = self.encode(job)
        room = self.context - len(prompt)
        if room < 1:
            raise ApiError(400, f"the prompt has {len(prompt)} tokens; the context window is {self.context} tokens",
                           param="messages" if job.kind == "chat" else "prompt", code="context_length_exceeded")
        max_tokens = job.max_tokens if job.max_tokens is not None else min(self.max_tokens_limit, room)
        if max_tokens > self.max_tokens_limit:
            raise ApiError(400, f"max_tokens={max_tokens} is above this server's limit of {self.max_tokens_limit} "
                           "(labkit serve --max-tokens-limit)", param="max_tokens")
        eos = getattr(self.tok, "eos_id", None)
        try:  # one constraint per choice (its own state); the automaton is compiled once and cached
            constraints = [make_constraint(self.tok, json_schema=job.json_schema) for _ in range(job.n)]
        except ValueError as exc:
            raise ApiError(400, f"response_format: {exc}", param="response_format") from None
        base = next(self.ids)
        return [Request(f"{base}-{i}" if job.n > 1 else base, prompt, max_tokens, params=job.params,
                        seed=None if job.seed is None else job.seed + i,
                        stop_ids=frozenset() if eos is None else frozenset([eos]), penalize_prompt=False,
                        logprobs=job.logprobs, constraint=constraints[i])
                for i in range(job.n)]
