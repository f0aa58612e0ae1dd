"""Two clock domains and the power states of a chip: what a DVFS governor can set.

A core voltage-frequency table (the Linux "OPP table") says which voltage each core
clock needs. Dynamic power follows the Linux Energy Model, P = C * V^2 * f, so one
step down the table saves more than its share of power. The memory clock is a
second domain: it sets DRAM bandwidth (decode time) and leaves the core alone.

    >>> vf = VFTable([(1200, 0.675), (1800, 0.85), (2400, 1.0)])
    >>> round(vf.voltage(1500), 4)
    0.7625
    >>> round(vf.dynamic_scale(1200), 3)     # (V/Vmax)^2 * f/fmax at the bottom level
    0.228

Sources: torvalds/linux rk3588-opp.dtsi (a real V-f table), sm8650.dtsi (idle states).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["VFTable", "PowerState", "leakage_scale", "LEAK_SLOPE_V"]

# Leakage current grows roughly exponentially with voltage: I ~ exp((V - Vmax) / v_s).
# v_s = 0.15 V (assumed) makes leakage drop ~10x over the 0.35 V range of a typical table.
LEAK_SLOPE_V = 0.15


def _finite_positive(name: str, value) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return x


class VFTable:
    """A core voltage-frequency table: strictly increasing MHz, non-decreasing volts.

    `voltage(f)` interpolates linearly between the listed points (a governor with fine
    steps; GPUs move in ~15 MHz steps), and clamps below the first point: a chip cannot
    run below its minimum voltage.
    """

    def __init__(self, points):
        pts = [(float(f), float(v)) for f, v in points]
        if not pts:
            raise ValueError("core_vf must list at least one (MHz, V) point, got []")
        for f, v in pts:
            _finite_positive("core_vf frequency (MHz)", f)
            _finite_positive("core_vf voltage (V)", v)
        freqs = [f for f, _ in pts]
        volts = [v for _, v in pts]
        for i in range(1, len(pts)):
            if freqs[i] <= freqs[i - 1]:
                raise ValueError(
                    f"core_vf frequencies must be strictly increasing, got {freqs[i - 1]:g} MHz then {freqs[i]:g} MHz "
                    f"(table {pts})"
                )
            if volts[i] < volts[i - 1]:
                raise ValueError(
                    f"core_vf voltages must not decrease as the frequency rises, got {volts[i - 1]:g} V at "
                    f"{freqs[i - 1]:g} MHz then {volts[i]:g} V at {freqs[i]:g} MHz; a higher clock needs at least the same voltage"
                )
        self.freqs = np.array(freqs)
        self.volts = np.array(volts)

    @property
    def fmax(self) -> float:
        return float(self.freqs[-1])

    @property
    def fmin(self) -> float:
        return float(self.freqs[0])

    @property
    def vmax(self) -> float:
        return float(self.volts[-1])

    def points(self) -> list[tuple[float, float]]:
        return list(zip(self.freqs.tolist(), self.volts.tolist()))

    def check_freq(self, mhz, name: str = "core_mhz"):
        f = np.asarray(mhz, dtype=float)
        if not np.all(np.isfinite(f)) or np.any(f <= 0):
            raise ValueError(f"{name} must be a positive frequency in MHz, got {mhz!r}")
        if np.any(f > self.fmax * (1 + 1e-9)):
            raise ValueError(f"{name} must be at most the top of the V-f table ({self.fmax:g} MHz), got {mhz!r}")
        return f

    def voltage(self, mhz):
        """Voltage needed at `mhz` (array or scalar)."""
        f = self.check_freq(mhz)
        return np.interp(f, self.freqs, self.volts) if f.ndim else float(np.interp(f, self.freqs, self.volts))

    def dynamic_scale(self, mhz):
        """(V/Vmax)^2 * (f/fmax): dynamic power relative to the top level at the same activity."""
        v = np.asarray(self.voltage(mhz)) / self.vmax
        out = v**2 * np.asarray(mhz, dtype=float) / self.fmax
        return out if out.ndim else float(out)

    def grid(self, n: int = 64) -> np.ndarray:
        """`n` evenly spaced frequencies from the bottom to the top of the table, for sweeps."""
        if len(self.freqs) == 1:
            return self.freqs.copy()
        return np.linspace(self.fmin, self.fmax, n)

    def __repr__(self) -> str:
        return f"VFTable({self.points()})"


def leakage_scale(volts, vmax: float, slope_v: float = LEAK_SLOPE_V):
    """Static power relative to the top voltage: (V/Vmax) * exp((V - Vmax)/v_s)  (P = V * I_leak(V))."""
    v = np.asarray(volts, dtype=float)
    out = (v / vmax) * np.exp((v - vmax) / slope_v)
    return out if out.ndim else float(out)


@dataclass(frozen=True)
class PowerState:
    """An idle state: entering and leaving it take time; it pays only below `min_residency_us` of idle.

    The Linux cpuidle rule: enter the state only if the expected idle time exceeds
    `min_residency_us`; that number *is* the break-even time of the state.
    """

    name: str
    entry_us: float
    exit_us: float
    min_residency_us: float
    power_w: float

    def __post_init__(self):
        for field in ("entry_us", "exit_us", "min_residency_us", "power_w"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"power state {self.name!r}: {field} must be a number >= 0, got {value!r}")

    @property
    def round_trip_s(self) -> float:
        return (self.entry_us + self.exit_us) * 1e-6
