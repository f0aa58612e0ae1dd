"""Figures as a fixed skeleton plus a spec of the numbers, so that widgets can redraw in place.

A spec is {"traces": [one dict of trace properties per trace, in order], "title": str, "shapes": [...]}.
`build` makes a figure from a skeleton of empty traces and a spec; `apply` writes a new spec into an
existing figure (a FigureWidget in a slider callback) without rebuilding it: a few ms instead of ~50.
"""
from __future__ import annotations

__all__ = ["apply", "build", "wrap_title"]

TITLE_WIDTH = 78  # characters per title line before it would run off a figure (a widget beside its controls is ~700 px wide)


def apply(fig, spec: dict):
    """Write `spec` into `fig` in place; the number of traces must match."""
    traces = spec["traces"]
    if len(traces) != len(fig.data):
        raise ValueError(f"spec has {len(traces)} traces, the figure has {len(fig.data)}")
    with fig.batch_update():
        for trace, update in zip(fig.data, traces):
            trace.update(update)
        fig.layout.title.text = wrap_title(spec["title"])
        if "shapes" in spec:
            fig.layout.shapes = spec["shapes"]
    return fig


def build(fig, spec: dict, height: int = 420):
    """Finish a skeleton figure: style it and write the spec."""
    lines = wrap_title(spec["title"]).count("<br>") + 1
    below = 24 if fig.layout.annotations else 0  # subplot titles sit between the title and the plots
    fig.update_layout(height=height, margin=dict(t=40 + 22 * lines + below, l=60, r=20, b=50), legend=dict(orientation="h", y=-0.2))
    return apply(fig, spec)


def wrap_title(title: str, width: int = TITLE_WIDTH) -> str:
    """Break a long title into lines (plotly's `<br>`) at spaces, so it is not cut off at the figure's edge.

    >>> wrap_title("a b c", width=3)
    'a b<br>c'
    """
    if "<br>" in title or len(title) <= width:
        return title
    lines, line = [], ""
    for word in title.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "<br>".join(lines + [line])
