"""Figures for chapter 02 (the forward pass): RoPE, attention heat maps, where parameters go.

RoPE follows Su et al. 2021 (RoFormer); see `labkit.model.rope`.

    >>> fig = rope_figure(position=10, freq_index=0)
    >>> len(fig.data)
    6
"""
from __future__ import annotations

import math

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labkit import checks
from labkit.model.rope import angles

__all__ = ["rope_figure", "rope_scores", "attention_heatmap", "param_breakdown_figure"]


def rope_scores(query_pos: int, offsets, head_dim: int = 64, base: float = 100000.0, seed: int = 0) -> list[float]:
    """q·k after RoPE for a query at `query_pos` and keys at `query_pos + offset`.

    The same random q and k are used for every call (seeded), so the curves for two query
    positions can be compared: they coincide, because the score depends only on the offset.
    """
    from labkit.model.rope import apply_rope

    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, head_dim, generator=g, dtype=torch.float64)
    pos = torch.tensor([query_pos] + [query_pos + o for o in offsets])
    theta = angles(pos, head_dim, base)
    rq = apply_rope(q[None], theta[:1].cos(), theta[:1].sin(), "interleaved")  # [1, head_dim]
    rk = apply_rope(k.expand(len(offsets), head_dim), theta[1:].cos(), theta[1:].sin(), "interleaved")
    return (rk @ rq[0]).tolist()


def rope_figure(position: int = 10, freq_index: int = 0, head_dim: int = 64, base: float = 100000.0,
                max_offset: int = 48) -> go.Figure:
    """Two panels: (left) one dimension pair rotating as the position grows, at frequency
    θ_i = base^(-2i/d); (right) the relative-position property: q·k scores against the key
    offset, for a query at position 0 and at `position` - the two curves lie on top of each other.
    """
    checks.integer("head_dim", head_dim, 2, 4096)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    checks.integer("position", position, 0, 100_000)
    checks.integer("freq_index", freq_index, 0, head_dim // 2 - 1)
    theta_i = base ** (-2 * freq_index / head_dim)
    trail = [m * theta_i for m in range(position + 1)]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.42, 0.58], subplot_titles=(
        f"pair {freq_index}: θ = {theta_i:.3g} rad per position", "q·k depends only on the offset"))
    circle = [2 * math.pi * t / 120 for t in range(121)]
    fig.add_trace(go.Scatter(x=[math.cos(a) for a in circle], y=[math.sin(a) for a in circle], mode="lines",
                             line=dict(color="#cccccc"), hoverinfo="skip", showlegend=False), 1, 1)
    fig.add_trace(go.Scatter(x=[math.cos(a) for a in trail], y=[math.sin(a) for a in trail], mode="markers",
                             marker=dict(size=5, color=list(range(position + 1)), colorscale="Viridis"),
                             name="positions 0..m", hovertemplate="angle %{text}<extra></extra>",
                             text=[f"{a:.2f}" for a in trail]), 1, 1)
    end = trail[-1]
    fig.add_trace(go.Scatter(x=[0, math.cos(end)], y=[0, math.sin(end)], mode="lines+markers",
                             line=dict(color="#d62728", width=3), name=f"position {position}"), 1, 1)
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 0], mode="lines", line=dict(color="#1f77b4", dash="dot"),
                             name="position 0"), 1, 1)
    offsets = list(range(-max_offset, max_offset + 1))
    near, far = rope_scores(0, offsets, head_dim, base), rope_scores(position, offsets, head_dim, base)
    fig.add_trace(go.Scatter(x=offsets, y=near, mode="lines", line=dict(color="#1f77b4", width=4),
                             name="query at position 0"), 1, 2)
    fig.add_trace(go.Scatter(x=offsets, y=far, mode="lines", line=dict(color="#d62728", width=1.5, dash="dash"),
                             name=f"query at position {position}"), 1, 2)
    fig.update_xaxes(range=[-1.2, 1.2], scaleanchor="y", row=1, col=1)
    fig.update_yaxes(range=[-1.2, 1.2], row=1, col=1)
    fig.update_xaxes(title_text="key position − query position", row=1, col=2)
    fig.update_yaxes(title_text="q·k after RoPE", row=1, col=2)
    fig.update_layout(height=380, margin=dict(l=40, r=20, t=50, b=40), legend=dict(orientation="h", y=-0.2))
    return fig


def attention_heatmap(probs, tokens: list[str], head: int = 0, title: str | None = None) -> go.Figure:
    """Heat map of one head's attention: row = query token, column = key token.

    `probs`: [n_heads, T, T] (from `labkit.model.attention_probs`), `tokens`: T labels.
    """
    probs = torch.as_tensor(probs)
    if probs.dim() != 3 or probs.shape[1] != probs.shape[2]:
        raise ValueError(f"probs must have shape [n_heads, T, T], got {tuple(probs.shape)}")
    if len(tokens) != probs.shape[1]:
        raise ValueError(f"got {len(tokens)} token labels for {probs.shape[1]} positions")
    checks.integer("head", head, 0, probs.shape[0] - 1)
    labels = [f"{i}:{t}" for i, t in enumerate(tokens)]  # unique labels, even for repeated tokens
    fig = go.Figure(go.Heatmap(z=probs[head].tolist(), x=labels, y=labels, colorscale="Blues", zmin=0, zmax=1,
                               hovertemplate="query %{y}<br>key %{x}<br>p = %{z:.3f}<extra></extra>"))
    fig.update_layout(title=title or f"attention of head {head}: each row (a query) spreads 1 over the keys up to it",
                      height=540, margin=dict(l=120, r=20, t=50, b=140),
                      yaxis=dict(autorange="reversed", title="query: the token attending"),
                      xaxis=dict(tickangle=-60, title="key: the token attended to"))
    return fig


def param_breakdown_figure(config) -> go.Figure:
    """Bar chart of where a model's parameters are (from `config.param_counts()`)."""
    counts = config.param_counts()
    names = [k for k, v in counts.items() if v]
    fig = go.Figure(go.Bar(x=names, y=[counts[k] / 1e6 for k in names], text=[f"{counts[k] / 1e6:.1f} M" for k in names],
                           textposition="outside", marker_color="#1f77b4"))
    fig.update_layout(title=f"{config.name}: {config.n_params() / 1e6:.1f} M parameters", yaxis_title="millions",
                      height=340, margin=dict(l=50, r=20, t=50, b=40))
    return fig
