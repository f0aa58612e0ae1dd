"""Exercises of chapter 08: the clock that spends the least energy on a job, the context from which the KV cache
costs more energy than the weights, and the break-even reply length with the idle tail counted.

Each checker compares the learner's function with a reference on cases built to separate the plausible wrong
answers (race to idle or the lowest clock taken for granted, SRAM ignored or charged at DRAM's price, the idle
tail left out, a threshold off by one token), not with one figure the chapter printed.
"""
from __future__ import annotations

import math

from labkit.exercises._core import check

__all__ = ["check_cheapest_mhz", "check_kv_outweighs_at", "check_breakeven_with_tail"]


def _reference_cheapest_mhz(vf, coeff: float, static_w: float, megacycles: float) -> float:
    # At (f MHz, V volts) the job takes megacycles / f seconds at C V^2 f (uW/MHz/V^2 -> W) plus the static power.
    def energy(point):
        mhz, volts = point
        return (coeff * mhz * volts**2 * 1e-6 + static_w) * megacycles / mhz

    return min(vf, key=lambda p: (energy(p), p[0]))[0]


def check_cheapest_mhz(fn) -> bool:
    """Check `fn(vf, coeff, static_w, megacycles) -> MHz`: the clock of the V-f table `vf` ((MHz, volts) pairs)
    at which a job of `megacycles` million cycles spends the least energy, with dynamic power C·V²·f (`coeff` in
    µW/MHz/V², as the Linux Energy Model) and `static_w` watts drawn while it runs; the lower clock on a tie."""
    phone = [(300, 0.55), (500, 0.6), (700, 0.65), (900, 0.72), (1100, 0.8), (1300, 0.9)]
    flat = [(600, 0.8), (1200, 0.8), (1800, 0.8)]
    cases = [(phone, 2000, 0.3, 100.0), (phone, 2000, 0.0, 100.0), (phone, 2000, 3.0, 100.0),
             (phone, 500, 0.5, 50.0), (flat, 1000, 0.2, 10.0), ([(1000, 1.0)], 100, 1.0, 1.0),
             ([(400, 0.5), (800, 0.5 * math.sqrt(2))], 1000, 0.0, 20.0)]
    return check("cheapest_mhz", fn, _reference_cheapest_mhz, cases,
                 hint="energy = power × time: (C·V²·f·1e-6 + static) watts for megacycles / f seconds at each point "
                      "of the table; take the smallest, the lower clock on a tie")


def _reference_kv_outweighs_at(weight_bytes: float, kv_bytes_per_token: float, sram_bytes: float,
                               pj_dram: float, pj_sram: float) -> int:
    # One decode step reads the weights from DRAM and the cache: its newest tokens from SRAM (as many bytes as fit),
    # the rest from DRAM. The smallest context at which the cache's read energy exceeds the weights'.
    weights = weight_bytes * pj_dram
    on_chip_all = sram_bytes * pj_sram                       # the cache's energy once the SRAM is full
    if on_chip_all > weights:                                # it outweighs them while still on chip
        return math.floor(weights / (kv_bytes_per_token * pj_sram)) + 1
    return math.floor((weights - on_chip_all) / pj_dram / kv_bytes_per_token + sram_bytes / kv_bytes_per_token) + 1


def check_kv_outweighs_at(fn) -> bool:
    """Check `fn(weight_bytes, kv_bytes_per_token, sram_bytes, pj_per_bit_dram, pj_per_bit_sram) -> tokens`: the
    smallest context (cached tokens) at which reading the KV cache in one decode step costs more energy than
    reading the weights from DRAM, when the newest tokens' keys and values sit in `sram_bytes` of SRAM (as many
    bytes as fit) and the rest in DRAM."""
    mib = 2**20
    cases = [(1.8e9, 114688, 8 * mib, 6.0, 0.5), (1.8e9, 114688, 0, 6.0, 0.5), (270e6, 23040, 8 * mib, 6.0, 0.5),
             (270e6, 23040, 64 * mib, 6.0, 0.5), (1e6, 1000, 64 * mib, 6.0, 0.5), (3.5e9, 524288, 32 * mib, 10.0, 1.0),
             (1e6, 1024, 0, 6.0, 6.0)]
    return check("kv_outweighs_at", fn, _reference_kv_outweighs_at, cases,
                 hint="the cache's energy at c tokens: its first sram_bytes at the SRAM's price, the rest at DRAM's; "
                      "find the first c where that is strictly more than weight_bytes at DRAM's price (the per-bit "
                      "factor 8 is common to both sides)")


def _reference_breakeven_with_tail(e_switch: float, t_hi: float, p_hi: float, t_lo: float, p_lo: float,
                                   tail_s: float, idle_hi_w: float, idle_lo_w: float):
    gain = t_hi * p_hi - t_lo * p_lo                    # saved per decode token at the low level
    owed = e_switch - tail_s * (idle_hi_w - idle_lo_w)  # the switch, less what the cheaper idle tail saves
    if owed < gain:                                     # one token already pays
        return 1
    if gain <= 0:
        return None
    return math.floor(owed / gain) + 1


def check_breakeven_with_tail(fn) -> bool:
    """Check `fn(e_switch, t_hi, p_hi, t_lo, p_lo, tail_s, idle_hi_w, idle_lo_w) -> tokens or None`: the shortest
    reply (in decode tokens, at least 1) for which switching to the low level costs strictly less energy than
    staying at the top one, when the switch costs `e_switch` joules, a token takes `t` seconds at `p` watts at
    each level, and after the reply the chip idles `tail_s` seconds at `idle_hi_w` or `idle_lo_w` watts; None
    when no reply length pays."""
    # no case puts the threshold exactly on a whole token, where float rounding could decide it
    cases = [(1.7, 0.05, 6.0, 0.05, 3.5, 0.3, 3.1, 1.25), (1.7, 0.05, 6.0, 0.05, 3.5, 0.0, 3.1, 1.25),
             (0.005, 0.05, 6.0, 0.05, 3.5, 0.3, 3.1, 1.25), (0.5, 0.05, 3.5, 0.05, 3.5, 0.3, 3.1, 1.25),
             (0.5, 0.05, 3.5, 0.05, 3.5, 0.3, 1.0, 1.0), (0.25, 0.1, 2.0, 0.1, 1.0, 0.0, 0.5, 0.5),
             (0.35, 0.1, 2.0, 0.1, 1.0, 0.0, 0.5, 0.5), (0.1, 0.1, 1.0, 0.1, 2.0, 0.5, 1.0, 0.5)]
    return check("breakeven_with_tail", fn, _reference_breakeven_with_tail, cases,
                 hint="n tokens save n·(t_hi·p_hi − t_lo·p_lo); the tail saves tail_s·(idle_hi − idle_lo) once; the "
                      "split pays from the first n at which the savings strictly exceed the switch; None if never")
