"""Figures as a fixed skeleton plus a spec of the numbers, so that widgets can redraw in place.

A spec is {"traces": [one dict of trace properties per trace, in order], "title": str, "shapes": [...]}.
`build` makes a figure from a skeleton of empty traces and a spec; `apply` writes a new spec into an
existing figure (a FigureWidget in a slider callback) without rebuilding it: a few ms instead of ~50.
"""
from __future__ import annotations

__all__ = ["apply", "build"]


def apply(fig, spec: dict):
    """Write `spec` into `fig` in place; the number of traces must match."""
    traces = spec["traces"]
    if len(traces) != len(fig.data):
        raise ValueError(f"spec has {len(traces)} traces, the figure has {len(fig.data)}")
    with fig.batch_update():
        for trace, update in zip(fig.data, traces):
            trace.update(update)
        fig.layout.title.text = spec["title"]
        if "shapes" in spec:
            fig.layout.shapes = spec["shapes"]
    return fig


def build(fig, spec: dict, height: int = 420):
    """Finish a skeleton figure: style it and write the spec."""
    fig.update_layout(height=height, margin=dict(t=60, l=60, r=20, b=50), legend=dict(orientation="h", y=-0.2))
    return apply(fig, spec)
