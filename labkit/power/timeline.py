"""A timeline of one reply's power: monolithic vs the two-stage split.

    prefill burst (top level) -> switch -> decode loop (low level) -> hold (governor hysteresis) -> idle

`simulate` returns the power segments, the token times (a switch that is not hidden behind the
prefill shows up as a stall before the second token) and the energy by phase and by component.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from labkit.power.switching import SwitchCost

__all__ = ["Timeline", "simulate", "energy_vs_reply_len"]


@dataclass
class Timeline:
    """A reply as power segments: segment i runs from t[i] to t[i+1] at watts[i] (all devices)."""

    t: np.ndarray
    watts: np.ndarray
    phase: np.ndarray
    token_times: np.ndarray
    by_phase: dict
    by_component: dict
    mode: str
    switch: SwitchCost | None = None
    levels: dict = field(default_factory=dict)

    @property
    def energy_j(self) -> float:
        return float(np.sum(self.watts * np.diff(self.t)))

    @property
    def ttft_s(self) -> float:
        return float(self.token_times[0])

    @property
    def reply_s(self) -> float:
        return float(self.token_times[-1])

    @property
    def itl_s(self) -> np.ndarray:
        return np.diff(self.token_times)

    def step_xy(self):
        """x, y arrays for a step plot (plotly line_shape='hv')."""
        return self.t, np.append(self.watts, self.watts[-1])


def _segments_to_timeline(segs, token_times, mode, sw, levels) -> Timeline:
    durations = np.array([s[0] for s in segs], dtype=float)
    watts = np.array([s[1] for s in segs], dtype=float)
    t = np.concatenate([[0.0], np.cumsum(durations)])
    return Timeline(t=t, watts=watts, phase=np.array([s[2] for s in segs]), token_times=token_times,
                    by_phase={}, by_component={}, mode=mode, switch=sw, levels=levels)


def simulate(config, hw, prompt_len: int, reply_len: int, *, mode: str = "split", switch: str = "dvfs", batch: int = 1,
             weight_bits=16, kv_bits=16, act_bits=16, tp: int = 1, prefill_mhz=None, decode_mhz="auto", mem_mhz=None,
             decode_mem_mhz=None, overlap_switch: bool = False, wake: str | None = None, hold_ms=None,
             idle_s: float = 0.1, **settings) -> Timeline:
    """Simulate one reply's power over time.

    mode: "split" (prefill at prefill_mhz, switch, decode at decode_mhz; "auto" = the lowest clock that keeps
    decode within 2 % of its top speed) or "monolithic" (everything at prefill_mhz). switch: one of
    `labkit.power.switching.SWITCHES`. overlap_switch: start the switch during the prefill (pre-wake) so decode does
    not stall. wake: an idle-state name to wake from before the prefill (adds its exit latency to TTFT).
    hold_ms: how long the last level stays awake after the reply (default: the profile's hysteresis).
    Other keywords go to `labkit.costmodel.estimate`.
    """
    from labkit.power.energy import awake_parts, request_energy
    from labkit.power.governor import free_decode_mhz
    from labkit.costmodel.profiles import hardware
    from labkit.power.switching import switch_cost
    from labkit.costmodel.workload import check_lengths

    hw = hardware(hw)
    if mode not in ("split", "monolithic"):
        raise ValueError(f"mode must be 'split' or 'monolithic', got {mode!r}")
    check_lengths(prompt_len=(prompt_len, 1), reply_len=(reply_len, 1))
    if not (isinstance(idle_s, (int, float)) and idle_s >= 0):
        raise ValueError(f"idle_s must be a number of seconds >= 0, got {idle_s!r}")
    bits = dict(weight_bits=weight_bits, kv_bits=kv_bits)
    if mode == "monolithic":
        decode_mhz, decode_mem_mhz = prefill_mhz, mem_mhz
    elif isinstance(decode_mhz, str):
        if decode_mhz != "auto":
            raise ValueError(f"decode_mhz must be a frequency in MHz, None or 'auto', got {decode_mhz!r}")
        decode_mhz = free_decode_mhz(config, hw, prompt_len + reply_len // 2, batch, tp=tp, act_bits=act_bits, **bits, **settings)
    req = request_energy(config, hw, prompt_len, reply_len, batch, tp=tp, act_bits=act_bits, prefill_mhz=prefill_mhz,
                         decode_mhz=decode_mhz, mem_mhz=mem_mhz, decode_mem_mhz=decode_mem_mhz, **bits, **settings)
    segs, by_phase = [], {}
    by_comp = {k: 0.0 for k in req.prefill.parts}

    def add(phase, parts):
        by_phase[phase] = by_phase.get(phase, 0.0) + sum(parts.values())
        for k, v in parts.items():
            by_comp[k] = by_comp.get(k, 0.0) + float(v)

    t0 = 0.0
    if wake is not None:
        if wake not in hw.power_states:
            raise ValueError(f"wake must be one of {sorted(hw.power_states)} for {hw.key}, got {wake!r}")
        t_w = hw.power_states[wake].exit_us * 1e-6
        parts = {k: tp * float(v) * t_w for k, v in awake_parts(hw, prefill_mhz, mem_mhz).items()}
        add("wake", parts)
        segs.append((t_w, sum(parts.values()) / t_w, "wake"))
        t0 = t_w
    t_pf = req.prefill_est.prefill_s
    pf_parts = req.prefill.total()
    add("prefill", pf_parts)
    p_pf = sum(pf_parts.values()) / t_pf
    sw, stall, hidden = None, 0.0, 0.0
    if mode == "split":
        kv_dev = req.prefill_est.kv_bytes_per_token * batch * prompt_len / tp
        sw = switch_cost(hw, switch, kv_dev, mem_eff=settings.get("mem_eff"))
        add("switch", {k: tp * v for k, v in sw.parts.items()})
        p_sw = tp * sw.joules / sw.seconds if sw.seconds > 0 else 0.0
        hidden = min(sw.seconds, t_pf) if overlap_switch else 0.0
        stall = sw.seconds - hidden
    segs.append((t_pf - hidden, p_pf, "prefill"))
    if hidden > 0:
        segs.append((hidden, p_pf + p_sw, "prefill+switch"))
    if stall > 0:
        segs.append((stall, p_sw, "switch"))
    # decode steps, with the prefill engine's hold power during its hysteresis window
    steps_s = req.decode_est.decode_step_s
    n_steps = len(steps_s)
    step_parts = {k: v[:n_steps] for k, v in req.decode.parts.items()}
    step_j = sum(step_parts.values()) if n_steps else np.zeros(0)
    add("decode", {k: float(np.sum(v)) for k, v in step_parts.items()})
    hold_j = np.zeros(n_steps)
    if sw is not None and sw.hold_w > 0 and n_steps:
        starts = np.concatenate([[0.0], np.cumsum(steps_s)[:-1]])
        overlap = np.clip(sw.hold_s - starts, 0.0, steps_s)
        hold_j = tp * sw.hold_w * overlap
        top = awake_parts(hw, None)
        share = float(top["static"]) / (float(top["static"]) + float(top["clock"]))
        add("switch", {"static": share * hold_j.sum(), "clock": (1 - share) * hold_j.sum()})
    for dt, e in zip(steps_s, step_j + hold_j):
        segs.append((float(dt), float(e / dt), "decode"))
    # tail: the last level stays awake for the governor's hold time, then the chip idles
    hold_s = (hw.hysteresis_ms if hold_ms is None else hold_ms) * 1e-3
    if hold_s > 0:
        parts = {k: tp * float(v) * hold_s for k, v in awake_parts(hw, decode_mhz, decode_mem_mhz).items()}
        add("tail", parts)
        segs.append((hold_s, sum(parts.values()) / hold_s, "hold"))
    if idle_s > 0:
        add("tail", {"base": tp * hw.p_idle_w * idle_s})
        segs.append((idle_s, tp * hw.p_idle_w, "idle"))
    first = t0 + t_pf
    token_times = np.concatenate([[first], first + stall + np.cumsum(steps_s)])
    levels = {"prefill_mhz": prefill_mhz or hw.vf.fmax, "decode_mhz": decode_mhz or hw.vf.fmax,
              "decode_mem_mhz": decode_mem_mhz or hw.fmax_mem, "step_s": steps_s, "step_j": step_j,
              "prefill_s": t_pf, "prefill_w": p_pf}
    tl = _segments_to_timeline(segs, token_times, mode, sw, levels)
    tl.by_phase, tl.by_component = by_phase, by_comp
    return tl


def energy_vs_reply_len(config, hw, prompt_len: int, n_max: int, *, switch: str = "dvfs", **kwargs) -> dict:
    """Energy of a reply of n = 1..n_max tokens, monolithic vs split, from one simulation of each.

    Returns n, the two energy curves, the break-even n* by the formula, and the first n where the split
    is cheaper in the simulation (which also counts the cheaper idle tail of the low level).
    """
    from labkit.power.switching import breakeven_tokens

    mono = simulate(config, hw, prompt_len, n_max, mode="monolithic", **kwargs)
    split = simulate(config, hw, prompt_len, n_max, mode="split", switch=switch, **kwargs)

    def curve(tl):
        seg_j = tl.watts * np.diff(tl.t)
        dec = tl.phase == "decode"
        first_dec = np.argmax(dec) if dec.any() else len(seg_j)
        before = seg_j[:first_dec].sum()
        tail = seg_j[np.isin(tl.phase, ("hold", "idle"))].sum()
        return before + np.concatenate([[0.0], np.cumsum(seg_j[dec])]) + tail

    e_mono, e_split = curve(mono), curve(split)
    n = np.arange(1, n_max + 1)
    if n_max > 1:
        tp = kwargs.get("tp", 1)
        n_star = breakeven_tokens(split.switch.total_j * tp, mono.levels["step_s"][0], mono.levels["step_j"][0] / mono.levels["step_s"][0],
                                  split.levels["step_s"][0], split.levels["step_j"][0] / split.levels["step_s"][0])
    else:
        n_star = float("nan")
    cheaper = np.nonzero(e_split < e_mono)[0]
    return {"n": n, "monolithic_j": e_mono, "split_j": e_split, "n_star": n_star,
            "n_cross": int(n[cheaper[0]]) if len(cheaper) else None, "switch": split.switch,
            "monolithic": mono, "split": split}
