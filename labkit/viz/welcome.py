"""Figures of chapter 00: how fast can a model decode on this machine?

Batch-1 decode reads every weight once per token, so its speed is bounded by
memory bandwidth:  tokens/s <= bandwidth / (n_params x bytes_per_weight).
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from labkit import checks

__all__ = ["decode_speed_bound", "decode_speed_figure", "format_params", "MODEL_SIZES", "WEIGHT_FORMATS"]

# Parameter counts of well-known models (slider stops).
MODEL_SIZES = {
    "135M": 135e6, "360M": 360e6, "1.7B": 1.7e9, "3B": 3e9, "7B": 7e9, "13B": 13e9, "70B": 70e9,
}
# Bytes per weight of common formats (Q4_1: 32 4-bit weights + fp16 scale + fp16 min = 20 bytes / 32).
WEIGHT_FORMATS = {"fp32": 4.0, "bf16": 2.0, "int8 (Q8_0)": 34 / 32, "int4 (Q4_1)": 20 / 32}


def decode_speed_bound(n_params: float, bytes_per_weight: float, bandwidth_gb_s: float) -> float:
    """Upper bound on batch-1 decode tokens/s: every weight is read once per token.

    >>> round(decode_speed_bound(135e6, 4.0, 10.0), 1)
    18.5
    """
    checks.positive("n_params", n_params)
    checks.positive("bytes_per_weight", bytes_per_weight)
    checks.positive("bandwidth_gb_s", bandwidth_gb_s)
    return bandwidth_gb_s * 1e9 / (n_params * bytes_per_weight)


def format_params(n: float) -> str:
    """135e6 -> '135M', 7e9 -> '7B'."""
    if n >= 1e9:
        return f"{n / 1e9:.3g}B"
    return f"{n / 1e6:.3g}M"


def decode_speed_figure(bandwidth_gb_s: float, n_params: float = 135e6, bytes_per_weight: float = 4.0) -> go.Figure:
    """Decode-speed bound vs model size, one line per weight format, the chosen point marked."""
    chosen = decode_speed_bound(n_params, bytes_per_weight, bandwidth_gb_s)
    sizes = np.logspace(np.log10(1e8), np.log10(1e11), 60)
    fig = go.Figure()
    for name, bpw in WEIGHT_FORMATS.items():
        fig.add_trace(go.Scatter(x=sizes, y=bandwidth_gb_s * 1e9 / (sizes * bpw), mode="lines", name=name))
    fig.add_trace(go.Scatter(x=[n_params], y=[chosen], mode="markers", marker=dict(size=14, color="black"), name="chosen"))
    weights_mb = n_params * bytes_per_weight / 1e6
    fig.update_layout(
        title=(
            f"{format_params(n_params)} params x {bytes_per_weight:.3g} B = {weights_mb:,.0f} MB per token"
            f" -> at most {chosen:,.1f} tokens/s at {bandwidth_gb_s:.1f} GB/s"
        ),
        xaxis=dict(type="log", title="parameters"),
        yaxis=dict(type="log", title="decode tokens/s (upper bound)"),
        height=420,
        margin=dict(t=60, l=60, r=20, b=50),
        template="plotly_white",
    )
    return fig
