"""Figures of chapter 07: the output distribution equals the target's; speed-up against γ, predicted and measured."""
from __future__ import annotations

import plotly.graph_objects as go

from labkit.viz._spec import wrap_title

__all__ = ["exactness_figure", "speedup_figure", "acceptance_figure"]

_SCHEDULE_COLORS = {"auto": "#d62728", "heuristic": "#9467bd"}
_LAYOUT = dict(height=420, margin=dict(t=80, l=60, r=20, b=50), legend=dict(orientation="h", y=-0.2))


def exactness_figure(p, q, counts, labels=None) -> go.Figure:
    """Target p, draft q, and the share of each token among `counts` (`first_token_counts`): the last matches p."""
    n = int(sum(int(c) for c in counts))
    if n == 0:
        raise ValueError("counts hold no samples")
    labels = list(labels) if labels is not None else [f"token {i}" for i in range(len(p))]
    share = [int(c) / n for c in counts]
    worst = max(abs(s - float(pi)) for s, pi in zip(share, p))
    fig = go.Figure([
        go.Bar(x=labels, y=[round(float(v), 4) for v in q], name="draft q (what is proposed)", marker_color="#ff7f0e"),
        go.Bar(x=labels, y=[round(float(v), 4) for v in p], name="target p", marker_color="#1f77b4"),
        go.Bar(x=labels, y=[round(s, 4) for s in share], name=f"emitted after verification ({n:,} rounds)",
               marker_color="#2ca02c"),
    ])
    fig.update_layout(title=wrap_title(f"Accept with min(1, p/q), resample from norm(max(0, p − q)): the emitted tokens "
                                       f"follow p, not q (largest gap {worst:.3f})"),
                      barmode="group", yaxis=dict(title="probability"), **_LAYOUT)
    return fig


def speedup_figure(alpha: float, c: float, t_rel: dict | None = None, measured: list[dict] | None = None,
                   gammas=range(1, 9)) -> go.Figure:
    """Predicted speed-up against γ: the paper's T(γ+1) = T(1), the measured T(γ+1), and measured runs.

    `measured`: rows {"gamma": int, "speedup": float}; a row whose gamma is a schedule ("auto",
    "heuristic") is drawn as a dashed horizontal line.
    """
    from labkit.speculative.costs import predicted_speedup

    gammas = list(gammas)
    traces = [go.Scatter(x=gammas, y=[round(predicted_speedup(alpha, g, c), 3) for g in gammas], mode="lines+markers",
                         name="predicted, T(γ+1) = T(1) (the paper)", line=dict(dash="dot", color="#7f7f7f"))]
    if t_rel is not None:
        ok = [g for g in gammas if g + 1 in t_rel]
        traces.append(go.Scatter(x=ok, y=[round(predicted_speedup(alpha, g, c, t_rel), 3) for g in ok],
                                 mode="lines+markers", name="predicted with this machine's T(γ+1)", line=dict(color="#1f77b4")))
    shapes = [dict(type="line", xref="paper", x0=0, x1=1, y0=1, y1=1, line=dict(color="black", width=1))]
    if measured:
        fixed = [r for r in measured if isinstance(r["gamma"], int)]
        traces.append(go.Scatter(x=[r["gamma"] for r in fixed], y=[round(r["speedup"], 3) for r in fixed], mode="markers",
                                 marker=dict(size=12, color="#d62728"), name="measured"))
        for r in measured:
            if not isinstance(r["gamma"], int):
                color = _SCHEDULE_COLORS.get(r["gamma"], "#d62728")
                shapes.append(dict(type="line", xref="paper", x0=0, x1=1, y0=r["speedup"], y1=r["speedup"],
                                   line=dict(color=color, dash="dash", width=1)))
    fig = go.Figure(traces)
    fig.update_layout(title=wrap_title(f"Speed-up over plain decoding against γ, for acceptance α = {alpha:.2f} and a draft "
                                       f"step costing c = {c:.2f} target steps (dashed, measured: red γ = auto, purple γ = heuristic)"),
                      xaxis=dict(title="γ (tokens drafted per round)", dtick=1), yaxis=dict(title="speed-up (×)"),
                      shapes=shapes, **_LAYOUT)
    return fig


def acceptance_figure(rows: dict) -> go.Figure:
    """Acceptance rate at each draft position, one line per drafter (`{name: SpeculativeOutput.acceptance}`)."""
    fig = go.Figure([go.Scatter(x=list(range(1, len(acc) + 1)), y=[round(a, 3) for a in acc], mode="lines+markers", name=name)
                     for name, acc in rows.items()])
    fig.update_layout(title="Share of draft tokens accepted at each position of a round",
                      xaxis=dict(title="draft position", dtick=1), yaxis=dict(title="accepted", range=[0, 1.05],
                                                                               tickformat=".0%"), **_LAYOUT)
    return fig
