"""The serving measurements that chapter 09 and `labkit bench --only serving` share.

- `batch_sweep`: decode tokens/s at batch 1, 2, 4, ... on the engine (the curve that the cost
  model's critical batch explains).
- `prefill_interference`: what a long prompt arriving mid-stream does to the inter-token
  latency of requests that are decoding, with and without chunked prefill.
- `shared_prefix`: requests that share a long system prompt, served with and without automatic
  prefix caching (TTFT, the tokens prefilled, the hit rate, and whether the replies agree).
- `routing`: one trace over two (or more) data-parallel replicas, routed round robin and by least
  outstanding work (`labkit.serving.studies.router`).
- `disaggregation`: DistServe's argument on two workers: the decoding requests' ITL while long prompts
  arrive, co-located (two replicas, continuous or chunked) vs one prefill and one decode engine with the KV
  cache sent between them (`labkit.serving.studies.disagg`), and what the transfer costs.
- `simulate`: replay a trace through the real scheduler with *modelled* step times instead
  of a model (`step_time(rows) -> seconds`, e.g. from `labkit.costmodel` for a GPU), so the
  same policies can be compared on hardware this machine is not.
"""
from __future__ import annotations


import numpy as np

from labkit import checks
from labkit.measure.clock import now as clock_now
from labkit.kvcache.blocks import BlockTables
from labkit.serving.engine.loop import Engine, Replay, Step, run_trace
from labkit.serving.engine.request import Request
from labkit.serving.engine.scheduler import Scheduler

__all__ = ["batch_sweep", "prefill_interference", "shared_prefix", "routing", "disaggregation", "simulate"]


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
            t0 = clock_now()
            step = engine.step()
            times.append(clock_now() - t0)
            assert step is not None and len(step.rows) == b
        med = float(np.median(times))
        rows.append({"batch": b, "step_s": med, "tokens_per_s": b / med, "spread": float(np.std(times) / med)})
    return rows


def prefill_interference(model, *, policy: str = "chunked", long_prompt: int = 1024, n_running: int = 4,
                         chunk: int = 16, reply: int = 48, source: list[int], block_size: int = 16) -> dict:
    """`n_running` requests decode; a `long_prompt`-token request arrives. ITLs of the running ones during its prefill.

    policy "chunked" prefills it `chunk` tokens per step next to the decodes; "continuous" in one step.
    Returns the running requests' ITLs (seconds) while the long prompt was being prefilled and outside
    that window; `undisturbed_s`, the median gap outside it (what a running request gets when no prompt
    is in the way); `p99_over_undisturbed`, the p99 gap during the prefill over that (the measure of a
    stall: a median over *all* gaps would mostly count the stalled window itself); `p99_over_median`
    (the p99 over the median of all gaps) and the long request's TTFT.
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
    while not all(len(r.output) >= 4 for r in running):  # every one prefilled (chunked: over several passes), decoding
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
    p99, undisturbed = float(np.percentile(during, 99)), float(np.median(outside))
    return {"policy": policy, "chunk": chunk if policy == "chunked" else long_prompt, "itl_during_s": during,
            "itl_outside_s": outside, "median_during_s": float(np.median(during)), "p99_during_s": p99,
            "median_s": float(np.median(every)), "p99_over_median": p99 / float(np.median(every)),
            "undisturbed_s": undisturbed, "p99_over_undisturbed": p99 / undisturbed,
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
    from labkit.serving.studies.trace import summarize

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
    from labkit.serving.studies.router import ROUTERS, Router, replay_replicas
    from labkit.serving.studies.trace import fresh, summarize

    n_blocks = max_batch * max(-(-(r.max_len + 1) // block_size) for r in requests)  # room for the longest, max_batch times
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


# ---- disaggregated prefill ----------------------------------------------------------------------


def _disagg_trace(model, n_running: int, long_prompts: int, long_prompt: int, short_prompt: int, reply: int,
                  long_reply: int, source: list[int], block_size: int) -> tuple[list[Request], float]:
    """Short requests at t = 0, long prompts arriving while they decode; and the decode step measured to time them."""
    probe = Engine(model, max_batch=n_running, token_budget=max(block_size, n_running * short_prompt),
                   block_size=block_size, num_blocks=n_running * -(-(short_prompt + 8) // block_size), prefix_cache=False)
    for i in range(n_running):
        probe.add(Request(i, list(source[i * short_prompt:(i + 1) * short_prompt]), 8))
    probe.step()  # the prompts (and a warm-up)
    times = []
    for _ in range(4):
        step = probe.step()
        times.append(step.end - step.start)
    step_s = float(np.median(times[1:]))
    shorts = [Request(i, list(source[i * short_prompt:(i + 1) * short_prompt]), reply) for i in range(n_running)]
    base = n_running * short_prompt
    longs = [Request(n_running + k, list(source[base + k * long_prompt:base + (k + 1) * long_prompt]), long_reply,
                     arrival=step_s * reply * (k + 1) / (long_prompts + 1)) for k in range(long_prompts)]
    return shorts + longs, step_s


def _latencies(replay: Replay, n_running: int, side: dict | None) -> dict:
    """The short requests' ITLs (all, and those overlapping a long prompt's prefill on their side: `side` maps a
    request id to its replica, None for one decode engine) and the long prompts' TTFTs."""
    from labkit.serving.studies.trace import percentile, summarize

    where = (lambda r: side[r.id]) if side else (lambda r: 0)
    windows = [(where(r), r.arrival, r.first_token) for r in replay.requests if r.id >= n_running]
    gaps, during = [], []
    for r in (r for r in replay.requests if r.id < n_running):
        for a, b in zip(r.token_times, r.token_times[1:]):
            gaps.append(b - a)
            if any(s == where(r) and b > start and a < end for s, start, end in windows):
                during.append(b - a)
    ttft = [r.ttft for r in sorted(replay.requests, key=lambda r: r.id) if r.id >= n_running]
    return {"itl_p50_s": percentile(gaps, 50), "itl_p99_s": percentile(gaps, 99),
            "itl_during_p99_s": percentile(during, 99), "gaps_during": len(during), "ttft_long_s": ttft,
            "ttft_long_p50_s": percentile(ttft, 50), "throughput_tok_s": summarize(replay)["throughput_tok_s"]}


def disaggregation(model, *, n_running: int = 4, long_prompts: int = 2, long_prompt: int = 512, short_prompt: int = 32,
                   reply: int = 32, long_reply: int = 4, chunk: int = 32, source: list[int], link_gb_s: float = 12.5,
                   block_size: int = 16) -> dict:
    """DistServe's argument on two workers: `n_running` short requests decode while `long_prompts` long prompts arrive.

    One trace (prompts cut from `source`; the long ones arrive at 1/(long_prompts + 1), 2/..., of the short
    replies' decoding, timed by a decode step measured first), replayed three ways on two workers each, greedy,
    prefix caching off: co-located, two data-parallel replicas (round robin) each running prefill and decode,
    with policy "continuous" and with "chunked" (token budget n_running + `chunk`); and disaggregated, one
    prefill-only engine and one decode-only (`labkit.serving.studies.disagg`). Every pass is measured; the KV link is
    modelled at `link_gb_s` GB/s (default 12.5: 100 Gb/s Ethernet, the slow end; NVLink on an H100 SXM is 450
    each way, 900 both), so price other links with `kv_bytes_per_token` (in the cache's dtype: float32 here, half that in 16 bits).

    Returns, for "continuous", "chunked" and "disaggregated": the short requests' ITL p50 and p99 (every gap),
    `itl_during_p99_s` (their gaps overlapping a long prompt's [arrival, first token] on their replica; on the
    decode engine, every long one), the long prompts' TTFTs, throughput; for "disaggregated" also
    `kv_bytes_per_long`, `transfer_s_per_long` (modelled wire + measured copies) and `wire_s_per_long`. And
    `same_outputs` (every reply identical three ways), `trace` (the sizes), `step_s` (the probe's decode step),
    `link_gb_s` and `kv_bytes_per_token`.
    """
    from labkit.serving.studies.disagg import replay_disaggregated
    from labkit.serving.studies.router import Router, replay_replicas
    from labkit.serving.studies.trace import fresh

    sizes = dict(n_running=(n_running, 1), long_prompts=(long_prompts, 1), long_prompt=(long_prompt, 1),
                 short_prompt=(short_prompt, 1), reply=(reply, 2), long_reply=(long_reply, 2), chunk=(chunk, 1),
                 block_size=(block_size, 1))  # a reply of 2 at least: every request goes on to the decode engine
    for name, (value, least) in sizes.items():
        checks.integer(name, value, least)
    if not (isinstance(link_gb_s, (int, float)) and link_gb_s > 0):
        raise ValueError(f"link_gb_s must be a positive number of GB/s, got {link_gb_s!r}")
    need = n_running * short_prompt + long_prompts * long_prompt
    if len(source) < need:
        raise ValueError(f"source must hold n_running * short_prompt + long_prompts * long_prompt = {need} tokens, "
                         f"got {len(source)}")
    whole = max(long_prompt + long_reply, short_prompt + reply)
    if whole > model.config.max_seq_len:
        raise ValueError(f"long_prompt + long_reply = {whole} exceeds the model's context of {model.config.max_seq_len}")
    trace, step_s = _disagg_trace(model, n_running, long_prompts, long_prompt, short_prompt, reply, long_reply, source,
                                  block_size)
    n_blocks = (n_running + long_prompts) * -(-whole // block_size)

    def engine(policy: str, budget: int) -> Engine:
        return Engine(model, policy=policy, max_batch=n_running + long_prompts, token_budget=budget,
                      block_size=block_size, num_blocks=n_blocks, prefix_cache=False)

    out, outputs = {}, []
    for policy, budget in (("continuous", whole), ("chunked", n_running + chunk)):
        reqs = fresh(trace)
        replay, route = replay_replicas([engine(policy, budget) for _ in range(2)], reqs, Router(2, "round_robin"))
        out[policy] = _latencies(replay, n_running, {r.id: i for r, i in zip(reqs, route)})
        outputs.append({r.id: r.output for r in replay.requests})
    replay, info = replay_disaggregated(engine("continuous", whole), engine("continuous", whole), fresh(trace),
                                        link_bytes_per_s=link_gb_s * 1e9)
    longs = [t for t in info["transfers"] if t["id"] >= n_running]
    out["disaggregated"] = {**_latencies(replay, n_running, None),
                            **{f"{k}_per_long": float(np.mean([t[k] for t in longs])) for k in ("kv_bytes", "transfer_s", "wire_s")},
                            "decode_prefill_rows": info["decode_prefill_rows"]}
    outputs.append({r.id: r.output for r in replay.requests})
    out["same_outputs"] = outputs[0] == outputs[1] == outputs[2]
    out["trace"] = {name: value for name, (value, _) in sizes.items() if name != "block_size"}
    out["step_s"], out["link_gb_s"] = step_s, float(link_gb_s)
    out["kv_bytes_per_token"] = longs[0]["kv_bytes"] / longs[0]["kv_tokens"]
    return out
