"""Exercises of chapter 00: the decode-speed estimate, read backwards, and with the KV cache read too."""
from __future__ import annotations

from labkit.exercises._core import check

__all__ = ["check_decode_tokens_per_s", "check_largest_model", "check_decode_tokens_per_s_at"]


def _reference_tokens_per_s(n_params: float, bits: float, group_size, bandwidth_gb_s: float) -> float:
    # Each decode step reads every weight once: its code, and its share of its group's 16-bit scale.
    bits_per_weight = bits + (16 / group_size if group_size else 0)
    return bandwidth_gb_s * 1e9 / (n_params * bits_per_weight / 8)


def check_decode_tokens_per_s(fn) -> bool:
    """Check `fn(n_params, bits, group_size, bandwidth_gb_s) -> tokens/s`: the bandwidth bound of batch-1 decode
    for weights stored as `bits`-bit codes with one 16-bit scale per `group_size` weights (None: no scales)."""
    cases = [(135e6, 32, None, 10.0), (135e6, 16, None, 10.0), (7e9, 4, 32, 51.2), (7e9, 8, 32, 100.0),
             (70e9, 16, None, 3350.0), (135e6, 4, 64, 10.0), (8e9, 4, 128, 120.0)]
    return check(
        "decode_tokens_per_s",
        fn,
        _reference_tokens_per_s,
        cases,
        hint="a decode step reads every weight once; a weight costs its bits plus 16 / group_size bits of its "
             "group's scale; divide by 8 for bytes; tokens/s = bandwidth (bytes/s) / bytes of weights",
    )


def _reference_largest_model(tokens_per_s: float, bytes_per_weight: float, bandwidth_gb_s: float, memory_gb: float) -> float:
    # The bound read backwards: a model decodes at `tokens_per_s` if its bytes fit that many times a
    # second into the bandwidth; it must also fit in memory. The smaller limit wins.
    by_speed = bandwidth_gb_s * 1e9 / tokens_per_s / bytes_per_weight
    by_memory = memory_gb * 1e9 / bytes_per_weight
    return min(by_speed, by_memory)


def check_largest_model(fn) -> bool:
    """Check `fn(tokens_per_s, bytes_per_weight, bandwidth_gb_s, memory_gb) -> parameters` (the largest model)."""
    cases = [(20.0, 0.5625, 76.8, 12.0), (20.0, 2.0, 76.8, 12.0), (5.0, 0.5625, 76.8, 12.0), (100.0, 4.0, 20.0, 24.0),
             (30.0, 2.0, 3350.0, 80.0), (1.0, 2.0, 3350.0, 80.0)]
    return check(
        "largest_model",
        fn,
        _reference_largest_model,
        cases,
        hint="two limits: the bandwidth must stream the model tokens_per_s times a second, and the model must fit in memory",
    )


def _reference_tokens_per_s_at(n_params: float, bytes_per_weight: float, kv_bytes_per_token: float, context: int,
                               bandwidth_gb_s: float) -> float:
    # A step at `context` cached tokens reads every weight and the keys and values of every cached token.
    return bandwidth_gb_s * 1e9 / (n_params * bytes_per_weight + context * kv_bytes_per_token)


def check_decode_tokens_per_s_at(fn) -> bool:
    """Check `fn(n_params, bytes_per_weight, kv_bytes_per_token, context, bandwidth_gb_s) -> tokens/s`: the
    bandwidth bound of a decode step that also reads the KV cache of `context` earlier tokens."""
    cases = [(135e6, 4.0, 46080, 0, 10.0), (135e6, 4.0, 46080, 8192, 10.0), (135e6, 0.5625, 23040, 2048, 50.0),
             (7e9, 2.0, 524288, 4096, 100.0), (8e9, 0.5, 131072, 128000, 120.0), (70e9, 2.0, 327680, 32768, 3350.0)]
    return check(
        "decode_tokens_per_s_at",
        fn,
        _reference_tokens_per_s_at,
        cases,
        hint="each step reads the weights once and the cached keys and values of every earlier token once: "
             "tokens/s = bandwidth / (weight bytes + context * KV bytes per token)",
    )
