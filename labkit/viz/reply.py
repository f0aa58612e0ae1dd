"""The timeline of one reply: tokenize, prefill, each decode step, detokenize.

    >>> out = labkit.generate(model, tok, "What is the capital of France?")   # doctest: +SKIP
    >>> reply_timeline(out.timings())                                          # doctest: +SKIP
"""
from __future__ import annotations

import plotly.graph_objects as go

__all__ = ["reply_timeline", "STAGE_COLORS"]

STAGE_COLORS = {"tokenize": "#8c8c8c", "prefill": "#d62728", "decode": "#1f77b4", "detokenize": "#2ca02c"}
_ROWS = ["detokenize", "decode", "prefill", "tokenize"]  # bottom to top, so tokenize is on top


def _rows(timings) -> list[dict]:
    if hasattr(timings, "timings"):  # a GenerationOutput
        timings = timings.timings()
    rows = []
    for i, t in enumerate(timings):
        if isinstance(t, dict):
            stage, start, end = t["stage"], float(t["start_s"]), float(t["end_s"])
        else:
            stage, start, end = t[0], float(t[1]), float(t[2])
        kind = stage.split()[0]
        if kind not in STAGE_COLORS:
            raise ValueError(f"timings[{i}]: unknown stage {stage!r}; stages are {', '.join(STAGE_COLORS)} (decode N)")
        if end < start:
            raise ValueError(f"timings[{i}] ({stage}) ends before it starts: {start} > {end}")
        rows.append({"stage": stage, "kind": kind, "start": start, "end": end})
    if not rows:
        raise ValueError("timings is empty")
    return rows


def reply_timeline(timings, title: str = "One reply, stage by stage") -> go.Figure:
    """A Gantt chart of a reply: one bar per stage on a shared millisecond axis.

    `timings`: a `GenerationOutput`, its `.timings()` (dicts with stage, start_s, end_s)
    or `(stage, start_s, end_s)` tuples. Decode steps share one row, so their rhythm
    (the inter-token latency) is visible next to the single long prefill bar.
    """
    rows = _rows(timings)
    fig = go.Figure()
    for kind in STAGE_COLORS:
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            continue
        fig.add_trace(go.Bar(
            name=kind,
            y=[kind] * len(mine),
            base=[r["start"] * 1e3 for r in mine],
            x=[(r["end"] - r["start"]) * 1e3 for r in mine],
            orientation="h",
            marker=dict(color=STAGE_COLORS[kind], line=dict(color="white", width=0.5 if kind == "decode" else 0)),
            customdata=[[r["stage"], (r["end"] - r["start"]) * 1e3] for r in mine],
            hovertemplate="%{customdata[0]}: %{customdata[1]:.1f} ms<extra></extra>",
        ))
    n_decode = sum(r["kind"] == "decode" for r in rows)
    total = max(r["end"] for r in rows) * 1e3
    fig.update_layout(
        title=f"{title}: {total:.0f} ms, {n_decode} decode steps",
        xaxis_title="time since the request (ms)",
        yaxis=dict(categoryorder="array", categoryarray=[k for k in _ROWS if any(r["kind"] == k for r in rows)]),
        barmode="overlay", height=260, margin=dict(l=90, r=20, t=50, b=45), showlegend=False,
    )
    return fig
