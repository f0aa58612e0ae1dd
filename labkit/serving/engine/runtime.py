"""The engine on a thread of its own, as a server runs it: requests in, tokens out, failures contained.

One thread owns the model and the KV cache; everything else talks to it through a queue
of commands (add, abort, ping), so nothing touches the model concurrently. What a serving
engine must survive, and how this one does:

- **a failing pass** (an error inside the model): only the requests of that pass fail,
  with finish_reason "error"; the error is logged with its traceback and the next pass runs;
- **a request whose sampling fails** (its parameters cannot sample these logits): it fails
  alone with finish_reason "rejected" (`Engine.step`; the server answers 400);
- **a command that fails** (adding a request the engine refuses, an abort that raises) or **a listener
  that fails**: that request ends with finish_reason "error" and its client hears it; nothing else
  in flight is touched, and its slot is given back;
- **a client that leaves**: `abort(req)` takes the request out of the scheduler and frees
  its KV blocks before the next pass;
- **a request that runs too long**: past `request_timeout` seconds it ends with
  finish_reason "timeout" (the seed's "timeout control for decode");
- **too many requests**: past `max_waiting` requests not yet running, `submit` refuses
  with `Overloaded` (the server answers 429 with Retry-After) instead of queueing forever.

`ping()` is a liveness check the engine loop itself answers: a server's /health is only
"ok" when the loop is turning, not merely when the HTTP side is up.
"""
from __future__ import annotations

import logging
import queue
import threading

from labkit import checks
from labkit.measure.clock import now as clock_now
from labkit.serving.engine.loop import Engine, PassFailed
from labkit.serving.engine.request import Request

__all__ = ["EngineThread", "Overloaded"]

log = logging.getLogger("labkit.serving")


class Overloaded(Exception):
    """The waiting queue is full: come back in `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class EngineThread:
    """`submit(req, sink)`: `sink(req, token)` for each token, then `sink(req, None)` when it ends (any reason)."""

    def __init__(self, engine: Engine, *, max_waiting: int = 64, request_timeout: float | None = 600.0,
                 on_finish=None):
        checks.positive_int("max_waiting", max_waiting)
        if request_timeout is not None and not (isinstance(request_timeout, (int, float)) and request_timeout > 0):
            raise ValueError(f"request_timeout must be a positive number of seconds or None, got {request_timeout!r}")
        self.engine, self.max_waiting, self.request_timeout = engine, max_waiting, request_timeout
        self.on_finish = on_finish  # called in the engine thread with each request that ends (metrics)
        self.inbox: queue.Queue = queue.Queue()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.t0 = clock_now()
        self.live: dict = {}          # request id -> request, submitted and not ended
        self.lock = threading.Lock()
        self.failed_passes = 0
        self.thread = threading.Thread(target=self._loop, name="labkit-engine", daemon=True)

    def clock(self) -> float:
        return clock_now() - self.t0

    # ---- called from other threads --------------------------------------------------------

    def submit(self, req: Request, sink) -> None:
        """Queue `req` (arrival = now). ValueError if it can never run here; `Overloaded` if the queue is full."""
        self.engine.scheduler.check(req)  # in the caller's thread: a ValueError becomes the caller's 400
        if not self.thread.is_alive():
            raise RuntimeError("the engine is not running")
        with self.lock:
            waiting = len(self.live) - len(self.engine.scheduler.running)
            if waiting >= self.max_waiting:
                raise Overloaded(f"{waiting} requests are already waiting (--max-waiting {self.max_waiting}); "
                                 "retry later", retry_after=max(1, round(waiting / max(1, self.engine.scheduler.max_batch))))
            self.live[req.id] = req
        req.arrival = self.clock()
        self.inbox.put(("add", req, sink))
        self.wake.set()

    def abort(self, req: Request, reason: str = "abort") -> None:
        """End `req` as soon as the engine loop comes round (before its next pass)."""
        self.inbox.put(("abort", req, reason))
        self.wake.set()

    def ping(self, timeout: float = 5.0) -> bool:
        """True when the engine loop answers within `timeout` seconds."""
        if not self.thread.is_alive():
            return False
        done = threading.Event()
        self.inbox.put(("ping", done, None))
        self.wake.set()
        return done.wait(timeout)

    def stats(self) -> dict:
        s, tables = self.engine.scheduler, self.engine.scheduler.blocks
        return {"running": len(s.running), "waiting": max(0, len(self.live) - len(s.running)),
                "kv_blocks": tables.num_blocks, "kv_blocks_used": tables.num_blocks - tables.n_free,
                "kv_tokens": tables.num_blocks * tables.block_size, "failed_passes": self.failed_passes}

    # ---- the engine's own thread ------------------------------------------------------------

    def _listener(self, sink):
        def hear(req, token):
            if token is None:
                with self.lock:
                    self.live.pop(req.id, None)
                if self.on_finish is not None:
                    try:
                        self.on_finish(req)
                    except Exception:  # metrics must not end a request twice
                        log.exception("labkit serve: on_finish failed for request %r", req.id)
            sink(req, token)
        return hear

    def _commands(self) -> None:
        while True:
            try:
                cmd, a, b = self.inbox.get_nowait()
            except queue.Empty:
                return
            try:
                if cmd == "add":
                    self.engine.add(a, self._listener(b))
                elif cmd == "abort":
                    self.engine.abort(a, b, now=self.clock())
                elif cmd == "ping":
                    a.set()
            except Exception as exc:  # this command's request fails alone; the loop and the others go on
                log.exception("labkit serve: command %r for request %r failed; failing that request", cmd,
                              getattr(a, "id", None))
                if cmd in ("add", "abort"):
                    self._fail_one(a, b if cmd == "add" else None, f"the engine refused it: {type(exc).__name__}: {exc}")

    def _fail_one(self, req, sink, message: str) -> None:
        """End `req` with finish_reason "error" wherever it is: out of the scheduler if it got in, its slot given
        back, and its client told (through its listener, or `sink` when it never got one)."""
        s, now = self.engine.scheduler, self.clock()
        if req in s.running or req in s.waiting:  # (by identity) it got in: free its blocks, tell its listener
            self.engine.abort(req, "error", message, now)
        else:  # never got in: another request may hold its id, so nothing keyed by the id is touched
            req.fail("error", message, now)
            if sink is not None:
                try:
                    self._listener(sink)(req, None)
                except Exception:
                    log.exception("labkit serve: the sink of request %r failed", req.id)
        with self.lock:
            if self.live.get(req.id) is req:
                del self.live[req.id]

    def _expire(self) -> None:
        if self.request_timeout is None:
            return
        now = self.clock()
        with self.lock:
            late = [r for r in self.live.values() if now - r.arrival > self.request_timeout]
        for req in late:
            self.engine.abort(req, "timeout", f"the request ran past its deadline of {self.request_timeout:g} s", now)

    def _fail(self, requests, message: str) -> None:
        for req in requests:
            self.engine.abort(req, "error", message, self.clock())

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self._commands()
                self._expire()
                step = self.engine.step(self.clock(), draining=self.inbox.empty(), clock=self.clock)
            except PassFailed as exc:
                self.failed_passes += 1
                log.error("labkit serve: %s; failing those requests and serving on", exc, exc_info=exc.__cause__)
                self._fail(exc.requests, f"the engine failed on this request's pass: {exc.__cause__}")
                continue
            except Exception as exc:  # a bug outside the model: fail what is in flight, keep the loop alive
                self.failed_passes += 1
                log.exception("labkit serve: engine step failed; failing every request in flight")
                s = self.engine.scheduler
                self._fail(list(s.running) + list(s.waiting), f"the engine failed: {type(exc).__name__}: {exc}")
                continue
            if step is None:
                self.wake.wait(0.02)
                self.wake.clear()
        self._commands()
        s = self.engine.scheduler
        for req in list(s.running) + list(s.waiting):  # the server is stopping: end every open request
            self.engine.abort(req, "abort", "the server is shutting down", self.clock())

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.wake.set()
        if self.thread.ident is not None:  # started (a server that failed to start is stopped too)
            self.thread.join(timeout)
