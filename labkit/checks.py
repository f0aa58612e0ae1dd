"""Argument checks, one message form for the whole lab: "`name` must be <what is allowed>, got <value>".

Every public function of labkit checks what it is handed with these, so the same mistake reads the same
everywhere and names the parameter, the value and what is allowed:

    >>> integer("block_size", 0, low=1)
    Traceback (most recent call last):
    ...
    ValueError: block_size must be a positive integer, got 0
    >>> number("top_p", 1.5, low=0, high=1, low_open=True)
    Traceback (most recent call last):
    ...
    ValueError: top_p must be a number in (0, 1], got 1.5
    >>> one_of("policy", "fifo", ("static", "continuous"))
    Traceback (most recent call last):
    ...
    ValueError: policy must be one of ('static', 'continuous'), got 'fifo'

`bool` is an `int` subclass in Python; an integer or number check refuses it (`True` is not a count). Each
check returns the value it accepted, so `self.n = positive_int("n", n)` reads in one line. `why` adds what
the parameter means, in parentheses after the allowed range. `error` picks the exception class where a
caller's contract says `TypeError` (a value of the wrong kind); the default is `ValueError`.

This module is the bottom of the lab: it imports nothing from labkit.
"""
from __future__ import annotations

import math

__all__ = ["is_int", "is_number", "integer", "positive_int", "number", "positive", "probability", "flag",
           "one_of", "tensor"]


def is_int(value) -> bool:
    """True for a Python int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """True for a Python int or float that is not a bool (NaN and infinities included: see `number`)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fail(name: str, what: str, value, why: str, none_ok: bool, error: type[Exception]):
    if none_ok:
        what = "None or " + what
    why = f" ({why})" if why and not why.startswith(" ") else why
    raise error(f"{name} must be {what}{why}, got {value!r}")


def _int_words(low, high) -> str:
    if high is None:
        if low is None:
            return "an integer"
        return {1: "a positive integer", 0: "a non-negative integer"}.get(low, f"an integer >= {low}")
    return f"an integer <= {high}" if low is None else f"an integer in [{low}, {high}]"


def integer(name: str, value, low: int | None = None, high: int | None = None, *, why: str = "",
            none_ok: bool = False, error: type[Exception] = ValueError):
    """`value` if it is an int (not a bool) in [low, high] (an open end where None), else raise."""
    if value is None and none_ok:
        return None
    if not is_int(value) or (low is not None and value < low) or (high is not None and value > high):
        _fail(name, _int_words(low, high), value, why, none_ok, error)
    return value


def positive_int(name: str, value, *, why: str = "", none_ok: bool = False, error: type[Exception] = ValueError):
    """`value` if it is an int >= 1, else raise ("name must be a positive integer, got ...")."""
    return integer(name, value, 1, why=why, none_ok=none_ok, error=error)


def _number_words(low, high, low_open: bool, high_open: bool) -> str:
    if low is None and high is None:
        return "a finite number"
    if high is None:
        if low == 0:
            return "a positive number" if low_open else "a number >= 0"
        return f"a number {'>' if low_open else '>='} {low}"
    if low is None:
        return f"a number {'<' if high_open else '<='} {high}"
    return f"a number in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def number(name: str, value, low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False, why: str = "", none_ok: bool = False, error: type[Exception] = ValueError):
    """`value` if it is a finite int or float (not a bool) within the bounds, else raise.

    `low_open` / `high_open` exclude that end: `number("p", p, 0, 1, low_open=True)` allows (0, 1]."""
    if value is None and none_ok:
        return None
    ok = is_number(value) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        _fail(name, _number_words(low, high, low_open, high_open), value, why, none_ok, error)
    return value


def positive(name: str, value, *, why: str = "", none_ok: bool = False, error: type[Exception] = ValueError):
    """`value` if it is a finite number > 0, else raise ("name must be a positive number, got ...")."""
    return number(name, value, 0, low_open=True, why=why, none_ok=none_ok, error=error)


def probability(name: str, value, *, low_open: bool = False, high_open: bool = False, why: str = "",
                none_ok: bool = False):
    """`value` if it is a number in [0, 1] (an end excluded where asked), else raise."""
    return number(name, value, 0, 1, low_open=low_open, high_open=high_open, why=why, none_ok=none_ok)


def flag(name: str, value, *, error: type[Exception] = ValueError) -> bool:
    """`value` if it is True or False (not 0, 1 or None), else raise."""
    if not isinstance(value, bool):
        raise error(f"{name} must be True or False, got {value!r}")
    return value


def one_of(name: str, value, choices, *, why: str = "", error: type[Exception] = ValueError):
    """`value` if it is one of `choices`, else raise naming them all."""
    choices = tuple(choices)
    try:
        found = value in choices
    except TypeError:  # an unhashable value against a set or dict of choices
        found = False
    if not found:
        _fail(name, f"one of {choices}", value, why, False, error)
    return value


def tensor(name: str, value, *, ndim: int | None = None, shape: tuple | None = None, dtype=None,
           floating: bool = False):
    """`value` if it is a torch.Tensor with that many dimensions, that shape (None in `shape`: any size) and
    dtype (or any floating-point dtype with `floating=True`); TypeError for a non-tensor or wrong dtype,
    ValueError for a wrong shape."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if dtype is not None and value.dtype != dtype:
        raise TypeError(f"{name} must be a {dtype} tensor, got {value.dtype}")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {value.dtype}")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(value.shape)}")
    if shape is not None and (value.dim() != len(shape)
                              or any(s is not None and s != v for s, v in zip(shape, value.shape))):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name} must have shape {want}, got {tuple(value.shape)}")
    return value
