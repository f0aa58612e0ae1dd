"""Figures of chapter 08: power over one reply, energy vs reply length, KV placement, DVFS, swap vs recompute.

    >>> tl = labkit.power.simulate("llama-3.2-3b", "phone-sd8gen3", 64, 24, weight_bits=4, act_bits=8)  # doctest: +SKIP
    >>> power_timeline_figure(tl)                                                                       # doctest: +SKIP
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from labkit.costmodel.profiles import hardware
from labkit.power.kvpressure import kv_sweep, max_context, swap_vs_recompute, tokens_that_fit
from labkit.viz._spec import build

__all__ = ["power_timeline_figure", "power_timeline_spec", "energy_vs_reply_figure", "energy_vs_reply_spec",
           "kv_placement_figure", "kv_placement_spec", "dvfs_figure", "dvfs_spec", "swap_recompute_figure",
           "swap_recompute_spec", "validation_figure", "PHASE_COLORS"]

PHASE_COLORS = {"wake": "#9467bd", "prefill": "#d62728", "prefill+switch": "#ff7f0e", "switch": "#ff7f0e",
                "decode": "#1f77b4", "hold": "#7f7f7f", "idle": "#c7c7c7"}
PART_COLORS = {"compute": "#d62728", "onchip": "#2ca02c", "dram": "#1f77b4", "offload": "#9467bd", "awake": "#bbbbbb"}


def _style(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    fig.update_layout(title=title, height=height, margin=dict(t=60, l=60, r=20, b=50), legend=dict(orientation="h", y=-0.2))
    return fig


def _phase_spans(tl):
    """Merge consecutive segments of the same phase: [(phase, start, end)]."""
    spans = []
    for i, phase in enumerate(tl.phase):
        start, end = float(tl.t[i]), float(tl.t[i + 1])
        if spans and spans[-1][0] == phase:
            spans[-1] = (phase, spans[-1][1], end)
        else:
            spans.append((str(phase), start, end))
    return spans


# --- power over one reply -----------------------------------------------------------------
def power_timeline_spec(split, mono=None) -> dict:
    traces = []
    for tl, name in ((mono, "monolithic (top level throughout)"), (split, "two-stage split")):
        if tl is None:
            traces.append(dict(x=[], y=[], name=name, visible=False))
            continue
        x, y = tl.step_xy()
        traces.append(dict(x=x * 1e3, y=y, name=f"{name}: {tl.energy_j:.3g} J", visible=True))
    shapes = [dict(type="rect", xref="x", yref="paper", x0=s * 1e3, x1=e * 1e3, y0=0, y1=1, line_width=0, layer="below",
                   fillcolor=PHASE_COLORS.get(p, "#eee"), opacity=0.15) for p, s, e in _phase_spans(split)]
    title = f"One reply of {len(split.token_times)} tokens: {split.energy_j:.3g} J split"
    if mono is not None:
        title += f" vs {mono.energy_j:.3g} J monolithic ({split.energy_j / mono.energy_j - 1:+.0%})"
    if split.switch is not None:
        title += f" | switch: {split.switch.mechanism}"
    return {"traces": traces, "title": title, "shapes": shapes}


def power_timeline_figure(split, mono=None) -> go.Figure:
    """Watts vs milliseconds for one reply: the two-stage split (phases shaded) and, if given, monolithic."""
    fig = go.Figure([go.Scatter(mode="lines", line_shape="hv", line=dict(color="#7f7f7f", width=1.5)),
                     go.Scatter(mode="lines", line_shape="hv", line=dict(color="black", width=2))])
    fig.update_xaxes(title="time (ms)")
    fig.update_yaxes(title="power (W)", rangemode="tozero")
    return build(fig, power_timeline_spec(split, mono))


# --- energy vs reply length -----------------------------------------------------------------
def energy_vs_reply_spec(result: dict) -> dict:
    """The split's energy relative to the monolithic reply's, so the crossing at 1 (n*) is visible at any length."""
    n, mono, split = result["n"], result["monolithic_j"], result["split_j"]
    n_star = result["n_star"]
    shown = n_star if np.isfinite(n_star) else n[-1]
    ratio = split / mono
    lo, hi = float(min(ratio.min(), 1.0)), float(max(ratio.max(), 1.0))
    sw = result["switch"]
    star = f"{n_star:.3g}" if np.isfinite(n_star) else "never"
    cross = result.get("n_cross")
    crossed = dict(x=[cross], y=[float(ratio[cross - 1])]) if cross else dict(x=[], y=[])
    seen = f"the simulation crosses 1 at n = {cross}" if cross else f"the simulation never crosses 1 within {n[-1]} tokens"
    return {"traces": [dict(x=n, y=np.ones_like(ratio)), dict(x=n, y=ratio), dict(x=[shown, shown], y=[lo, hi]), crossed],
            "title": f"Switch '{sw.mechanism}' ({sw.total_j * 1e3:.3g} mJ): formula n* = {star} tokens; {seen}"}


def energy_vs_reply_figure(result: dict) -> go.Figure:
    """The split reply's energy / the monolithic reply's vs reply length (from `labkit.power.energy_vs_reply_len`).

    Below 1 the split saves energy. The formula's n* is marked, and so is the first length at
    which the simulation (which also counts the low level's cheaper idle tail) is cheaper; the
    two differ by that tail. Plotted as a ratio because on an energy axis every short reply sits
    near 0 J and the crossing cannot be seen.
    """
    fig = go.Figure([go.Scatter(mode="lines", name="monolithic (= 1)", line=dict(color="#7f7f7f", dash="dash")),
                     go.Scatter(mode="lines", name="two-stage split / monolithic", line=dict(color="black")),
                     go.Scatter(mode="lines", line=dict(color="#d62728", dash="dot"), name="n* = E_switch / (t_hi P_hi - t_lo P_lo)"),
                     go.Scatter(mode="markers", marker=dict(color="#d62728", size=9), name="simulated crossing (idle tail included)")])
    fig.update_xaxes(title="reply length (tokens)", type="log")
    fig.update_yaxes(title="energy of the split reply / monolithic")
    return build(fig, energy_vs_reply_spec(result))


# --- KV placement and spill -----------------------------------------------------------------
_PARTS = ("compute", "onchip", "dram", "offload", "awake")


def kv_placement_spec(config, hw, kv_sram_mb: float = 8.0, contexts=None, batch: int = 1, weight_bits=16,
                      kv_bits=16, act_bits=16) -> dict:
    hw = hardware(hw)
    ctx = np.unique(np.round(np.logspace(1, np.log10(131072), 80)).astype(int)) if contexts is None else np.asarray(contexts)
    r = kv_sweep(config, hw, ctx, kv_sram_mb, batch, weight_bits, kv_bits, act_bits=act_bits)
    parts = dict(r["parts"])
    parts["awake"] = parts.pop("static") + parts.pop("clock") + parts.pop("base")
    fit = max(tokens_that_fit(config, kv_sram_mb, kv_bits, batch), 1)
    spill = max(max_context(config, hw, batch, weight_bits, kv_bits), 1)
    traces = [dict(x=ctx, y=parts[name] * 1e3) for name in _PARTS] + [dict(x=ctx, y=r["onchip_fraction"])]
    shapes = [dict(type="line", xref="x", yref="paper", x0=x, x1=x, y0=0, y1=1, line=dict(dash="dash", color=c))
              for x, c in ((fit, "#2ca02c"), (spill, "#9467bd"))]
    return {"traces": traces, "shapes": shapes,
            "title": f"{hw.name}: {kv_sram_mb:g} MB of SRAM holds {fit:,} tokens of KV; DRAM is full at {spill:,} tokens"}


def kv_placement_figure(config, hw, kv_sram_mb: float = 8.0, contexts=None, batch: int = 1, weight_bits=16,
                        kv_bits=16, act_bits=16) -> go.Figure:
    """Energy per decode token vs context, by where it goes, with `kv_sram_mb` of SRAM holding the newest KV."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for name in _PARTS:
        fig.add_trace(go.Scatter(mode="lines", stackgroup="e", name=name, line=dict(width=0.5, color=PART_COLORS[name])),
                      secondary_y=False)
    fig.add_trace(go.Scatter(mode="lines", name="share of the KV on chip", line=dict(color="black", dash="dot")), secondary_y=True)
    fig.update_xaxes(type="log", title="context (tokens in the KV cache)")
    fig.update_yaxes(title="mJ per decode token", secondary_y=False)
    fig.update_yaxes(title="on-chip share", range=[0, 1.05], dtick=0.25, tickformat=".0%", showgrid=False, secondary_y=True)
    return build(fig, kv_placement_spec(config, hw, kv_sram_mb, contexts, batch, weight_bits, kv_bits, act_bits))


# --- two clock domains -------------------------------------------------------------------------
_DVFS = {"prefill_s": ("prefill time", "#d62728", "dot"), "prefill_j": ("prefill energy", "#d62728", "solid"),
         "decode_s": ("decode time", "#1f77b4", "dot"), "decode_j": ("decode energy", "#1f77b4", "solid")}


def dvfs_spec(config, hw, prompt_len: int = 128, context: int = 256, batch: int = 1, weight_bits=16, kv_bits=16,
              act_bits=16, core_mhz=None, mem_mhz=None) -> dict:
    from labkit.power.governor import clock_sweep

    hw = hardware(hw)
    traces = []
    for domain in ("core", "mem"):
        r = clock_sweep(config, hw, prompt_len, context, domain, batch=batch, weight_bits=weight_bits, kv_bits=kv_bits,
                        act_bits=act_bits)
        traces += [dict(x=r["mhz"], y=r[key] / r[key][-1]) for key in _DVFS]
    shapes = [dict(type="line", xref=ax, yref="paper", x0=f, x1=f, y0=0, y1=1, line=dict(color="#2ca02c", dash="dash"))
              for ax, f in (("x", core_mhz), ("x2", mem_mhz)) if f is not None]
    return {"traces": traces, "shapes": shapes,
            "title": f"{hw.name}: lowering the core clock is free for decode; lowering the memory clock is not"}


def dvfs_figure(config, hw, prompt_len: int = 128, context: int = 256, batch: int = 1, weight_bits=16, kv_bits=16,
                act_bits=16, core_mhz=None, mem_mhz=None) -> go.Figure:
    """Time and energy of prefill and of a decode step vs the core clock (left) and the memory clock (right)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("core clock (V-f table)", "memory clock"))
    for col in (1, 2):
        for name, color, dash in _DVFS.values():
            fig.add_trace(go.Scatter(mode="lines", name=name, legendgroup=name, showlegend=col == 1,
                                     line=dict(color=color, dash=dash)), row=1, col=col)
        fig.update_xaxes(title="MHz", row=1, col=col)
        fig.update_yaxes(type="log", row=1, col=col)
    fig.update_yaxes(title="relative to the top clock", row=1, col=1)
    return build(fig, dvfs_spec(config, hw, prompt_len, context, batch, weight_bits, kv_bits, act_bits, core_mhz, mem_mhz), 440)


# --- swap vs recompute ---------------------------------------------------------------------------
def swap_recompute_spec(config, hw, n_max: int = 4096, batch: int = 1, weight_bits=16, kv_bits=16, act_bits=16) -> dict:
    hw = hardware(hw)
    n = np.unique(np.round(np.logspace(0, np.log10(n_max), 60)).astype(int))
    r = swap_vs_recompute(config, hw, n, batch, weight_bits, kv_bits, act_bits=act_bits)
    traces = [dict(x=n, y=r[f"{what}_{unit}"]) for unit in ("s", "j") for what in ("swap", "recompute")]
    winner = "swap" if np.all(r["faster"] == "swap") else "recompute" if np.all(r["faster"] == "recompute") else "it depends on n"
    return {"traces": traces,
            "title": f"{hw.name}, {hw.offload_name} at {hw.offload_bw_gbs:.3g} GB/s: the faster way back is {winner}"}


def swap_recompute_figure(config, hw, n_max: int = 4096, batch: int = 1, weight_bits=16, kv_bits=16, act_bits=16) -> go.Figure:
    """Time and energy to bring back the KV of n evicted tokens: swap over the offload link vs recompute."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time (s)", "energy (J)"))
    for col in (1, 2):
        for what, color in (("swap", "#9467bd"), ("recompute", "#d62728")):
            fig.add_trace(go.Scatter(mode="lines", name=what, legendgroup=what, showlegend=col == 1, line=dict(color=color)),
                          row=1, col=col)
        fig.update_xaxes(type="log", title="evicted tokens", row=1, col=col)
        fig.update_yaxes(type="log", row=1, col=col)
    return build(fig, swap_recompute_spec(config, hw, n_max, batch, weight_bits, kv_bits, act_bits), 400)


def validation_figure(checks) -> go.Figure:
    """Model error against each published target, with the +/-30 % band."""
    labels = [c.target.label for c in checks][::-1]
    errors = [c.error * 100 for c in checks][::-1]
    colors = ["#2ca02c" if c.ok else "#d62728" for c in checks][::-1]
    fig = go.Figure(go.Bar(x=errors, y=labels, orientation="h", marker_color=colors,
                           text=[f"{e:+.0f} %" for e in errors], textposition="outside"))
    fig.update_layout(shapes=[dict(type="rect", xref="x", yref="paper", x0=-30, x1=30, y0=0, y1=1, line_width=0,
                                   fillcolor="#2ca02c", opacity=0.08, layer="below")])
    fig.update_xaxes(title="model error (%)", range=[-60, 60], zeroline=True)
    return _style(fig, "The model against published numbers (band: +/-30 %)", 140 + 32 * len(checks))
