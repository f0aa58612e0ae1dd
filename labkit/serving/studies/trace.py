"""A seeded workload and the numbers a serving system is judged by.

`poisson_trace` draws requests the way load generators do (vLLM's `benchmark_serving`,
Splitwise, DistServe): arrivals a Poisson process of `rate` requests per second (gaps
exponential with mean 1/rate), prompt and reply lengths drawn uniformly from stated
ranges, prompt tokens cut from a source text. Same seed, same trace.

`summarize` reports, from the times every request recorded:
- **throughput**: output tokens per second, from the first arrival to the last finish;
- **TTFT** (first token − arrival) and **ITL** (gaps between the passes that gave a request tokens: with
  speculation a pass may give several at once, which a streaming client receives as one chunk), p50 and p99;
  **TPOT** (time per output token after the first: (last − first token) / (tokens − 1) per request, as
  vLLM's benchmark reports it), mean and p99 over requests;
- **goodput** (Zhong et al. 2024, "DistServe"): requests per second that met the SLO,
  TTFT ≤ `ttft_slo_s` and mean ITL ≤ `itl_slo_s`;
- **KV utilisation**: tokens held / slots in allocated blocks (paged), step by step, next
  to the same tokens over what a server that preallocates would reserve (Kwon et al. 2023
  measure waste this way): prompt + `max_tokens` per running request (`kv_util_prealloc`:
  a real server knows only the cap the client asked for), and prompt + the exact reply
  (`kv_util_oracle`: a server that knew every reply's length in advance, which none does).
"""
from __future__ import annotations

import numpy as np

from labkit import checks
from labkit.serving.engine.request import Request

__all__ = ["poisson_trace", "summarize", "percentile", "fresh"]


def _check_range(name: str, value) -> tuple[int, int]:
    lo, hi = value if isinstance(value, (tuple, list)) else (value, value)
    if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
        raise ValueError(f"{name} must be a positive integer or a range (lo, hi) with 1 <= lo <= hi, got {value!r}")
    return lo, hi


def poisson_trace(n: int, rate: float, *, prompt_len=(16, 128), reply_len=(8, 64), source: list[int],
                  reply_mean: float | None = None, seed: int = 0, **request_opts) -> list[Request]:
    """`n` requests arriving at `rate` per second (Poisson), prompt lengths uniform in `prompt_len`.

    Reply lengths are uniform in `reply_len`, or, with `reply_mean`, geometric with that mean (a reply
    that ends with the same probability 1/reply_mean after every token, as if the model emitted EOS at
    random) clipped to `reply_len`: most replies short, a few long, which is what makes static batches wait.
    `source`: token ids the prompts are cut from (request i starts at a seeded offset).
    `rate=float('inf')` puts every arrival at t = 0 (a burst: an offline batch job).
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if not (isinstance(rate, (int, float)) and rate > 0):
        raise ValueError(f"rate must be a positive number of requests per second, got {rate!r}")
    p_lo, p_hi = _check_range("prompt_len", prompt_len)
    r_lo, r_hi = _check_range("reply_len", reply_len)
    if len(source) <= p_hi:
        raise ValueError(f"source must hold more than prompt_len's maximum of {p_hi} tokens, got {len(source)}")
    rng = np.random.default_rng(seed)
    gaps = np.zeros(n) if rate == float("inf") else rng.exponential(1.0 / rate, n)
    arrivals = np.cumsum(gaps) - gaps[0]  # the first request arrives at t = 0
    prompts = rng.integers(p_lo, p_hi + 1, n)
    if reply_mean is None:
        replies = rng.integers(r_lo, r_hi + 1, n)
    elif isinstance(reply_mean, (int, float)) and reply_mean >= 1:
        replies = np.clip(rng.geometric(1.0 / reply_mean, n), r_lo, r_hi)
    else:
        raise ValueError(f"reply_mean must be None (uniform lengths) or a number >= 1, got {reply_mean!r}")
    starts = rng.integers(0, len(source) - p_hi, n)
    return [Request(i, list(source[s:s + p]), int(r), arrival=float(a), **request_opts)
            for i, (a, p, r, s) in enumerate(zip(arrivals, prompts, replies, starts))]


def fresh(requests: list[Request]) -> list[Request]:
    """Unserved copies of `requests` (same ids, prompts, lengths, arrivals, sampling): replay one trace twice."""
    return [Request(r.id, list(r.prompt), r.max_new_tokens, arrival=r.arrival, params=r.params, seed=r.seed,
                    stop_ids=r.stop_ids) for r in requests]


def percentile(values, q: float) -> float:
    """The q-th percentile (linear interpolation, numpy's default); nan for no values."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


def summarize(replay, ttft_slo_s: float = 1.0, itl_slo_s: float = 0.1, max_tokens: int | None = None) -> dict:
    """The headline numbers of a `labkit.serving.Replay` (see the module docstring).

    `max_tokens`: the reply cap every client asked for, which a preallocating server reserves
    (default: the trace's longest reply, the smallest cap that lets every reply finish).
    """
    for name, slo in (("ttft_slo_s", ttft_slo_s), ("itl_slo_s", itl_slo_s)):
        if not (isinstance(slo, (int, float)) and slo > 0):
            raise ValueError(f"{name} must be a positive number of seconds, got {slo!r}")
    reqs = replay.requests
    if max_tokens is None:
        max_tokens = max((r.max_new_tokens for r in reqs), default=1)
    checks.positive_int("max_tokens", max_tokens, why="the reply cap clients asked for")
    unfinished = [r.id for r in reqs if r.finish is None]
    if unfinished:
        raise ValueError(f"requests {unfinished[:5]} did not finish: replay the trace to its end first")
    start, end = min(r.arrival for r in reqs), max(r.finish for r in reqs)
    out_tokens = sum(len(r.output) for r in reqs)
    ttft = [r.ttft for r in reqs]
    itl = [g for r in reqs for g in r.itls if g > 0]  # tokens of one pass arrive together: one chunk
    tpot = [(r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1) for r in reqs if len(r.token_times) > 1]
    good = [r for r in reqs if r.ttft <= ttft_slo_s and (not r.itls or np.mean(r.itls) <= itl_slo_s)]
    steps = replay.steps
    held = np.array([s.kv_tokens for s in steps], dtype=float)
    slots = np.array([s.kv_slots for s in steps], dtype=float)
    oracle = np.array([s.kv_reserved for s in steps], dtype=float)
    reserved = np.array([s.prompt_tokens + s.n_running * (max_tokens - 1) for s in steps], dtype=float)
    busy = slots > 0
    return {
        "policy": replay.policy,
        "requests": len(reqs),
        "output_tokens": out_tokens,
        "duration_s": end - start,
        "throughput_tok_s": out_tokens / (end - start),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "itl_p50_s": percentile(itl, 50), "itl_p99_s": percentile(itl, 99),
        "tpot_mean_s": float(np.mean(tpot)) if tpot else float("nan"), "tpot_p99_s": percentile(tpot, 99),
        "goodput_req_s": len(good) / (end - start),
        "slo_met": len(good) / len(reqs),
        "kv_util_paged": float((held[busy] / slots[busy]).mean()) if busy.any() else float("nan"),
        "kv_util_prealloc": float((held[busy] / np.maximum(reserved[busy], 1)).mean()) if busy.any() else float("nan"),
        "kv_util_oracle": float((held[busy] / np.maximum(oracle[busy], 1)).mean()) if busy.any() else float("nan"),
        "max_tokens": max_tokens,
        "steps": len(steps),
        "mean_batch": float(np.mean([len(s.rows) for s in steps])) if steps else 0.0,
        "preemptions": replay.preemptions,
        "prefix_hit_rate": sum(min(r.cached_tokens, len(r.prompt)) for r in reqs) / max(1, sum(len(r.prompt) for r in reqs)),
    }
