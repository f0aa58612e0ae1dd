"""Figures in stored chapter outputs, compared by what a reader can see: numbers within a tolerance, the rest exactly.

nbval compares a chapter's stored outputs with a fresh run. A plotly figure is stored as
JSON whose float arrays are base64 bytes (`{"dtype": "f8", "bdata": "..."}`), so a difference
in the last bit of one value (another BLAS code path, another thread split, another CPU)
fails the cell although no reader could ever see it. Here a figure is compared as a tree:

- the same keys, the same trace types, names, colours, texts and labels, exactly;
- every number (in a list, a typed array, or alone) within `RTOL` of the reference,
  relative to the larger of the two values: 1e-3 is a tenth of a percent, below a pixel on
  any axis, linear or logarithmic. The last bits of a float are far smaller, but a number
  computed through a search or a rounding step moves more when the instruction set changes:
  AWQ's search errors in chapter 06 move in their fourth significant digit between an AVX-512
  and an AVX2 CPU (`make test-portable` emulates the second), which a 1e-4 tolerance fails;
  1e-3 leaves that spread several times over and still fails a point moved by 0.3 %;
- arrays of the same length (a curve with one point more is a different curve).

A figure whose data really changes still fails, and the failure names the first places
that differ:

    >>> ref = {"data": [{"type": "scatter", "y": [1.0, 2.0]}], "layout": {}}
    >>> figure_differences(ref, {"data": [{"type": "scatter", "y": [1.0, 2.0 + 1e-12]}], "layout": {}})
    []
    >>> figure_differences(ref, {"data": [{"type": "scatter", "y": [1.0, 2.1]}], "layout": {}})
    ['data[0].y[1]: 2.1 differs from the stored 2 by 5%']

`install()` (called by `notebooks/conftest.py`) makes nbval compare figures this way; every
other output is compared as nbval always does (text after `nbval_sanitize.cfg`).
"""
from __future__ import annotations

import base64
import math

import numpy as np

from labkit import checks

__all__ = ["RTOL", "FIGURE_MIME", "decode_typed_array", "figure_differences", "ComparedFigure", "install"]

RTOL = 1e-3  # several times the cross-ISA spread of the chapters' figures (see above)
FIGURE_MIME = "application/vnd.plotly.v1+json"
_DTYPES = {"f8": "<f8", "f4": "<f4", "i1": "i1", "u1": "u1", "i2": "<i2", "u2": "<u2", "i4": "<i4", "u4": "<u4",
           "i8": "<i8", "u8": "<u8", "u1c": "u1"}


def decode_typed_array(value: dict) -> np.ndarray:
    """A plotly typed array (`{"dtype": "f8", "bdata": base64, "shape": "2, 3"?}`) as a numpy array.

    >>> decode_typed_array({"dtype": "f8", "bdata": base64.b64encode(np.array([1.5, 2.0]).tobytes()).decode()})
    array([1.5, 2. ])
    """
    dtype = value.get("dtype")
    if dtype not in _DTYPES:
        raise ValueError(f"typed array dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(_DTYPES[dtype]))
    shape = value.get("shape")
    if shape:
        arr = arr.reshape([int(n) for n in str(shape).split(",")])
    return arr


def _is_typed_array(value) -> bool:
    return isinstance(value, dict) and "bdata" in value and "dtype" in value


def _numbers(value) -> np.ndarray | None:
    """A typed array, or a (nested) list of plain numbers, as a float array; None for anything else."""
    if _is_typed_array(value):
        return decode_typed_array(value).astype(np.float64)
    if isinstance(value, list) and value and all(checks.is_number(v) for v in value):
        return np.asarray(value, dtype=np.float64)
    return None


def _close(a: np.ndarray, b: np.ndarray, rtol: float) -> np.ndarray:
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):
        near = np.abs(a - b) <= rtol * np.maximum(np.abs(a), np.abs(b))
    return same | near


def _walk(ref, test, path: str, rtol: float, out: list[str], limit: int) -> None:
    if len(out) >= limit:
        return
    ref_nums, test_nums = _numbers(ref), _numbers(test)
    if ref_nums is not None and test_nums is not None:
        if ref_nums.shape != test_nums.shape:
            out.append(f"{path}: {test_nums.size} values where {ref_nums.size} are stored")
            return
        bad = np.flatnonzero(~_close(ref_nums.ravel(), test_nums.ravel(), rtol))
        for i in bad[: max(0, limit - len(out))]:
            r, t = float(ref_nums.ravel()[i]), float(test_nums.ravel()[i])
            out.append(f"{path}[{i}]: {_relative(t, r)}")
        return
    if checks.is_number(ref) and checks.is_number(test):
        if not _close(np.array([float(ref)]), np.array([float(test)]), rtol)[0]:
            out.append(f"{path}: {_relative(float(test), float(ref))}")
        return
    if isinstance(ref, dict) and isinstance(test, dict):
        for key in sorted(set(ref) | set(test)):
            if key not in test:
                out.append(f"{path}.{key}: stored but missing")
            elif key not in ref:
                out.append(f"{path}.{key}: new, not stored")
            else:
                _walk(ref[key], test[key], f"{path}.{key}" if path else key, rtol, out, limit)
        return
    if isinstance(ref, list) and isinstance(test, list):
        if len(ref) != len(test):
            out.append(f"{path}: {len(test)} items where {len(ref)} are stored")
            return
        for i, (r, t) in enumerate(zip(ref, test)):
            _walk(r, t, f"{path}[{i}]", rtol, out, limit)
        return
    if ref != test or type(ref) is not type(test):
        out.append(f"{path}: {test!r:.80} where {ref!r:.80} is stored")


def _relative(test: float, ref: float) -> str:
    if ref != 0 and math.isfinite(ref) and math.isfinite(test):
        return f"{test:.6g} differs from the stored {ref:.6g} by {abs(test - ref) / abs(ref):.0%}" \
            if abs(test - ref) / abs(ref) >= 0.01 else \
            f"{test:.8g} differs from the stored {ref:.8g} by {abs(test - ref) / abs(ref):.1e} of its value"
    return f"{test:.6g} differs from the stored {ref:.6g}"


def figure_differences(ref: dict, test: dict, rtol: float = RTOL, limit: int = 8) -> list[str]:
    """Where figure `test` differs from the stored `ref` (at most `limit` places); [] when a reader sees the same figure."""
    if not (isinstance(rtol, (int, float)) and 0 <= rtol < 1):
        raise ValueError(f"rtol must be a number in [0, 1), got {rtol!r}")
    out: list[str] = []
    _walk(ref, test, "", rtol, out, limit)
    return out


class ComparedFigure:
    """A figure's JSON that equals another when `figure_differences` finds nothing between them."""

    def __init__(self, figure: dict, rtol: float = RTOL):
        self.figure, self.rtol, self.differences = figure, rtol, []

    def __eq__(self, other) -> bool:
        if not isinstance(other, ComparedFigure):
            return NotImplemented
        # nbval compares stored (self) with fresh (other); both sides learn what differs, for the report
        diffs = figure_differences(self.figure, other.figure, self.rtol)
        self.differences = other.differences = diffs
        return not diffs

    def __ne__(self, other) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __repr__(self) -> str:
        traces = self.figure.get("data", [])
        head = f"plotly figure ({len(traces)} traces; numbers compared within {self.rtol:g} of their value)"
        return "\n".join([head] + [f"  {d}" for d in self.differences])


def _is_figure(value) -> bool:
    return isinstance(value, dict) and isinstance(value.get("data"), list) and isinstance(value.get("layout"), dict)


def install(rtol: float = RTOL) -> None:
    """Make nbval compare plotly figures with `figure_differences` (text outputs are untouched)."""
    from nbval.plugin import IPyNbCell

    if getattr(IPyNbCell.sanitize, "_labkit_figures", False):
        return
    original = IPyNbCell.sanitize

    def sanitize(self, s):
        return ComparedFigure(s, rtol) if _is_figure(s) else original(self, s)

    sanitize._labkit_figures = True
    IPyNbCell.sanitize = sanitize


def assertrepr(left, right) -> list[str] | None:
    """pytest's explanation of a failed figure comparison (for `pytest_assertrepr_compare`)."""
    if isinstance(left, ComparedFigure) and isinstance(right, ComparedFigure):
        diffs = left.differences or figure_differences(left.figure, right.figure, left.rtol)
        return ["the stored figure and the new one differ:"] + diffs
    return None
