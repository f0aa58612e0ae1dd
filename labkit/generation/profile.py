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

import torch

from labkit import measure

from labkit.generation.stages import decode, prefill

__all__ = ["step_profile", "decode_rates", "decode_timings", "pass_costs", "pass_timings", "samples_by_name", "layer_rates", "MATMUL_OPS"]

# the operators that multiply by a weight matrix: float (BLAS), packed int8/int4
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "aten::_weight_int8pack_mm",
              "aten::_weight_int4pack_mm_for_cpu", "aten::bmm", "aten::_int_mm",
              "labkit::q4q8_mm", "labkit::q8q8_mm")  # labkit's own block kernels (`labkit.quant.q4q8`)


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
    with measure.timer() as t:
        decode(model, state, steps)
    wall = t.seconds / steps
    with _quiet_stderr(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with measure.timer() as t:
            decode(model, state, steps)
        profiled = t.seconds / steps
    events = [e for e in prof.key_averages() if e.key.startswith(("aten::", "labkit::"))]
    ms = {e.key: e.self_cpu_time_total / 1e3 / steps for e in events}
    calls = sum(e.count for e in events) / steps
    matmul = sum(v for k, v in ms.items() if k in MATMUL_OPS)
    ranked = sorted(ms.items(), key=lambda kv: -kv[1])[:top]
    return {"step_ms": 1e3 * wall, "profiled_step_ms": 1e3 * profiled, "matmul_ms": matmul,
            "other_ms": sum(ms.values()) - matmul, "outside_ms": max(0.0, 1e3 * profiled - sum(ms.values())),
            "ops_per_step": calls, "top": [{"op": k, "ms": v} for k, v in ranked]}


def decode_rates(models: dict, ids: list[int], n: int = 16, rounds: int = 3) -> dict[str, float]:
    """Greedy decode tokens/s of each name → model after the same prompt: rounds interleaved, median per model
    (`decode_timings` keeps the samples and checks the arguments)."""
    return {name: 1 / t.median for name, t in decode_timings(models, ids, n, rounds).items()}  # t: seconds per token


def decode_timings(models: dict, ids: list[int], n: int = 16, rounds: int = 3):
    """A `labkit.measure.Run` of `n` greedy decode steps per name -> model after the prompt `ids` (the prefill
    untimed before each), rounds interleaved: seconds per token, with their spread."""
    if not isinstance(n, int) or n < 1 or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"n and rounds must be positive integers, got n={n!r}, rounds={rounds!r}")
    for m in models.values():  # warm-up
        decode(m, prefill(m, ids, max_len=len(ids) + 4), 2)
    states = {}

    def setup(name):
        states[name] = prefill(models[name], ids, max_len=len(ids) + n + 1)

    fns = {name: (lambda name=name: decode(models[name], states[name], n)) for name in models}
    return measure.run(fns, rounds=rounds, warmup=0, per=n, unit="token", setup=setup, machine=False)


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
    run = pass_timings(models, ids, ks, rounds, repeat)
    return {name: {k: run[(name, k)].median for k in ks} for name in models}


@torch.inference_mode()
def pass_timings(models: dict, ids: list[int], ks=(1, 2, 3, 4, 6, 8), rounds: int = 5, repeat: int = 3):
    """`pass_costs` with every sample kept: a `labkit.measure.Run` whose variants are (name, k), seconds per pass
    (`samples_by_name(run)` gives them JSON-ready, keyed "name T(k)")."""
    ks = list(ks)
    states = {name: prefill(m, ids, max_len=len(ids) + max(ks) + 1) for name, m in models.items()}
    base = len(ids)

    def one(name, k):
        m, cache = models[name], states[name].cache
        x = torch.full((1, k), ids[-1], device=m.device)
        for _ in range(repeat):
            m.step(x, cache=cache)
            cache.truncate(base)

    fns = {(name, k): (lambda name=name, k=k: one(name, k)) for name in models for k in ks}
    return measure.run(fns, rounds=rounds, warmup=1, per=repeat, unit="pass", machine=False)


def samples_by_name(run) -> dict:
    """A `pass_timings` Run as JSON: {"name T(k)": samples and their summary}."""
    return {f"{name} T({k})": t.as_dict() for (name, k), t in run.items()}


@torch.inference_mode()
def layer_rates(layers: dict, x: torch.Tensor, rounds: int = 5, repeat: int = 20) -> dict[str, float]:
    """Microseconds of one call layer(x) for each name → layer (a module or function): rounds interleaved,
    the median per layer of `repeat`-call means. For comparing one product's kernels side by side."""
    if not isinstance(rounds, int) or rounds < 1 or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"rounds and repeat must be positive integers, got rounds={rounds!r}, repeat={repeat!r}")
    run = measure.run({name: (lambda layer=layer: [layer(x) for _ in range(repeat)]) for name, layer in layers.items()},
                      rounds=rounds, warmup=1, per=repeat, machine=False)
    return {name: 1e6 * t.median for name, t in run.items()}
