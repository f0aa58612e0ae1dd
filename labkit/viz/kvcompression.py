"""Figures of deep dive 04a (compressing the cache): cache kinds at equal bytes, ITL against position, dense vs compressed attention.

Each takes the rows `labkit.generation.compression.compare_at_budget` and `labkit.train.compare.compare_models`
return (or the same rows stored in `data/kv_compression.json`).

    >>> fig = compression_figure(table)                       # doctest: +SKIP
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["compression_figure", "itl_position_figure", "compressed_attention_figure"]

_LAYOUT = dict(height=430, margin=dict(t=80, l=60, r=20, b=50), legend=dict(orientation="h", y=-0.2))


def compression_figure(table: dict) -> go.Figure:
    """Tail perplexity and passkey accuracy of every kind at one byte budget (a table of `compare_at_budget`).

    The perplexity plotted is the scored tail's (`ppl_tail`: the last tokens, where every kind has evicted), the
    one the chapter's tables print; the whole text's (`ppl`) would let a kind that reads most of it unevicted
    look better than it is."""
    rows = table["rows"]
    names = [r["name"] + ("" if r["settable"] else "*") for r in rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("perplexity of the scored tail (lower is better)",
                                                        f"passkey found ({table['trials']} trials)"))
    share = [f"{r['fraction']:.0%} of the bytes" for r in rows]
    fig.add_trace(go.Bar(x=names, y=[round(r["ppl_tail"], 2) for r in rows], name="tail perplexity", hovertext=share,
                         text=[f"{r['ppl_tail']:.2f}" for r in rows], textposition="outside"), 1, 1)
    fig.add_trace(go.Bar(x=names, y=[r["passkey"] for r in rows], name="passkey accuracy", hovertext=share,
                         text=[f"{r['passkey']:.0%}" for r in rows], textposition="outside"), 1, 2)
    full = rows[0]["ppl_tail"]
    fig.add_hline(y=full, line=dict(color="grey", dash="dot"), row=1, col=1)
    fig.update_yaxes(range=[0, 1.15], row=1, col=2)
    fig.update_layout(title=f"Every kind at {table['fraction']:.0%} of the full cache's bytes at {table['length']:,} tokens "
                            f"(* quantized: its own share)", showlegend=False, **_LAYOUT)
    return fig


def itl_position_figure(itl_rows, title: str = "") -> go.Figure:
    """Decode-step time against position, one line per cache kind (rows {name, position, itl_s})."""
    fig = go.Figure()
    for name in dict.fromkeys(r["name"] for r in itl_rows):
        pts = sorted((r["position"], r["itl_s"] * 1e3) for r in itl_rows if r["name"] == name)
        fig.add_trace(go.Scatter(x=[p for p, _ in pts], y=[round(t, 2) for _, t in pts], mode="lines+markers", name=name))
    fig.update_layout(title=title or "ITL against position", xaxis=dict(title="position (tokens already cached)"),
                      yaxis=dict(title="ms per decode step", rangemode="tozero"), **_LAYOUT)
    return fig


def compressed_attention_figure(out: dict) -> go.Figure:
    """KV bytes per token and decode-step time by position, dense against compressed (`compare_models`' output)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"KV bytes per token at {out['kv'][0]['n_tokens']:,} tokens",
                                                        "decode step by position (hollow: past the model's window)"))
    kv = out["kv"]
    fig.add_trace(go.Bar(x=[r["name"] for r in kv], y=[r["bytes_per_token"] for r in kv], showlegend=False,
                         text=[f"{r['bytes_per_token']:,.0f} B ({r['share']:.0%})" for r in kv], textposition="outside"), 1, 1)
    for name in dict.fromkeys(r["name"] for r in out["decode"]):
        pts = sorted((r["position"], r["itl_s"] * 1e3, r["stretched"]) for r in out["decode"] if r["name"] == name)
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[round(p[1], 3) for p in pts], mode="lines+markers", name=name,
                                 marker=dict(symbol=["circle-open" if p[2] else "circle" for p in pts], size=9)), 1, 2)
    fig.update_xaxes(type="log", title="position", row=1, col=2)
    fig.update_yaxes(title="ms", rangemode="tozero", row=1, col=2)
    fig.update_layout(title="Dense attention against compressed sparse attention, same recipe", **_LAYOUT)
    return fig
