"""On-device power: the energy of one reply, monolithic vs the two-stage split.

    tl = labkit.power.simulate(config, "phone-sd8gen3", prompt_len=64, reply_len=24,
                               mode="split", switch="dvfs", weight_bits=4, act_bits=8)
    tl.t, tl.watts            # power segments over time (plot with line_shape="hv")
    tl.by_phase               # joules: prefill, switch, decode, tail
    tl.by_component           # joules: compute, onchip, dram, offload (memory levels), static, clock, base

The split runs the prefill burst at the top DVFS level, switches, and decodes at a low level.
Splitting pays only for replies longer than n* = E_switch / (t_hi*P_hi - t_lo*P_lo).
This module gathers the pieces:
  - `labkit.power.energy`: bottom-up energy of a phase (ops x e_op(V^2) + bits x e_bit(level) + awake power x time);
  - `labkit.power.governor`: the lowest "free" decode clock, clocks under a power cap;
  - `labkit.power.switching`: what a switch costs (DVFS step, power-collapse, engine hand-off) and n*;
  - `labkit.power.timeline`: the simulation of one reply;
  - `labkit.power.kvpressure`: KV placement on chip, spill, swap vs recompute.
"""
from __future__ import annotations

from labkit.power.energy import COMPONENTS, awake_power, phase_energy, request_energy
from labkit.power.governor import free_decode_mhz, power_cap
from labkit.power.switching import SWITCHES, SwitchCost, breakeven_tokens, switch_cost
from labkit.power.timeline import Timeline, energy_vs_reply_len, simulate

__all__ = ["simulate", "Timeline", "energy_vs_reply_len", "breakeven_tokens", "switch_cost", "SwitchCost", "SWITCHES",
           "free_decode_mhz", "power_cap", "request_energy", "phase_energy", "awake_power", "COMPONENTS"]
