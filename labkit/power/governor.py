"""Governor decisions: the lowest core clock that leaves decode as fast, and clocks under a power cap.

Decode waits on memory, so the core clock can drop until compute time catches up with memory
time ("free" down-clocking; Maliakel et al. measured 1-6 % latency for a 2842 -> 180 MHz cut).
A power cap lowers the clock only in the phase that draws more than the cap: on an H100 at a
70 % cap, prefill (~700 W) slows and decode (~380 W) does not (SplitwiseSim's power-capped SKU).
"""
from __future__ import annotations

import numpy as np

from labkit.power.energy import awake_power
from labkit.costmodel.profiles import hardware, precision_for
from labkit.costmodel.roofline import phase_time
from labkit.costmodel.workload import decode_work, prefill_work

__all__ = ["free_decode_mhz", "power_cap", "clock_sweep"]


def _decode_probe(config, hw, context, batch, bits, tp, settings, freqs):
    work = decode_work(config, context, batch, tp=tp, **bits)
    timing = {k: v for k, v in settings.items() if k in ("compute_eff", "mem_eff")}
    sram = settings.get("kv_sram_mb", 0.0) * 2**20
    return phase_time(work, hw, core_mhz=freqs, sram_kv_bytes=sram, tp=tp, **bits, **timing)


def free_decode_mhz(config, hw, context: int, batch: int = 1, weight_bits=16, kv_bits=16, tp: int = 1, *, act_bits=16,
                    slowdown: float = 0.02, **settings) -> float:
    """The lowest core clock at which a decode step is at most `slowdown` slower than at the top clock.

    Decode waits on memory, so the core can drop until its compute time catches up with the memory time.
    """
    hw = hardware(hw)
    freqs = hw.vf.grid(128)
    bits = dict(weight_bits=weight_bits, kv_bits=kv_bits, act_bits=act_bits)
    t = _decode_probe(config, hw, context, batch, bits, tp, settings, freqs).time
    ok = t <= t[-1] * (1 + slowdown)
    return float(freqs[np.argmax(ok)])


def power_cap(config, hw, prompt_len: int, reply_len: int, cap_w: float, batch: int = 1, weight_bits=16, kv_bits=16,
              tp: int = 1, *, act_bits=16, **settings) -> dict:
    """Per phase, the highest core clock whose power (per device) stays under `cap_w`, and the times it gives.

    Returns {"prefill": {...}, "decode": {...}}, each with mhz, watts and the time uncapped and capped.
    """
    hw = hardware(hw)
    if not (isinstance(cap_w, (int, float)) and cap_w > 0):
        raise ValueError(f"cap_w must be a positive number of watts, got {cap_w!r}")
    freqs = hw.vf.grid(256)[:, None]
    bits = dict(weight_bits=weight_bits, kv_bits=kv_bits, act_bits=act_bits)
    timing = {k: v for k, v in settings.items() if k in ("compute_eff", "mem_eff")}
    precision = precision_for(weight_bits, act_bits)
    works = {"prefill": prefill_work(config, [prompt_len], batch, tp=tp, **bits),
             "decode": decode_work(config, [prompt_len + reply_len // 2], batch, tp=tp, **bits)}
    out = {}
    for phase, work in works.items():
        pt = phase_time(work, hw, core_mhz=freqs, tp=tp, **bits, **timing)
        v = np.asarray(hw.vf.voltage(freqs[:, 0])) / hw.vf.vmax
        dyn = pt.flops[..., 0] * hw.e_op(precision) * v**2
        bits_j = sum(pt.level_bytes[k][..., 0] * 8 * hw.e_bit(k) for k in ("onchip", "dram", "offload"))
        watts = (dyn + bits_j) / pt.time[:, 0] + awake_power(hw, freqs[:, 0])
        fits = watts <= cap_w
        i = int(np.nonzero(fits)[0][-1]) if fits.any() else 0
        out[phase] = {"mhz": float(freqs[i, 0]), "watts": float(watts[i]), "watts_uncapped": float(watts[-1]),
                      "time_uncapped": float(pt.time[-1, 0]), "time_capped": float(pt.time[i, 0]),
                      "slowdown": float(pt.time[i, 0] / pt.time[-1, 0])}
    return out


def clock_sweep(config, hw, prompt_len: int, context: int, domain: str = "core", n: int = 48, batch: int = 1,
                weight_bits=16, kv_bits=16, act_bits=16, tp: int = 1, **settings) -> dict:
    """Prefill (of prompt_len tokens) and one decode step (at `context`) vs one clock, the other at its top.

    domain "core" sweeps the V-f table; "mem" sweeps the memory clock (from its lowest level, or a quarter of
    the top where the profile lists one level). Returns MHz, seconds and joules per phase (all devices).
    """
    from labkit.power.energy import phase_energy

    hw = hardware(hw)
    if domain not in ("core", "mem"):
        raise ValueError(f"domain must be 'core' or 'mem', got {domain!r}")
    if domain == "core":
        freqs = hw.vf.grid(n)
    else:
        lo = hw.mem_mhz[0] if len(hw.mem_mhz) > 1 else hw.fmax_mem / 4
        freqs = np.linspace(lo, hw.fmax_mem, n)
    col = freqs[:, None]
    clocks = {"core_mhz": col} if domain == "core" else {"mem_mhz": col}
    bits = dict(weight_bits=weight_bits, kv_bits=kv_bits, act_bits=act_bits)
    timing = {k: v for k, v in settings.items() if k in ("compute_eff", "mem_eff")}
    sram = settings.get("kv_sram_mb", 0.0) * 2**20
    precision = precision_for(weight_bits, act_bits)
    out = {"mhz": freqs, "domain": domain}
    for phase, work in (("prefill", prefill_work(config, [prompt_len], batch, tp=tp, **bits)),
                        ("decode", decode_work(config, [context], batch, tp=tp, **bits))):
        pt = phase_time(work, hw, tp=tp, sram_kv_bytes=sram, **clocks, **bits, **timing)
        en = phase_energy(hw, pt, precision, devices=tp, **clocks)
        out[f"{phase}_s"] = np.asarray(pt.time)[:, 0]
        out[f"{phase}_j"] = np.asarray(en.joules)[:, 0]
    return out
