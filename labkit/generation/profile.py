"""Where a decode step's time goes: the weight products against everything else, from `torch.profiler`.

A bandwidth-bound step should take bytes / bandwidth. It can take longer for two reasons this
profile separates: the weight products may run below the bandwidth (kernel throughput per
weight), and the thousands of small operations around them (norms, RoPE, attention over
the cache, residual adds, sampling) and the Python between them cost time of their own, which
changes far less with the weights' format than the products do.

    >>> p = step_profile(model, ids, steps=8)                                    # doctest: +SKIP
    >>> p["matmul_ms"], p["other_ms"], p["ops_per_step"]                          # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time

import torch

from labkit.generation.stages import decode, prefill

__all__ = ["step_profile", "decode_rates", "pass_costs", "layer_rates", "MATMUL_OPS"]

# the operators that multiply by a weight matrix: float (BLAS), packed int8/int4
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "aten::_weight_int8pack_mm",
              "aten::_weight_int4pack_mm_for_cpu", "aten::bmm", "aten::_int_mm")


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's C++ side prints a start and a stop line straight to file descriptor 2: hide them."""
    try:
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:
        yield
        return
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def step_profile(model, ids: list[int], steps: int = 8, top: int = 6) -> dict:
    """Profile `steps` greedy decode steps after prefilling `ids`.

    Returns step_ms (wall time per step, measured without the profiler), profiled_step_ms (the
    wall time of the profiled steps themselves), matmul_ms and other_ms (the profiler's self time
    per step of the weight products and of every other operator), outside_ms (profiled_step_ms
    minus both: Python, dispatch and the profiler's own bookkeeping between operators, from the
    same run as the operators, so the three parts add up to profiled_step_ms), ops_per_step
    (operator calls per step, nested ones included) and top: the `top` operators by self time.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    state = prefill(model, ids, max_len=len(ids) + 2 * steps + 2)
    decode(model, state, 2)  # warm-up
    start = time.perf_counter()
    decode(model, state, steps)
    wall = (time.perf_counter() - start) / steps
    with _quiet_stderr(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        decode(model, state, steps)
        profiled = (time.perf_counter() - start) / steps
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    ms = {e.key: e.self_cpu_time_total / 1e3 / steps for e in events}
    calls = sum(e.count for e in events) / steps
    matmul = sum(v for k, v in ms.items() if k in MATMUL_OPS)
    ranked = sorted(ms.items(), key=lambda kv: -kv[1])[:top]
    return {"step_ms": 1e3 * wall, "profiled_step_ms": 1e3 * profiled, "matmul_ms": matmul,
            "other_ms": sum(ms.values()) - matmul, "outside_ms": max(0.0, 1e3 * profiled - sum(ms.values())),
            "ops_per_step": calls, "top": [{"op": k, "ms": v} for k, v in ranked]}


def decode_rates(models: dict, ids: list[int], n: int = 16, rounds: int = 3) -> dict[str, float]:
    """Greedy decode tokens/s of each name → model after the same prompt: rounds interleaved, median per model."""
    if not isinstance(n, int) or n < 1 or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"n and rounds must be positive integers, got n={n!r}, rounds={rounds!r}")
    seconds: dict[str, list[float]] = {name: [] for name in models}
    for m in models.values():  # warm-up
        decode(m, prefill(m, ids, max_len=len(ids) + 4), 2)
    for _ in range(rounds):
        for name, m in models.items():
            state = prefill(m, ids, max_len=len(ids) + n + 1)
            start = time.perf_counter()
            decode(m, state, n)
            seconds[name].append(time.perf_counter() - start)
    return {name: n / statistics.median(s) for name, s in seconds.items()}


@torch.inference_mode()
def pass_costs(models: dict, ids: list[int], ks=(1, 2, 3, 4, 6, 8), rounds: int = 5, repeat: int = 3) -> dict[str, dict[int, float]]:
    """Seconds of one forward pass over k new tokens after the prompt `ids`, for each name → model and k.

    What a speculative verification (k = γ + 1 drafted tokens) or a decode batch of k costs
    against one decode step: T(k) / T(1) is 1 where a pass only streams the weights. Every
    pass starts from the same cached prompt (the contiguous cache is truncated back after
    each), rounds interleave the models and the k's so machine noise hits all alike, and the
    median per (model, k) of `repeat`-pass means is returned.
    """
    ks = list(ks)
    if not ks or not all(isinstance(k, int) and k >= 1 for k in ks):
        raise ValueError(f"ks must be positive integers, got {ks!r}")
    if not isinstance(rounds, int) or rounds < 1 or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"rounds and repeat must be positive integers, got rounds={rounds!r}, repeat={repeat!r}")
    states = {name: prefill(m, ids, max_len=len(ids) + max(ks) + 1) for name, m in models.items()}
    seconds = {name: {k: [] for k in ks} for name in models}
    for r in range(rounds + 1):  # round 0 warms up every shape
        for name, m in models.items():
            cache, base = states[name].cache, len(ids)
            for k in ks:
                x = torch.full((1, k), ids[-1], device=m.device)
                start = time.perf_counter()
                for _ in range(repeat):
                    m.step(x, cache=cache)
                    cache.truncate(base)
                if r:
                    seconds[name][k].append((time.perf_counter() - start) / repeat)
    return {name: {k: statistics.median(v) for k, v in per_k.items()} for name, per_k in seconds.items()}


@torch.inference_mode()
def layer_rates(layers: dict, x: torch.Tensor, rounds: int = 5, repeat: int = 20) -> dict[str, float]:
    """Microseconds of one call layer(x) for each name → layer (a module or function): rounds interleaved,
    the median per layer of `repeat`-call means. For comparing one product's kernels side by side."""
    if not isinstance(rounds, int) or rounds < 1 or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"rounds and repeat must be positive integers, got rounds={rounds!r}, repeat={repeat!r}")
    times: dict[str, list[float]] = {name: [] for name in layers}
    for r in range(rounds + 1):  # round 0 warms up
        for name, layer in layers.items():
            start = time.perf_counter()
            for _ in range(repeat):
                layer(x)
            if r:
                times[name].append((time.perf_counter() - start) / repeat)
    return {name: 1e6 * statistics.median(t) for name, t in times.items()}
