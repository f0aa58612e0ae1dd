"""Exercises of chapter 08: dynamic power, the share of the KV cache on chip, the break-even reply length."""
from __future__ import annotations

import math

from labkit.exercises._core import check

__all__ = ["check_dynamic_power", "check_onchip_share", "check_breakeven_tokens"]


def _reference_dynamic_power(coeff_uw_per_mhz_v2: float, mhz: float, volts: float) -> float:
    # Linux Energy Model: P = C * V^2 * f, with C in uW/MHz/V^2 -> watts
    return coeff_uw_per_mhz_v2 * mhz * volts**2 * 1e-6


def check_dynamic_power(fn) -> bool:
    """Check `fn(coefficient_uW_per_MHz_V2, mhz, volts) -> watts` (the Linux Energy Model's C V^2 f)."""
    cases = [(588, 3300, 1.0), (238, 3150, 0.95), (100, 2270, 0.85), (416, 1200, 0.675), (416, 2400, 1.0)]
    return check("dynamic_power", fn, _reference_dynamic_power, cases,
                 hint="P = C * V**2 * f; C is in microwatts per MHz per volt squared, so multiply by 1e-6 for watts")


def _reference_onchip_share(sram_bytes: float, kv_bytes_per_token: float, context: int) -> float:
    kv = kv_bytes_per_token * context
    return 1.0 if kv == 0 else min(1.0, sram_bytes / kv)


def check_onchip_share(fn) -> bool:
    """Check `fn(sram_bytes, kv_bytes_per_token, context) -> share of the KV cache that fits on chip (0..1)`."""
    mib = 2**20
    cases = [(8 * mib, 114688, 73), (8 * mib, 114688, 4096), (8 * mib, 819200, 10), (8 * mib, 32768, 100), (0, 32768, 5),
             (8 * mib, 32768, 0)]
    return check("onchip_share", fn, _reference_onchip_share, cases,
                 hint="s = min(1, SRAM / (context * kv bytes per token)); an empty cache fits entirely")


def _reference_breakeven_tokens(e_switch: float, t_hi: float, p_hi: float, t_lo: float, p_lo: float) -> float:
    gain = t_hi * p_hi - t_lo * p_lo
    return e_switch / gain if gain > 0 else math.inf


def check_breakeven_tokens(fn) -> bool:
    """Check `fn(e_switch_j, t_hi_s, p_hi_w, t_lo_s, p_lo_w) -> n*`, infinity when the low level saves nothing."""
    cases = [(0.005, 0.05, 6.0, 0.05, 3.5), (0.03, 0.05, 6.0, 0.05, 3.5), (1.8, 0.05, 6.0, 0.05, 3.5),
             (0.5, 0.04, 5.2, 0.04, 3.4), (0.1, 0.05, 6.0, 0.1, 3.5)]
    return check("breakeven_tokens", fn, _reference_breakeven_tokens, cases,
                 hint="each decode token saves t_hi*P_hi - t_lo*P_lo joules; if that is <= 0, return math.inf")
