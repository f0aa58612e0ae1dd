"""Figures of chapter 06: one layer's error by method, quality against bits, decode speed predicted and measured."""
from __future__ import annotations

import math

import plotly.graph_objects as go

from labkit.viz._spec import wrap_title

__all__ = ["tradeoff_figure", "quality_figure", "speed_figure", "awq_alpha_figure", "METHOD_COLORS"]

_LAYOUT = dict(height=420, margin=dict(t=80, l=60, r=20, b=50), legend=dict(orientation="h", y=-0.2))
METHOD_COLORS = {"RTN": "#1f77b4", "GPTQ": "#d62728", "AWQ": "#2ca02c", "float": "#7f7f7f", "GGUF": "#9467bd",
                 "block format": "#ff7f0e"}


def _group_label(group) -> str:
    return "per-channel" if group == "channel" else f"groups of {group}"


def tradeoff_figure(rows: list[dict], model_name: str = "the whole model") -> go.Figure:
    """Weight and output error of one layer for each method at one (bits, group size) (rows of `layer_tradeoff`);
    the title gives the memory (and predicted speed) of `model_name`, the model the rows' n_weights describe."""
    if not rows or len({(r["bits"], r["group_size"]) for r in rows}) != 1:
        raise ValueError("rows must be `layer_tradeoff` rows of one (bits, group_size), one per method")
    r0 = rows[0]
    names = [r["method"].upper() for r in rows]
    fig = go.Figure([
        go.Bar(x=names, y=[float(f"{r['weight_error']:.3g}") for r in rows], name="weight error ‖Ŵ−W‖²/‖W‖²",
               marker_color="#aec7e8"),
        go.Bar(x=names, y=[float(f"{r['output_error']:.3g}") for r in rows], name="output error ‖XŴᵀ−XWᵀ‖²/‖XWᵀ‖²",
               marker_color=[METHOD_COLORS[n] for n in names]),
    ])
    title = f"int{r0['bits']}, {_group_label(r0['group_size'])}: {r0['bits_per_weight']:.2f} bits per weight"
    if "memory_bytes" in r0:
        title += f"; {model_name} {r0['memory_bytes'] / 1e6:.0f} MB"
    if "predicted_tokens_per_s" in r0:
        title += f", predicted decode {r0['predicted_tokens_per_s']:.0f} tokens/s"
    fig.update_layout(title=wrap_title(title), barmode="group", yaxis=dict(title="relative squared error", type="log"),
                      **_LAYOUT)
    return fig


def _method(name: str) -> str:
    for key in ("RTN", "GPTQ", "AWQ", "GGUF"):
        if key in name:
            return key
    if name.startswith(("Q8_0", "Q4_1", "MXFP", "NVFP")):
        return "block format"
    return "float"


_SYMBOLS = {"per-channel": "circle", "groups of 64": "square", "groups of 32": "diamond"}


def _symbol(name: str) -> str:
    blocks = name.startswith(("Q8_0", "Q4_1", "MXFP"))  # blocks of 32 (NVFP4: scales per 16, counted as 32's shape)
    return _SYMBOLS["groups of 64" if "g64" in name else "groups of 32" if "g32" in name or blocks
                    or name.startswith("NVFP") else "per-channel"]


def _uncrowded(xs, ys, dy: float, dx: float = 0.6) -> list[bool]:
    """Which points may carry a text label: those with no other point within (dx, dy)."""
    return [not any(j != i and abs(xs[j] - xs[i]) < dx and abs(ys[j] - ys[i]) < dy for j in range(len(xs)))
            for i in range(len(xs))]


def quality_figure(rows: list[dict], title: str, metric: str = "kl") -> go.Figure:
    """KL to float32 (or "ppl_change", or "top1") against bits per weight, one colour per method.

    `rows` are the quality rows of one model (`labkit.quant.sweep.quality_rows`); bits per weight
    is 32 · (bytes stored / float32 bytes), so scales and the LM head are counted. The marker's
    shape is the group layout; points too close to another carry no text label (hover names them all).
    """
    labels = {"kl": ("mean KL(float32 ‖ variant), nats", "log"), "ppl_change": ("perplexity change vs float32", "linear"),
              "top1": ("top-1 agreement with float32", "linear")}
    if metric not in labels:
        raise ValueError(f"metric must be one of {sorted(labels)}, got {metric!r}")
    fig = go.Figure()
    log = metric == "kl"
    shown = [r for r in rows if not (log and r["name"] == "float32") and " seed " not in r["name"]]  # one point per variant
    xs = [round(32 * r["vs_float32_bytes"], 2) for r in shown]
    ys = [float(f"{max(r[metric], 1e-6):.4g}") if log else r[metric] for r in shown]
    keep = _uncrowded(xs, [math.log10(y) for y in ys] if log else ys, 0.3 if log else 0.03 * (max(ys) - min(ys) or 1))
    for method, color in METHOD_COLORS.items():
        mine = [i for i, r in enumerate(shown) if _method(r["name"]) == method]
        if not mine:
            continue
        fig.add_trace(go.Scatter(x=[xs[i] for i in mine], y=[ys[i] for i in mine], mode="markers+text",
                                 text=[shown[i]["name"].replace(f" {method}", "") if keep[i] else "" for i in mine],
                                 hovertext=[shown[i]["name"] for i in mine], hoverinfo="text+y",
                                 textposition="top center", textfont=dict(size=9), name=method,
                                 marker=dict(size=10, color=color, symbol=[_symbol(shown[i]["name"]) for i in mine])))
    for layout, symbol in _SYMBOLS.items():  # a legend for the marker shapes (hover names every point)
        if any(_symbol(r["name"]) == symbol for r in shown):
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=layout,
                                     marker=dict(size=10, color="#555", symbol=symbol)))
    fig.update_layout(title=wrap_title(title), xaxis=dict(title="bits per weight stored (scales and head included)"),
                      yaxis=dict(title=labels[metric][0], type=labels[metric][1],
                                 tickformat=".0%" if metric != "kl" else None), **_LAYOUT)
    return fig


def speed_figure(rows: list[dict], title: str) -> go.Figure:
    """Predicted (bandwidth / bytes per token) and measured decode tokens/s per format.

    Each row: {"name", "bytes_per_token", "predicted_tokens_per_s", "tokens_per_s"}.
    """
    names = [r["name"] for r in rows]
    fig = go.Figure([
        go.Bar(x=names, y=[round(r["predicted_tokens_per_s"], 1) for r in rows], name="predicted from bytes per token",
               marker_color="#c7c7c7"),
        go.Bar(x=names, y=[round(r["tokens_per_s"], 1) for r in rows], name="measured", marker_color="#1f77b4",
               text=[f"{r['tokens_per_s'] / r['predicted_tokens_per_s']:.0%}" for r in rows], textposition="outside"),
    ])
    fig.update_layout(title=wrap_title(title), barmode="group", yaxis=dict(title="decode tokens/s (batch 1)"), **_LAYOUT)
    return fig


def awq_alpha_figure(errors: dict, rtn_label: str = "α = 0 is plain RTN") -> go.Figure:
    """AWQ's grid search: the layer's output error for each α of s = s_x^α (the `errors` of `awq_search`)."""
    alphas = sorted(errors)
    best = min(alphas, key=lambda a: errors[a])
    fig = go.Figure([
        go.Scatter(x=alphas, y=[float(f"{errors[a]:.4g}") for a in alphas], mode="lines+markers", name="output error"),
        go.Scatter(x=[best], y=[float(f"{errors[best]:.4g}")], mode="markers", marker=dict(size=14, color="#2ca02c"),
                   name=f"chosen α = {best:.2f}"),
    ])
    fig.update_layout(title=wrap_title(f"AWQ: scale input channel j by (mean |x_j|)^α, fold 1/s into the layer before; "
                                       f"{rtn_label}; at the best α the error is {errors[best] / errors[0.0]:.0%} of RTN's"),
                      xaxis=dict(title="α"), yaxis=dict(title="mean squared output error"), **_LAYOUT)
    return fig
