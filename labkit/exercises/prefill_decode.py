"""Exercises of chapter 03, the measured half: a stream's metrics and a TTFT predicted before it is measured.

Both checkers test properties of the learner's function on synthetic streams and sweeps (a stall that
must move some metrics and not others, a prefill law that must be extrapolated), not the outputs of one
formula the chapter printed.
"""
from __future__ import annotations

import math

from labkit.exercises._core import Verdict, run_steps

__all__ = ["check_stream_metrics", "check_ttft_prediction"]


def run_properties(name: str, fn, properties, hint: str = "") -> Verdict:
    """Run `fn` on each property's arguments, through `run_steps`.

    properties: (label, args, test) triples; `test(result)` returns True when the property holds. A test
    given as the exception class `ValueError` means: `fn(*args)` must raise it.
    """
    def step(f, i, label, args, test):
        where = f"property {i}/{len(properties)}"
        try:
            result = f(*args)
        except ValueError:
            if test is ValueError:
                return None
            raise
        if test is ValueError:
            return f"{where} does not hold: {label}\n       got: {result!r}"[:300]
        try:
            ok = bool(test(result))
        except Exception:  # a result of the wrong shape
            ok = False
        return None if ok else f"{where} does not hold: {label}\n       got: {result!r}"[:300]

    steps = [(lambda f, i=i, p=p: step(f, i, *p)) for i, p in enumerate(properties, start=1)]
    return run_steps(name, fn, steps, hint=hint, passed=f"all {len(properties)} properties hold.")


def _close(a, b, tol: float = 1e-9) -> bool:
    return a is not None and b is not None and abs(float(a) - float(b)) <= tol


def _stream(first: float, gaps: list[float]) -> list[float]:
    times = [first]
    for g in gaps:
        times.append(times[-1] + g)
    return times


def check_stream_metrics(fn) -> Verdict:
    """Check `fn(request_time, token_times) -> {"ttft", "itl_median", "itl_p90", "tpot"}` (seconds).

    ttft: request to first token. The ITLs are the gaps between consecutive tokens; itl_median and
    itl_p90 are their median and 90th percentile; tpot is the mean time per output token after the
    first. A one-token reply has no ITL: the three ITL metrics are None. Times that go backwards (a
    token before the request, or before the token preceding it) raise ValueError.
    """
    g, stall, n = 0.05, 1.0, 30  # 30 tokens: 29 gaps
    plain = _stream(0.3, [g] * (n - 1))
    one_stall = _stream(0.3, [g] * 14 + [g + stall] + [g] * 14)
    many = _stream(0.3, [g + stall if i % 5 == 0 else g for i in range(n - 1)])  # 6 of 29 gaps stalled
    late = _stream(0.3 + stall, [g] * (n - 1))

    def metrics(ttft, median, p90, tpot):
        return lambda r: (_close(r["ttft"], ttft) and _close(r["itl_median"], median) and _close(r["itl_p90"], p90)
                          and _close(r["tpot"], tpot))

    properties = [
        ("an even stream: every ITL metric is the gap", (0.0, plain), metrics(0.3, g, g, g)),
        ("the request time is subtracted, not assumed 0", (10.0, [10.0 + t for t in plain]), metrics(0.3, g, g, g)),
        ("one stall in 29 gaps moves the mean (tpot) but neither the median nor p90", (0.0, one_stall),
         metrics(0.3, g, g, g + stall / (n - 1))),
        ("a stall in 6 of 29 gaps (over 10 %) moves p90 to the stalled gap", (0.0, many),
         metrics(0.3, g, g + stall, g + 6 * stall / (n - 1))),
        ("a stall before the first token moves the TTFT only, no ITL metric", (0.0, late), metrics(0.3 + stall, g, g, g)),
        ("a one-token reply has a TTFT and no ITL (None)", (0.0, [0.4]),
         lambda r: _close(r["ttft"], 0.4) and r["itl_median"] is None and r["itl_p90"] is None and r["tpot"] is None),
        ("a token before the request raises ValueError", (1.0, [0.5, 0.6]), ValueError),
        ("token times that go backwards raise ValueError", (0.0, [0.5, 0.7, 0.6]), ValueError),
    ]
    return run_properties("stream_metrics", fn, properties,
                          hint="the first gap is the TTFT, not an ITL; the median and the 90th percentile come "
                               "from the sorted ITLs; tpot is (last - first token) / (tokens - 1)")


def _law_linear(p: float) -> float:       # a fixed cost plus a cost per token
    return 0.02 + 1.2e-3 * p


def _law_quadratic(p: float) -> float:    # ... plus attention over every earlier token: a P² term
    return 0.01 + 1.0e-3 * p + 4e-7 * p * p


def _rows(law, lens=(16, 64, 256, 512)) -> list[dict]:
    return [{"prompt_len": p, "ttft_s": law(p)} for p in lens]


def check_ttft_prediction(fn) -> Verdict:
    """Check `fn(rows, prompt_len) -> predicted TTFT (s)` from a sweep's rows ({"prompt_len", "ttft_s"}, at
    least three) at a prompt length the sweep may not cover.

    The sweeps are made from prefill laws with a fixed cost, a cost per token and, in one, attention's
    cost that grows with the square of the prompt; a prediction must land within 3 % of the law,
    also at four times the longest prompt measured.
    """
    def near(law, p, rtol=0.03):
        return lambda got: isinstance(got, (int, float)) and math.isfinite(got) and abs(got - law(p)) <= rtol * law(p)

    shuffled = list(reversed(_rows(_law_quadratic, (16, 32, 64, 128, 256, 512))))
    properties = [
        ("inside the sweep (prompt 128, fixed + per-token law)", (_rows(_law_linear), 128), near(_law_linear, 128)),
        ("a fixed cost: 1024 tokens is not twice the 512-token TTFT", (_rows(_law_linear), 1024), near(_law_linear, 1024)),
        ("a short prompt keeps the fixed cost (8 tokens)", (_rows(_law_linear), 8), near(_law_linear, 8)),
        ("attention grows with P²: extrapolate to 2048 tokens", (_rows(_law_quadratic), 2048), near(_law_quadratic, 2048)),
        ("rows in any order", (shuffled, 1024), near(_law_quadratic, 1024)),
    ]
    return run_properties("ttft_prediction", fn, properties,
                          hint="what does a prefill pay once, per token, and per pair of tokens? fit those three "
                               "terms to the rows (a least-squares fit of degree 2 in the prompt length)")
