"""Figures of chapter 03, the measured half: TTFT vs prompt length, ITL vs position, one reply's time.

The inputs are measurements of this machine (`labkit.generation.latency`): rows of `ttft_sweep`
and `itl_sweep`.

    >>> fig = ttft_itl_figure(ttft_rows, itl_rows)                      # doctest: +SKIP
    >>> fig = reply_time_figure(ttft_rows, itl_rows, prompt_len=512, reply_len=64)   # doctest: +SKIP
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from labkit.generation.latency import reply_estimate

__all__ = ["ttft_itl_figure", "reply_time_figure", "step_split_figure", "pass_cost_figure"]

_SPLIT = (("matmul_ms", "weight products", "#2a6fbb"), ("other_ms", "other operators", "#e8a33d"),
          ("outside_ms", "between them (Python, dispatch)", "#9a9a9a"))


def ttft_itl_figure(ttft_rows, itl_rows, modelled=None) -> go.Figure:
    """Left: TTFT (ms) vs prompt length. Right: ITL (ms) vs position in the sequence.

    `modelled`: (ttft rows, itl rows) of the same shape from the cost model
    (`labkit.costmodel.estimator.sweep_estimates`), or {label: (ttft rows, itl rows)} for up to three
    models (e.g. the roofline at the machine's peaks and the one calibrated on the model's products),
    drawn dashed beside the measurements.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT grows with the prompt (prefill)",
                                                        "ITL barely moves with the position (decode)"))
    p = [r["prompt_len"] for r in ttft_rows]
    fig.add_trace(go.Scatter(x=p, y=[r["ttft_s"] * 1e3 for r in ttft_rows], mode="lines+markers", name="measured",
                             line=dict(color="#1f77b4"),
                             text=[f"{n / r['ttft_s']:.0f} tokens/s" for n, r in zip(p, ttft_rows)]), row=1, col=1)
    fig.add_trace(go.Scatter(x=[r["position"] for r in itl_rows], y=[r["itl_s"] * 1e3 for r in itl_rows],
                             mode="lines+markers", name="measured", line=dict(color="#1f77b4"), showlegend=False,
                             text=[f"{1 / r['itl_s']:.1f} tokens/s" for r in itl_rows]), row=1, col=2)
    if modelled is not None and not isinstance(modelled, dict):
        modelled = {"cost model (roofline)": modelled}
    styles = [dict(color="#7f7f7f", dash="dot"), dict(color="#2ca02c", dash="dash"), dict(color="#9467bd", dash="dashdot")]
    for (label, (m_ttft, m_itl)), line in zip((modelled or {}).items(), styles):
        fig.add_trace(go.Scatter(x=[r["prompt_len"] for r in m_ttft], y=[r["ttft_s"] * 1e3 for r in m_ttft],
                                 mode="lines+markers", name=label, legendgroup=label, line=line), row=1, col=1)
        fig.add_trace(go.Scatter(x=[r["position"] for r in m_itl], y=[r["itl_s"] * 1e3 for r in m_itl],
                                 mode="lines+markers", name=label, legendgroup=label, showlegend=False, line=line),
                      row=1, col=2)
    fig.update_xaxes(title_text="prompt length (tokens)", type="log", dtick="D2", row=1, col=1)
    fig.update_xaxes(title_text="position of the decoded token", type="log", dtick="D2", row=1, col=2)
    fig.update_yaxes(title_text="ms", type="log", dtick="D2", row=1, col=1)
    fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=2)
    fig.update_layout(height=420, margin=dict(t=60, l=60, r=20, b=50), showlegend=modelled is not None,
                      legend=dict(orientation="h", y=-0.25), title="Measured on this machine" + (", next to the cost model" if modelled else ""))
    return fig


def reply_time_figure(ttft_rows, itl_rows, prompt_len: int, reply_len: int, measured: dict | None = None) -> go.Figure:
    """One reply's time split into prefill and decode, from the measured sweeps; `measured`
    ({ttft_s, decode_s}, e.g. from a live run) is drawn beside the estimate."""
    est = reply_estimate(ttft_rows, itl_rows, prompt_len, reply_len)
    rows = ["estimate from the sweeps", "measured now" if measured else "measured now (not yet run)"]
    m = measured or {"ttft_s": 0.0, "decode_s": 0.0}
    fig = go.Figure([
        go.Bar(y=rows, x=[est["ttft_s"], m["ttft_s"]], orientation="h", name="prefill (TTFT)", marker=dict(color="#d62728")),
        go.Bar(y=rows, x=[est["decode_s"], m["decode_s"]], orientation="h", name=f"decode ({reply_len - 1} steps)",
               marker=dict(color="#1f77b4")),
    ])
    fig.update_layout(barmode="stack", height=300, margin=dict(t=70, l=60, r=20, b=50), legend=dict(orientation="h", y=-0.3),
                      xaxis=dict(title="seconds"),
                      title=(f"{prompt_len}-token prompt, {reply_len}-token reply: {est['total_s']:.2f} s, "
                             f"prefill {est['prefill_share']:.0%} of it (ITL {est['itl_s'] * 1e3:.0f} ms)"))
    return fig


def step_split_figure(profiles: dict) -> go.Figure:
    """Stacked bars, one per name → `step_profile` result: a decode step's ms in products, other operators, between."""
    names = list(profiles)
    fig = go.Figure([go.Bar(name=label, x=names, y=[profiles[n][key] for n in names], marker_color=colour,
                            text=[f"{profiles[n][key]:.1f}" for n in names], textposition="inside")
                     for key, label, colour in _SPLIT])
    calls = ", ".join(f"{n}: {profiles[n]['ops_per_step']:.0f} operator calls" for n in names)
    fig.update_layout(barmode="stack", title=f"One decode step, where the time goes ({calls})", yaxis_title="ms per step",
                      height=420, legend=dict(orientation="h", y=-0.2))
    return fig


def pass_cost_figure(ratios: dict) -> go.Figure:
    """T(k) / T(1) against k for each name → {k: ratio}: what a pass over k tokens costs against one decode step."""
    fig = go.Figure()
    ks = sorted({k for r in ratios.values() for k in r})
    fig.add_trace(go.Scatter(x=ks, y=[1.0] * len(ks), name="streaming the weights only (flat)", mode="lines",
                             line=dict(dash="dot", color="#9a9a9a")))
    for name, r in ratios.items():
        fig.add_trace(go.Scatter(x=sorted(r), y=[r[k] for k in sorted(r)], name=name, mode="lines+markers"))
    fig.update_layout(title="A pass over k tokens against one decode step, measured side by side",
                      xaxis_title="tokens in the pass (k)", yaxis_title="T(k) / T(1)", height=420,
                      legend=dict(orientation="h", y=-0.2))
    return fig
