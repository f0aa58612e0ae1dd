"""The serving measurements that chapter 09 and `labkit bench --only serving` share.

- `batch_sweep`: decode tokens/s at batch 1, 2, 4, ... on the engine (the curve that the cost
  model's critical batch explains).
- `prefill_interference`: what a long prompt arriving mid-stream does to the inter-token
  latency of requests that are decoding, with and without chunked prefill.
- `shared_prefix`: requests that share a long system prompt, served with and without automatic
  prefix caching (TTFT, the tokens prefilled, the hit rate, and whether the replies agree).
- `routing`: one trace over two (or more) data-parallel replicas, routed round robin and by least
  outstanding work (`labkit.serving.router`).
- `simulate`: replay a trace through the real scheduler with *modelled* step times instead
  of a model (`step_time(rows) -> seconds`, e.g. from `labkit.costmodel` for a GPU), so the
  same policies can be compared on hardware this machine is not.
"""
from __future__ import annotations

import time

import numpy as np

from labkit.kvcache.blocks import BlockTables
from labkit.serving.engine import Engine, Replay, Step, run_trace
from labkit.serving.request import Request
from labkit.serving.scheduler import Scheduler

__all__ = ["batch_sweep", "prefill_interference", "shared_prefix", "routing", "simulate"]


def batch_sweep(model, batches=(1, 2, 4, 8, 16, 32), *, prompt_len: int = 64, steps: int = 12, source: list[int],
                block_size: int = 16) -> list[dict]:
    """Median decode step at each batch size (all rows at context ≈ prompt_len): rows of batch, step_s, tokens_per_s."""
    if not batches or any(not isinstance(b, int) or b < 1 for b in batches):
        raise ValueError(f"batches must be a non-empty list of positive integers, got {batches!r}")
    if len(source) < prompt_len + max(batches):
        raise ValueError(f"source must hold at least prompt_len + max(batches) = {prompt_len + max(batches)} tokens")
    rows = []
    for b in batches:
        per_seq = -(-(prompt_len + steps + 3) // block_size)
        engine = Engine(model, policy="continuous", max_batch=b, token_budget=max(b * (prompt_len + steps + 2), block_size),
                        block_size=block_size, num_blocks=b * per_seq)
        for i in range(b):
            engine.add(Request(i, list(source[i:i + prompt_len]), steps + 2))
        engine.step()  # the prompts
        engine.step()  # one warm-up decode step
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step = engine.step()
            times.append(time.perf_counter() - t0)
            assert step is not None and len(step.rows) == b
        med = float(np.median(times))
        rows.append({"batch": b, "step_s": med, "tokens_per_s": b / med, "spread": float(np.std(times) / med)})
    return rows


def prefill_interference(model, *, policy: str = "chunked", long_prompt: int = 1024, n_running: int = 4,
                         chunk: int = 16, reply: int = 48, source: list[int], block_size: int = 16) -> dict:
    """`n_running` requests decode; a `long_prompt`-token request arrives. ITLs of the running ones during its prefill.

    policy "chunked" prefills it `chunk` tokens per step next to the decodes; "continuous" in one step.
    Returns the running requests' ITLs (seconds) while the long prompt was being prefilled and outside
    that window, the p99 of the first over the median of all their ITLs (`p99_over_median`: the issue's
    measure of a stall), and the long request's TTFT.
    """
    if policy not in ("chunked", "continuous"):
        raise ValueError(f"policy must be 'chunked' or 'continuous', got {policy!r}")
    if len(source) < long_prompt + 64:
        raise ValueError(f"source must hold at least long_prompt + 64 = {long_prompt + 64} tokens, got {len(source)}")
    budget = n_running + chunk if policy == "chunked" else long_prompt + reply
    per_seq = -(-(long_prompt + reply) // block_size)
    engine = Engine(model, policy=policy, max_batch=n_running + 1, token_budget=budget, block_size=block_size,
                    num_blocks=(n_running + 1) * per_seq)
    running = [Request(i, list(source[i * 8:i * 8 + 32]), reply) for i in range(n_running)]
    for r in running:
        engine.add(r)
    now = 0.0
    for _ in range(6):  # let them prefill and decode a few tokens
        now = engine.step(now).end
    big = Request("long", list(source[64:64 + long_prompt]), 4, arrival=now)
    engine.add(big)
    while big.first_token is None:
        now = engine.step(now).end
    while engine.scheduler.has_work:
        step = engine.step(now)
        now = step.end
    window = [(a, b) for r in running for a, b in zip(r.token_times, r.token_times[1:]) if b > big.arrival and a < big.first_token]
    during = [b - a for a, b in window]
    outside = [g for r in running for (a, b), g in zip(zip(r.token_times, r.token_times[1:]), r.itls)
               if not (b > big.arrival and a < big.first_token)]
    every = [g for r in running for g in r.itls]
    p99 = float(np.percentile(during, 99))
    return {"policy": policy, "chunk": chunk if policy == "chunked" else long_prompt, "itl_during_s": during,
            "itl_outside_s": outside, "median_during_s": float(np.median(during)), "p99_during_s": p99,
            "median_s": float(np.median(every)), "p99_over_median": p99 / float(np.median(every)),
            "ttft_long_s": big.ttft, "running": running, "long": big}


def shared_prefix(model, system: list[int], questions: list[list[int]], *, max_new_tokens: int = 8,
                  gap_s: float = 60.0, policy: str = "chunked", token_budget: int = 256, block_size: int = 16) -> dict:
    """Serve `system` + each question (one request every `gap_s` seconds, greedy) with prefix caching on and off.

    Returns, for "on" and "off": the summary (`summarize`), the TTFT of every request and the prompt tokens
    the engine actually ran; and `same_replies`. The first request computes the system prompt in both
    runs; with the cache every later one finds its full blocks and prefills only what follows. `gap_s` is
    long enough that no request waits for another (the replay skips idle time, so it costs nothing): the
    TTFTs compare prefills, not queues.
    """
    from labkit.serving.trace import summarize

    if not system or not questions or not all(questions):
        raise ValueError("system and every question must hold at least one token id")
    n_blocks = len(questions) * -(-(len(system) + max(map(len, questions)) + max_new_tokens) // block_size) + 8
    out = {}
    for label, on in (("on", True), ("off", False)):
        reqs = [Request(i, list(system) + list(q), max_new_tokens, arrival=i * gap_s) for i, q in enumerate(questions)]
        engine = Engine(model, policy=policy, max_batch=4, token_budget=token_budget, block_size=block_size,
                        num_blocks=n_blocks, prefix_cache=on)
        replay = engine.replay(reqs)
        out[label] = {"summary": summarize(replay, ttft_slo_s=10.0, itl_slo_s=1.0), "ttft_s": [r.ttft for r in reqs],
                      "prefilled_tokens": sum(n for s in replay.steps for r, n in s.rows) - sum(len(r.output) - 1 for r in reqs),
                      "outputs": [r.output for r in reqs]}
    out["same_replies"] = out["on"].pop("outputs") == out["off"].pop("outputs")
    return out


def routing(model, requests: list[Request], n_replicas: int = 2, *, policy: str = "chunked", max_batch: int = 8,
            token_budget: int = 64, block_size: int = 16, expected_reply: int | None = None) -> dict:
    """Replay `requests` on `n_replicas` engines of `model`, once per router; router -> summary, route, replay.

    Each replica keeps its own measured clock (they run one after another on this machine, as if each
    had its own), so the TTFTs are those of replicas working side by side.
    """
    from labkit.serving.router import ROUTERS, Router, replay_replicas
    from labkit.serving.trace import fresh, summarize

    n_blocks = max_batch * -(-model.config.max_seq_len // block_size)
    out = {}
    for name in ROUTERS:
        engines = [Engine(model, policy=policy, max_batch=max_batch, token_budget=token_budget, block_size=block_size,
                          num_blocks=n_blocks) for _ in range(n_replicas)]
        replay, route = replay_replicas(engines, fresh(requests), Router(n_replicas, name, expected_reply))
        out[name] = {"summary": summarize(replay, ttft_slo_s=2.0, itl_slo_s=0.1), "route": route, "replay": replay}
    return out


def simulate(requests: list[Request], step_time, *, policy: str = "continuous", max_batch: int = 8,
             token_budget: int = 256, block_size: int = 16, num_blocks: int = 4096, context: int | None = None,
             max_wait_s: float = 1.0, on_step=None, prefix_cache: bool = False) -> Replay:
    """Replay `requests` through the scheduler with modelled step times: no model runs, every token is 0.

    `step_time(rows)` gets the pass's rows [(request, n_tokens)] and returns its seconds (e.g. the cost
    model's prefill/decode time for that many tokens at those contexts). `on_step(scheduler)` is called
    after every pass (the tests check the block invariants there). `prefix_cache`: as the engine's, the
    blocks each pass fills are registered and later requests start on the ones their tokens match.
    """
    sched = Scheduler(BlockTables(num_blocks, block_size), policy=policy, max_batch=max_batch,
                      token_budget=token_budget, context=context, max_wait_s=max_wait_s, prefix_cache=prefix_cache)
    steps: list[Step] = []

    def step(now, draining):
        rows = sched.schedule(now, draining)
        if not rows:
            return None
        end = now + float(step_time(rows))
        for req, n in rows:
            sched.blocks.commit(req.id, n)
            if prefix_cache:
                sched.blocks.register_full(req.id, req.tokens)
        for req, n in rows:
            if req.advance(n, len(steps)):
                sched.emit(req, 0, end)
        steps.append(Step.after(len(steps), now, end, rows, sched))
        if on_step is not None:
            on_step(sched)
        return end

    run_trace(requests, sched.add, step, sched)
    return Replay(policy, list(requests), steps, sched.preemptions)
