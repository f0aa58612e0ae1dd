"""Exercises of chapter 00: the decode-speed estimate."""
from __future__ import annotations

from labkit.exercises._core import check

__all__ = ["check_decode_tokens_per_s"]


def _reference_tokens_per_s(n_params: float, bytes_per_weight: float, bandwidth_gb_s: float) -> float:
    # Each decode step reads every weight once: time = bytes / bandwidth.
    return bandwidth_gb_s * 1e9 / (n_params * bytes_per_weight)


def check_decode_tokens_per_s(fn) -> bool:
    """Check `fn(n_params, bytes_per_weight, bandwidth_gb_s) -> tokens/s` (the bandwidth bound)."""
    cases = [(135e6, 4.0, 10.0), (135e6, 0.5625, 10.0), (7e9, 2.0, 100.0), (7e9, 0.5, 51.2), (70e9, 2.0, 3350.0)]
    return check(
        "decode_tokens_per_s",
        fn,
        _reference_tokens_per_s,
        cases,
        hint="a decode step reads every weight once; tokens/s = bandwidth (bytes/s) / bytes of weights",
    )
