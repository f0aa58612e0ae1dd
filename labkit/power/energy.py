"""Bottom-up energy of a phase: operations, bits moved per memory level, and power paid for time.

    E = FLOPs * e_op * (V/Vmax)^2                         arithmetic (CV^2 per switching event)
      + sum over levels of bits * e_bit(level)            on-chip SRAM, DRAM, offload
      + (p_static * leak(V) + p_clock * (V/Vmax)^2 * f/fmax + p_base + p_mem_bg * f_mem/fmax_mem) * t
The last line is what an awake chip burns whether or not it computes: leakage, running clocks
(the Linux Energy Model's C V^2 f), always-on logic and memory background. Decode energy is
mostly DRAM bits and awake time; prefill energy is mostly arithmetic.

Sources: Horowitz (ISSCC 2014) for the per-op vs per-bit ratios; the Linux Energy Model
(P = C V^2 f); SplitwiseSim's per-phase GPU powers to calibrate e_op (see data/hardware.yaml).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labkit.costmodel.estimator import Estimate, estimate
from labkit.costmodel.dvfs import leakage_scale
from labkit.costmodel.profiles import hardware, precision_for

__all__ = ["PhaseEnergy", "RequestEnergy", "COMPONENTS", "awake_power", "awake_parts", "phase_energy", "request_energy"]

COMPONENTS = ("compute", "onchip", "dram", "offload", "static", "clock", "base")


def _v_f(hw, core_mhz):
    f = hw.vf.fmax if core_mhz is None else np.asarray(core_mhz, dtype=float)
    v = np.asarray(hw.vf.voltage(f), dtype=float)
    return v / hw.vf.vmax, f / hw.vf.fmax


def awake_parts(hw, core_mhz=None, mem_mhz=None) -> dict:
    """Watts an awake chip draws with no work done, by component: static, clock, base (incl. memory background)."""
    hw = hardware(hw)
    v, f = _v_f(hw, core_mhz)
    m = 1.0 if mem_mhz is None else np.asarray(mem_mhz, dtype=float) / hw.fmax_mem
    return {
        "static": hw.p_static_w * leakage_scale(v, 1.0),
        "clock": hw.p_clock_w * v**2 * f,
        "base": hw.p_base_w + hw.p_mem_bg_w * m,
    }


def awake_power(hw, core_mhz=None, mem_mhz=None):
    """Total watts of an awake, stalled chip at a core clock and a memory clock."""
    return sum(awake_parts(hw, core_mhz, mem_mhz).values())


@dataclass
class PhaseEnergy:
    """Joules by component (arrays over the steps of a phase) and the time they took."""

    time: np.ndarray
    parts: dict

    @property
    def joules(self):
        return sum(self.parts.values())

    @property
    def watts(self):
        return self.joules / self.time

    def total(self) -> dict:
        return {k: float(np.sum(v)) for k, v in self.parts.items()}


def phase_energy(hw, phase, precision: str = "fp16", core_mhz=None, mem_mhz=None, devices: int = 1) -> PhaseEnergy:
    """Energy of a `labkit.costmodel.roofline.PhaseTime` at one operating point, summed over `devices`."""
    hw = hardware(hw)
    v, _ = _v_f(hw, core_mhz)
    t = np.asarray(phase.time, dtype=float)
    parts = {"compute": phase.flops * hw.e_op(precision) * v**2}
    for level in ("onchip", "dram", "offload"):
        parts[level] = phase.level_bytes[level] * 8 * hw.e_bit(level)
    for name, watts in awake_parts(hw, core_mhz, mem_mhz).items():
        parts[name] = watts * t
    parts = {k: devices * (np.asarray(val, dtype=float) + 0 * t) for k, val in parts.items()}
    return PhaseEnergy(time=t, parts=parts)


@dataclass
class RequestEnergy:
    """Time and energy of one request (all devices). `decode` holds one entry per decode step."""

    prefill_est: Estimate
    decode_est: Estimate
    prefill: PhaseEnergy
    decode: PhaseEnergy
    devices: int

    @property
    def prefill_j(self) -> float:
        return float(np.sum(self.prefill.joules))

    @property
    def decode_j(self) -> float:
        return float(np.sum(self.decode.joules[: len(self.decode_est.decode_step_s)]))

    @property
    def energy_j(self) -> float:
        return self.prefill_j + self.decode_j

    @property
    def joules_per_token(self) -> float:
        """Energy of the whole request per output token (prefill included)."""
        return self.energy_j / (self.decode_est.reply_len * self.decode_est.batch)

    @property
    def prefill_w(self) -> float:
        return float(np.sum(self.prefill.joules) / self.prefill_est.prefill_s)

    @property
    def decode_w(self) -> float:
        return float(np.mean(self.decode.watts))

    def by_component(self) -> dict:
        p, d = self.prefill.total(), self.decode.total()
        return {k: p[k] + d[k] for k in p}


def request_energy(config, hw, prompt_len: int, reply_len: int, batch: int = 1, weight_bits=16, kv_bits=16, tp: int = 1,
                   *, act_bits=16, prefill_mhz=None, decode_mhz=None, mem_mhz=None, decode_mem_mhz=None,
                   **settings) -> RequestEnergy:
    """Time and energy of a request, prefill at (prefill_mhz, mem_mhz) and decode at (decode_mhz, decode_mem_mhz).

    Clocks default to the top of each table; `decode_mem_mhz` defaults to `mem_mhz`. Other keywords go to
    `labkit.costmodel.estimate` (compute_eff, mem_eff, kv_sram_mb, weight_group, kv_group).
    """
    hw = hardware(hw)
    decode_mem_mhz = mem_mhz if decode_mem_mhz is None else decode_mem_mhz
    args = (config, hw, prompt_len, reply_len, batch, weight_bits, kv_bits, tp)
    pre_est = estimate(*args, act_bits=act_bits, core_mhz=prefill_mhz, mem_mhz=mem_mhz, **settings)
    same = (decode_mhz == prefill_mhz) and (decode_mem_mhz == mem_mhz)
    dec_est = pre_est if same else estimate(*args, act_bits=act_bits, core_mhz=decode_mhz, mem_mhz=decode_mem_mhz, **settings)
    precision = precision_for(weight_bits, act_bits)
    pre = phase_energy(hw, pre_est.prefill, precision, prefill_mhz, mem_mhz, devices=tp)
    dec = phase_energy(hw, dec_est.decode, precision, decode_mhz, decode_mem_mhz, devices=tp)
    return RequestEnergy(prefill_est=pre_est, decode_est=dec_est, prefill=pre, decode=dec, devices=tp)
