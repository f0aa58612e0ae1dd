"""The switch between the two stages, and the reply length at which switching pays.

    >>> breakeven_tokens(e_switch=0.03, t_hi=0.05, p_hi=6.0, t_lo=0.05, p_lo=3.5)   # a 5 ms wake at 6 W
    0.24

Mechanisms (`SWITCHES`):
  - "dvfs": one step of the clock (~40 us of PLL relock, rk3588-opp.dtsi clock-latency-ns);
  - "collapse": the compute cluster power-collapses and wakes (entry + exit latency of its
    deepest idle state, sm8650.dtsi), paid at awake power;
  - "handoff": decode moves to another engine: copy the KV cache (read + write in DRAM), load the
    engine's graph, and the prefill engine keeps its performance vote (clocks and leakage) for the
    runtime's hysteresis (Qualcomm burst mode: 300 ms) while decode already runs.
There is no public figure for NPU wake-up energy; it is modelled as awake power x latency.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labkit.power.energy import awake_parts
from labkit.costmodel.profiles import hardware

__all__ = ["SWITCHES", "SwitchCost", "switch_cost", "breakeven_tokens"]

SWITCHES = ("dvfs", "collapse", "handoff")


@dataclass
class SwitchCost:
    """What one switch between the stages costs: its duration, its energy, and a power held afterwards."""

    mechanism: str
    seconds: float
    joules: float
    parts: dict                 # joules by component
    hold_w: float = 0.0         # extra watts held during the first hold_s of decode (runtime hysteresis)
    hold_s: float = 0.0
    detail: str = ""

    @property
    def total_j(self) -> float:
        return self.joules + self.hold_w * self.hold_s


def _awake_energy(hw, core_mhz, seconds) -> dict:
    return {k: float(v) * seconds for k, v in awake_parts(hw, core_mhz).items()}


def switch_cost(hw, mechanism: str, kv_bytes: float = 0.0, *, state: str | None = None, graph_load_ms=None,
                hysteresis_ms=None, mem_eff=None) -> SwitchCost:
    """The cost of one switch. kv_bytes: the cache to hand over (only 'handoff' copies it)."""
    hw = hardware(hw)
    if mechanism not in SWITCHES:
        raise ValueError(f"mechanism must be one of {SWITCHES}, got {mechanism!r}")
    if mechanism == "dvfs":
        t = hw.dvfs_latency_us * 1e-6
        parts = _awake_energy(hw, None, t)
        return SwitchCost("dvfs", t, sum(parts.values()), parts, detail=f"clock relock {hw.dvfs_latency_us:g} us at the top level")
    if mechanism == "collapse":
        if not hw.power_states:
            raise ValueError(f"mechanism 'collapse' needs power states; {hw.key} lists none")
        name = state or max(hw.power_states, key=lambda n: hw.power_states[n].exit_us)
        if name not in hw.power_states:
            raise ValueError(f"state must be one of {sorted(hw.power_states)}, got {name!r}")
        ps = hw.power_states[name]
        parts = _awake_energy(hw, None, ps.round_trip_s)
        return SwitchCost("collapse", ps.round_trip_s, sum(parts.values()), parts,
                          detail=f"{name}: entry {ps.entry_us:g} us + exit {ps.exit_us:g} us at awake power")
    me = hw.mem_eff if mem_eff is None else mem_eff
    t_copy = 2 * kv_bytes / (hw.mem_bw_gbs * 1e9 * me)          # read + write once
    t_graph = (hw.graph_load_ms if graph_load_ms is None else graph_load_ms) * 1e-3
    parts = _awake_energy(hw, None, t_copy + t_graph)
    parts["dram"] = 2 * kv_bytes * 8 * hw.e_bit("dram")
    hold_s = (hw.hysteresis_ms if hysteresis_ms is None else hysteresis_ms) * 1e-3
    top = awake_parts(hw, None)
    hold_w = float(top["static"] + top["clock"])                 # the prefill engine stays clocked
    return SwitchCost("handoff", t_copy + t_graph, sum(parts.values()), parts, hold_w, hold_s,
                      detail=f"KV copy {kv_bytes / 1e6:.1f} MB ({t_copy * 1e3:.2f} ms) + graph load {t_graph * 1e3:g} ms; "
                             f"prefill engine held {hold_s * 1e3:g} ms")


def breakeven_tokens(e_switch, t_hi, p_hi, t_lo, p_lo):
    """n* = E_switch / (t_hi*P_hi - t_lo*P_lo); infinity where the low level saves nothing per token."""
    gain = np.asarray(t_hi, dtype=float) * p_hi - np.asarray(t_lo, dtype=float) * p_lo
    with np.errstate(divide="ignore", invalid="ignore"):
        n = np.where(gain > 0, np.asarray(e_switch, dtype=float) / np.where(gain > 0, gain, 1.0), np.inf)
    return round(float(n), 6) if n.ndim == 0 else n
