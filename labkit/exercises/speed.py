"""Exercises of the deep dive on decode speed against bytes (06b): what a faster product buys the whole step, what
the products would have to reach for a target speed-up, and the share of a profiled step outside the products.

Each checker compares the learner's function with a reference on cases built to separate the plausible wrong
answers (the product's speed-up taken for the step's, the rest of the step scaled with the bytes, a target that
the rest alone already misses, a profile read with the unprofiled step or without the time between operators).
"""
from __future__ import annotations

from labkit.exercises._core import check

__all__ = ["check_step_speedup", "check_products_budget", "check_rest_share"]


def _reference_step_speedup(step_ms: float, products_ms: float, product_speedup: float) -> float:
    # only the products get faster; the rest of the step (step_ms - products_ms) stays as it is
    return step_ms / (step_ms - products_ms + products_ms / product_speedup)


def check_step_speedup(fn) -> bool:
    """Check `fn(step_ms, products_ms, product_speedup) -> speed-up`: how many times faster a whole decode step
    runs when its weight products (`products_ms` of its `step_ms`) run `product_speedup` times faster and
    everything else in the step takes as long as before."""
    cases = [(54.7, 34.9, 2.0), (45.5, 26.2, 1.0), (27.0, 11.8, 10.0), (10.0, 10.0, 4.0), (10.0, 0.0, 3.0),
             (40.0, 30.0, 1e9), (20.0, 5.0, 0.5)]
    return check("step_speedup", fn, _reference_step_speedup, cases,
                 hint="check two limits of your formula: products 1x faster must leave the step as it was, and a "
                      "step that is all products must get exactly the products' speed-up; no step can gain more "
                      "than its products do")


def _reference_products_budget(step_ms: float, products_ms: float, target_speedup: float):
    rest = step_ms - products_ms
    budget = step_ms / target_speedup - rest
    return budget if budget > 0 else None


def _same_budget(expected, got) -> bool:
    if expected is None or got is None:
        return expected is None and got is None
    try:
        return abs(float(got) - expected) <= 1e-6 * max(1.0, abs(expected))
    except (TypeError, ValueError):
        return False


def check_products_budget(fn) -> bool:
    """Check `fn(step_ms, products_ms, target_speedup) -> ms or None`: how long the weight products may take for
    the whole step to run `target_speedup` times faster when the rest of the step (`step_ms - products_ms`) stays
    as it is; None when no product speed reaches the target (the rest alone takes the whole budget or more)."""
    cases = [(54.7, 34.9, 1.5), (54.7, 34.9, 2.0), (54.7, 34.9, 3.0), (27.0, 11.8, 1.2), (10.0, 10.0, 4.0),
             (10.0, 6.0, 2.5), (10.0, 6.0, 1.0), (30.0, 20.0, 3.0)]
    return check("products_budget", fn, _reference_products_budget, cases, compare=_same_budget,
                 hint="check your answer by putting it back: with the products taking what you returned and the "
                      "rest unchanged, the step must run exactly target times faster; and ask what the rest alone "
                      "allows")


def _reference_rest_share(profile: dict) -> float:
    return (profile["other_ms"] + profile["outside_ms"]) / profile["profiled_step_ms"]


def check_rest_share(fn) -> bool:
    """Check `fn(profile) -> share`: the share (0..1) of a profiled decode step spent outside the weight products,
    from a `labkit.generation.profile.step_profile` row: `profiled_step_ms` (the step under the profiler) =
    `matmul_ms` (the products) + `other_ms` (every other operator) + `outside_ms` (between operators: Python,
    dispatch); `step_ms` is the same step timed without the profiler."""
    rows = [{"step_ms": 50.0, "profiled_step_ms": 54.7, "matmul_ms": 34.9, "other_ms": 7.3, "outside_ms": 12.5},
            {"step_ms": 42.0, "profiled_step_ms": 45.5, "matmul_ms": 26.2, "other_ms": 9.0, "outside_ms": 10.3},
            {"step_ms": 21.0, "profiled_step_ms": 27.0, "matmul_ms": 11.8, "other_ms": 5.9, "outside_ms": 9.3},
            {"step_ms": 9.0, "profiled_step_ms": 9.0, "matmul_ms": 9.0, "other_ms": 0.0, "outside_ms": 0.0}]
    return check("rest_share", fn, _reference_rest_share, [(r,) for r in rows],
                 hint="compare the printed case's fields with the docstring's sum: which parts make up the step "
                      "your share divides, and what range must a share lie in?")
