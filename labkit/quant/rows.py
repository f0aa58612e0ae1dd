"""Products whose rows do not depend on how many rows share the call: batch invariance by construction.

Speculative decoding verifies k drafted tokens in one k-token pass where plain decoding runs k
one-token steps; "lossless" means both give every position the same logits, bit for bit. A
library kernel promises no such thing: floating-point addition is not associative, and a BLAS
picks its algorithm (a matrix-vector kernel for one row, blockings by the number of rows, a
split of the reduction over threads) by the shape it is handed, differently on each CPU and
instruction set. With the same torch, MKL's float32 product can round a row alone unlike the same
row among others on one CPU and agree on another; which kernels are row-invariant here is what
`labkit.model.invariance` checks on this machine (`labkit doctor` prints it).

So labkit does not rely on which kernel a vendor library happens to pick. `row_invariant` runs
a product over N rows (2 ≤ N ≤ `INVARIANT_MAX_ROWS`) in one of two ways:

  * **one call**, when this process has checked that this kernel, at this weight shape, dtype
    and thread count, gives every row of a 1..16-row call the bits of that row alone
    (`rows_agree`: random rows, every row count, once per key, cached);
  * **one call per row** otherwise: each row takes the very call a one-token step makes, so it
    gets a one-token step's bits whatever the library does (same call, same inputs, same
    threads; a row whose address is not 64-byte aligned is copied first, as a step's own
    input would be).

Either way a row's bits are a one-token step's, so plain decoding with the switch is plain
decoding without it. What the second way costs is k calls instead of one (`labkit bench --only
step` measures the mode per format); `labkit.model.invariance.default_kernels_report` says, per
format, which way this machine takes, and `labkit doctor` prints it.

    >>> w = torch.randn(64, 32)
    >>> x = torch.randn(5, 32)
    >>> y = row_invariant(lambda a: a @ w.t(), x, ("doc", 64, 32))
    >>> all(torch.equal(y[i:i + 1], x[i:i + 1] @ w.t()) for i in range(5))
    True
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Hashable

import torch

__all__ = ["INVARIANT_MAX_ROWS", "row_invariant", "rows_agree", "batched_is_invariant", "plan_cache", "force_plan",
           "as_usual", "invariant_now"]

INVARIANT_MAX_ROWS = 16  # passes of up to this many tokens are made row-invariant (a prompt's longer pass is not)

_plans: dict = {}  # (key, width, dtype, threads) -> whether one call gives every row its own bits
_forced: list = [None]  # None, "batched" or "rows": a test or a lesson overrides the check
_usual = threading.local()  # .on: this thread runs a pass the switch leaves alone (a prompt)


def rows_agree(product: Callable[[torch.Tensor], torch.Tensor], width: int, dtype: torch.dtype,
               max_rows: int = INVARIANT_MAX_ROWS, seed: int = 0) -> bool:
    """Whether `product` gives each row of an m-row call (m = 2..max_rows) the bits of that row alone.

    Random rows of `width` features in `dtype`; a kernel that reorders its additions by the row
    count shows it here on almost every row (a rounding difference needs no special input).
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(max_rows, width, generator=g).to(dtype)
    alone = torch.cat([product(_row(x, i)) for i in range(max_rows)])
    return all(torch.equal(product(x[:m]), alone[:m]) for m in range(2, max_rows + 1))


def batched_is_invariant(product: Callable, x: torch.Tensor, key: Hashable) -> bool:
    """The cached `rows_agree` for this kernel `key` at x's width and dtype and torch's thread count."""
    if _forced[0] is not None:
        return _forced[0] == "batched"
    full = (key, x.shape[-1], x.dtype, torch.get_num_threads())
    agree = _plans.get(full)
    if agree is None:
        agree = _plans[full] = rows_agree(product, x.shape[-1], x.dtype)
    return agree


def row_invariant(product: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, key: Hashable) -> torch.Tensor:
    """product(x) for x [N, in], each row with the bits product gives it alone (N ≤ `INVARIANT_MAX_ROWS`).

    `key` names the kernel and the weight's shape and layout (not its values): rows that agree
    for one weight agree for every weight the same kernel takes at that shape. One row, or more
    than `INVARIANT_MAX_ROWS` (a prompt), is one call as usual.
    """
    rows = x.shape[0]
    if rows == 1 or rows > INVARIANT_MAX_ROWS or getattr(_usual, "on", False) or batched_is_invariant(product, x, key):
        return product(x)
    return torch.cat([product(_row(x, i)) for i in range(rows)])


@contextmanager
def as_usual(on: bool = True):
    """`with as_usual():` products in this thread take one call, switch or not: a prompt's pass (the model
    reads a prompt the same way with the switch on, so plain decoding with it is plain decoding without)."""
    before = getattr(_usual, "on", False)
    _usual.on = on
    try:
        yield
    finally:
        _usual.on = before


def invariant_now(switch: bool) -> bool:
    """Whether a layer whose switch is `switch` makes this pass row-invariant (not inside `as_usual`)."""
    return switch and not getattr(_usual, "on", False)


def _row(x: torch.Tensor, i: int) -> torch.Tensor:
    """Row i as a [1, in] tensor laid out as a step's input: a view when 64-byte aligned, else a copy."""
    row = x[i:i + 1]
    return row if row.is_contiguous() and row.data_ptr() % 64 == 0 else row.clone(memory_format=torch.contiguous_format)


def plan_cache() -> dict:
    """What this process has checked: {(key, width, dtype, threads): one call agrees with each row alone}."""
    return dict(_plans)


class force_plan:
    """`with force_plan("rows"):` (or "batched") skips the check: for tests and for timing both ways."""

    def __init__(self, plan: str | None):
        if plan not in (None, "batched", "rows"):
            raise ValueError(f"plan must be None, 'batched' or 'rows', got {plan!r}")
        self.plan = plan

    def __enter__(self):
        self.before = _forced[0]
        _forced[0] = self.plan
        return self

    def __exit__(self, *exc):
        _forced[0] = self.before
        return False
