"""The machinery shared by every exercise checker.

A checker runs the learner's function and the reference on the same cases and
prints one line: a pass, or the first failing case with what was expected and
what came back. It returns True/False so tests and notebooks can assert on it.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Iterable

import numpy as np


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def same(expected: Any, got: Any, *, atol: float = 1e-6, rtol: float = 1e-5) -> bool:
    """Equality that understands tensors, arrays and floats (with a tolerance)."""
    try:
        import torch

        if isinstance(expected, torch.Tensor) or isinstance(got, torch.Tensor):
            if not (isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor)):
                return False
            if expected.shape != got.shape:
                return False
            if expected.dtype.is_floating_point or got.dtype.is_floating_point:
                return bool(torch.allclose(expected.double(), got.double(), atol=atol, rtol=rtol, equal_nan=True))
            return bool(torch.equal(expected, got))
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    if isinstance(expected, np.ndarray) or isinstance(got, np.ndarray):
        expected, got = np.asarray(expected), np.asarray(got)
        return expected.shape == got.shape and bool(np.allclose(expected, got, atol=atol, rtol=rtol, equal_nan=True))
    if isinstance(expected, float) or isinstance(got, float):
        try:
            return bool(np.isclose(float(expected), float(got), atol=atol, rtol=rtol))
        except (TypeError, ValueError):
            return False
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(expected) == len(got) and all(same(e, g, atol=atol, rtol=rtol) for e, g in zip(expected, got))
    if isinstance(expected, dict) and isinstance(got, dict):
        return expected.keys() == got.keys() and all(same(expected[k], got[k], atol=atol, rtol=rtol) for k in expected)
    return expected == got


def check(
    name: str,
    fn: Callable,
    reference: Callable,
    cases: Iterable[tuple],
    *,
    compare: Callable[[Any, Any], bool] = same,
    hint: str = "",
) -> "Verdict":
    """Run `fn(*case)` and `reference(*case)` on each case; print a pass line or the first failure.

    Arguments are deep-copied for each call, so a function that mutates its input
    cannot corrupt the reference's view of the case.
    """
    cases = list(cases)
    expected = [reference(*copy.deepcopy(case)) for case in cases]  # a broken reference raises here

    def step(f, i, case, want):
        try:
            got = f(*copy.deepcopy(case))
        except NotImplementedError:
            raise
        except Exception as exc:  # the learner's bug, reported, not raised
            return f"case {i}/{len(cases)} raised {type(exc).__name__}: {exc}\n       input: {_short(case)}"
        if compare(want, got):
            return None
        return (f"case {i}/{len(cases)}\n       input:    {_short(case)}\n       expected: {_short(want)}\n"
                f"       got:      {_short(got)}")

    steps = [(lambda f, i=i, case=case, want=want: step(f, i, case, want))
             for i, (case, want) in enumerate(zip(cases, expected), start=1)]
    return run_steps(name, fn, steps, hint=hint, passed=f"all {len(cases)} cases match the reference.")


def run_steps(name: str, fn: Callable, steps: list[Callable], *, hint: str = "", passed: str = "") -> "Verdict":
    """The loop every property checker shares: run each `step(fn)` in turn, stop at the first failure.

    A step calls the learner's function itself and returns None when its property holds, else the
    lines that say why (a string). Prints [TODO] for a stub that raises NotImplementedError, the first
    [FAIL] with `hint`, or [PASS] with `passed` (default: how many checks held); returns the Verdict.
    An exception from the learner's function is reported as a failure, not raised.
    """
    if not callable(fn):
        raise TypeError(f"{name}: expected a function, got {type(fn).__name__}")
    for i, step in enumerate(steps, start=1):
        try:
            why = step(fn)
        except NotImplementedError:
            print(f"[TODO] {name}: not implemented yet - replace the `raise NotImplementedError` with your code.")
            return Verdict(False)
        except Exception as exc:  # the learner's bug (or a result of the wrong shape), reported, not raised
            why = f"check {i}/{len(steps)} raised {type(exc).__name__}: {exc}"
        if why:
            print(f"[FAIL] {name}: {why}")
            if hint:
                print(f"       hint: {hint}")
            return Verdict(False)
    print(f"[PASS] {name}: {passed or f'all {len(steps)} checks hold.'}")
    return Verdict(True)


class Verdict:
    """The outcome of a checker: truthy when every case passed; shows nothing in a notebook."""

    def __init__(self, passed: bool):
        self.passed = bool(passed)

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"Verdict(passed={self.passed})"

    def _ipython_display_(self) -> None:  # the printed line already says it
        pass
