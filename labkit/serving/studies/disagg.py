"""Disaggregated prefill: one engine runs the prompts, another the decoding, the KV cache sent between them.

A prompt's prefill is one long, compute-bound pass; a decode step is short and bound by reading
the weights and the cache. On one engine they share every pass, so a long prompt arriving stalls
the replies already decoding (their inter-token latency, ITL) for as long as its prefill takes,
and chunking the prompt (Sarathi-Serve) only spreads that stall over many steps. DistServe (Zhong
et al. 2024) and Splitwise (Patel et al. 2024) put the two phases on different machines: a
*prefill instance* computes the prompt and its first token, ships the request's keys and values
to a *decode instance*, which then only ever runs decode steps. The decoders' ITL no longer sees
the prompts; the price is the transfer (2 · n_layers · n_kv_heads · head_dim · bytes per prompt
token, once per request) and that each instance serves one phase only.

`replay_disaggregated(prefill, decode, requests, link_bytes_per_s=...)` runs a trace that way,
on this machine, in one process. Like `labkit.serving.studies.router.replay_replicas`, each engine keeps
its own *measured virtual clock* (they run one after another here, as if each had its own
machine):

* **measured**: every pass of either engine (its real wall time), the copies out of the prefill
  engine's cache (`Engine.hand_off`) and into the decode engine's (`Engine.add_prefilled`);
* **modelled**: the wire, kv_bytes / `link_bytes_per_s`: the two engines share this machine's
  memory, so nothing crosses a network. A request becomes available to the decode engine at
  its first token's time + export copy + wire, and the import's copy time is then spent on the
  decode engine's clock. The prefill engine goes on with the next prompt while a request's KV
  is in flight (the transfer overlaps its work, as in both papers).

The request object travels whole: the prefill engine gives it its first token (and advances its
sampler), the decode engine the rest, so its token times, output and finish reason are those of
an ordinary replay and `labkit.serving.summarize` reads the result. A request that ends with its
first token (max_new_tokens 1, a stop token) ends on the prefill engine; nothing is sent.

    prefill = Engine(model, policy="continuous", token_budget=1024)
    decode = Engine(model, policy="continuous", max_batch=16)
    replay, info = replay_disaggregated(prefill, decode, requests, link_bytes_per_s=25e9)
    info["transfers"][0]          # id, kv_tokens, kv_bytes, wire_s, copy_s, transfer_s, ready
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from labkit import checks
from labkit.measure.clock import now as clock_now
from labkit.serving.engine.loop import Engine, Replay
from labkit.serving.engine.request import Request

__all__ = ["replay_disaggregated", "Transfer"]


@dataclass
class Transfer:
    """One request's keys and values on their way from the prefill engine to the decode engine."""

    req: Request
    keys: object        # [n_layers, n_tokens, n_kv_heads, head_dim]; None once the decode engine holds them
    values: object
    n_tokens: int
    kv_bytes: int
    export_s: float     # measured: the copy out of the prefill engine's blocks
    wire_s: float       # modelled: kv_bytes / link bandwidth
    ready: float        # when the decode engine may take it: first token + export + wire
    import_s: float = 0.0  # measured: the copy into the decode engine's blocks

    def record(self) -> dict:
        copy = self.export_s + self.import_s
        return {"id": self.req.id, "kv_tokens": self.n_tokens, "kv_bytes": self.kv_bytes,
                "wire_s": self.wire_s, "copy_s": copy, "transfer_s": self.wire_s + copy, "ready": self.ready}


def _check(prefill: Engine, decode: Engine, requests: list[Request], link_bytes_per_s) -> None:
    if not isinstance(prefill, Engine) or not isinstance(decode, Engine):
        raise ValueError(f"prefill and decode must be Engines, got {type(prefill).__name__} and {type(decode).__name__}")
    if prefill is decode:
        raise ValueError("prefill and decode must be two different engines (two instances), got the same one twice")
    checks.positive("link_bytes_per_s", link_bytes_per_s, why="bytes per second")
    if not requests:
        raise ValueError("requests must hold at least one Request, got none")
    if len({r.id for r in requests}) != len(requests):
        raise ValueError("requests must have distinct ids (a request's id keys its blocks on both engines)")
    if prefill.model.config != decode.model.config:
        raise ValueError("prefill and decode must serve the same model (their configs differ)")
    for name, engine in (("prefill", prefill), ("decode", decode)):
        if engine.scheduler.has_work:
            raise ValueError(f"the {name} engine must start idle, it holds requests already")


def _hand_off(prefill: Engine, link_bytes_per_s: float, inbox: list[Transfer]) -> None:
    """Every request that got its first token on the prefill engine (and goes on) leaves it for the inbox."""
    for req in [r for r in prefill.scheduler.running if r.output]:
        t0 = clock_now()
        keys, values = prefill.hand_off(req)
        export_s = clock_now() - t0
        kv_bytes = keys.numel() * keys.element_size() + values.numel() * values.element_size()
        wire_s = kv_bytes / link_bytes_per_s
        move = Transfer(req, keys, values, keys.shape[1], kv_bytes, export_s, wire_s,
                        req.first_token + export_s + wire_s)
        bisect.insort(inbox, move, key=lambda m: m.ready)


def _admit(decode: Engine, inbox: list[Transfer], clock: float, done: list[Transfer]) -> float:
    """Import what has arrived by `clock` while the decode engine has room (oldest first); the copies take time."""
    while inbox and inbox[0].ready <= clock:
        move = inbox[0]
        t0 = clock_now()
        if not decode.add_prefilled(move.req, move.keys, move.values):
            break  # no slot or blocks: it waits for a step to finish someone
        move.import_s = clock_now() - t0
        clock += move.import_s
        inbox.pop(0)
        move.keys = move.values = None  # the decode engine holds them now
        done.append(move)
    return clock


class _Counter:
    def __init__(self, max_steps: int):
        self.n, self.max_steps = 0, max_steps

    def tick(self) -> None:
        self.n += 1
        if self.n > self.max_steps:
            raise RuntimeError(f"replay did not finish within {self.max_steps} steps")


def _decode_until(decode: Engine, inbox: list[Transfer], clock: float, limit: float, done: list[Transfer],
                  passes: _Counter) -> float:
    """Run the decode engine while its clock is before `limit` (no request can become ready before `limit`
    that is not in the inbox already); when idle its clock jumps to the next request's arrival."""
    while True:
        clock = _admit(decode, inbox, clock, done)
        if decode.scheduler.has_work and clock < limit:
            step = decode.step(clock, draining=limit == float("inf") and not inbox)
            if step is None:
                raise RuntimeError(f"the decode engine ({decode.policy}) could not run its requests")
            clock = step.end
            passes.tick()
        elif not decode.scheduler.has_work and inbox and inbox[0].ready < limit:
            if inbox[0].ready <= clock:
                raise RuntimeError(f"the idle decode engine cannot take request {inbox[0].req.id!r}")
            clock = inbox[0].ready  # idle: jump to the next import
        else:
            return clock


def replay_disaggregated(prefill: Engine, decode: Engine, requests: list[Request], *,
                         link_bytes_per_s: float = 12.5e9, max_steps: int = 100_000) -> tuple[Replay, dict]:
    """Serve `requests` with prompts on `prefill` and decoding on `decode`, KV sent between (module docstring).

    `link_bytes_per_s`: the modelled link (default 12.5e9 B/s, 100 Gb/s Ethernet; NVLink on an H100 SXM is
    450e9 each way, its 900e9 counts both directions; InfiniBand NDR 50e9). Returns one `Replay` of every request and both engines' steps, and info:
    `transfers` (one dict per request sent: id, kv_tokens, kv_bytes, wire_s (modelled), copy_s
    (measured), transfer_s, ready), `kv_bytes` and `transfer_s` in all, `link_bytes_per_s`, and
    `decode_prefill_rows` (rows of more than one token the decode engine ran: 0 unless it had to
    preempt and recompute).
    """
    _check(prefill, decode, requests, link_bytes_per_s)
    pending = sorted(requests, key=lambda r: r.arrival)
    firsts = (len(prefill.steps), len(decode.steps))
    inbox: list[Transfer] = []
    done: list[Transfer] = []
    passes = _Counter(max_steps)
    t_pre = t_dec = pending[0].arrival
    i = 0
    while i < len(pending) or prefill.scheduler.has_work:
        while i < len(pending) and pending[i].arrival <= t_pre:
            prefill.add(pending[i])
            i += 1
        t_dec = _decode_until(decode, inbox, t_dec, t_pre, done, passes)  # later requests are ready after t_pre
        step = prefill.step(t_pre, draining=i == len(pending))
        if step is not None:
            t_pre = step.end
            passes.tick()
            _hand_off(prefill, link_bytes_per_s, inbox)
        elif i < len(pending):
            t_pre = max(t_pre, pending[i].arrival)  # idle: jump to the next arrival
        else:
            t_pre += prefill.scheduler.max_wait_s  # static batching waiting for a batch
    _decode_until(decode, inbox, t_dec, float("inf"), done, passes)
    steps = prefill.steps[firsts[0]:] + decode.steps[firsts[1]:]
    records = [m.record() for m in done]
    info = {"transfers": records, "kv_bytes": sum(r["kv_bytes"] for r in records),
            "transfer_s": sum(r["transfer_s"] for r in records), "link_bytes_per_s": float(link_bytes_per_s),
            "decode_prefill_rows": sum(1 for s in decode.steps[firsts[1]:] for _, n in s.rows if n > 1)}
    replay = Replay("disaggregated", list(requests), steps,
                    prefill.scheduler.preemptions + decode.scheduler.preemptions)
    return replay, info
