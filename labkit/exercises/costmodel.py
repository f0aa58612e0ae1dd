"""Exercises of chapter 03's modelled half: the roofline time, the ridge point in tokens, the prefill share."""
from __future__ import annotations

from labkit.exercises._core import check

__all__ = ["check_roofline_time", "check_ridge_tokens", "check_prefill_share"]


def _reference_roofline_time(flops: float, nbytes: float, peak_flops: float, bandwidth: float) -> float:
    # compute and memory overlap: the slower of the two sets the time
    return max(flops / peak_flops, nbytes / bandwidth)


def check_roofline_time(fn) -> bool:
    """Check `fn(flops, bytes, peak_flops, bandwidth_bytes_per_s) -> seconds` (one roofline, no efficiencies)."""
    cases = [
        (2 * 7e9, 14e9, 989e12, 3.35e12),            # decode step of a 7B model on an H100: memory-bound
        (2 * 7e9 * 2048, 14e9, 989e12, 3.35e12),     # prefill of 2048 tokens: compute-bound
        (1e12, 1e9, 1e12, 1e9),                       # exactly on the ridge
        (45e9, 3.7e9, 45e12, 76.8e9),                 # a phone decoding a 7B INT4 model
    ]
    return check("roofline_time", fn, _reference_roofline_time, cases,
                 hint="time = max(FLOPs / peak FLOP/s, bytes / bandwidth): whichever resource runs out first")


def _reference_ridge_tokens(peak_flops: float, bandwidth: float, bytes_per_weight: float) -> float:
    # a token costs 2 FLOPs per weight; one pass reads bytes_per_weight per weight:
    # 2 N / F = b / BW  ->  N = F b / (2 BW)
    return peak_flops * bytes_per_weight / (2 * bandwidth)


def check_ridge_tokens(fn) -> bool:
    """Check `fn(peak_flops, bandwidth, bytes_per_weight) -> tokens`: tokens per weight pass at the ridge."""
    cases = [(312e12, 2039e9, 2.0), (989e12, 3350e9, 2.0), (45e12, 76.8e9, 0.5625), (154e9, 17.1e9, 4.0)]
    return check("ridge_tokens", fn, _reference_ridge_tokens, cases, compare=lambda a, b: abs(a - b) <= 1e-6 * abs(a),
                 hint="set the compute time of N tokens (2 FLOPs per weight per token) equal to the time to read "
                      "the weights once, and solve for N")


def _reference_prefill_share(prefill_s: float, itl_s: float, reply_len: int) -> float:
    # the first token comes out of the prefill; the other reply_len - 1 are decode steps
    return prefill_s / (prefill_s + (reply_len - 1) * itl_s)


def check_prefill_share(fn) -> bool:
    """Check `fn(prefill_s, itl_s, reply_len) -> share of the request's time spent in prefill`."""
    cases = [(0.061, 0.0144, 33), (0.15, 0.037, 129), (0.6, 0.037, 16), (1.0, 0.05, 1)]
    return check("prefill_share", fn, _reference_prefill_share, cases,
                 hint="total = prefill + (reply_len - 1) decode steps: the first token comes out of the prefill")
