"""Redraw a FigureWidget in place from a freshly built figure with the same traces."""
from __future__ import annotations


def refresh(widget, fig) -> None:
    """Copy `fig`'s trace data, title, shapes and annotations into `widget` (a go.FigureWidget)."""
    with widget.batch_update():
        for trace, new in zip(widget.data, fig.data):
            trace.update({k: v for k, v in new.to_plotly_json().items() if k not in ("type", "uid")})
        widget.layout.title.text = fig.layout.title.text
        widget.layout.shapes = fig.layout.shapes
        widget.layout.annotations = fig.layout.annotations


def figure_box(controls, figure):
    """A FigureWidget redrawn in place by `figure()` whenever a control changes, under the controls."""
    import ipywidgets as widgets
    import plotly.graph_objects as go

    fw = go.FigureWidget(figure())
    for c in controls:
        c.observe(lambda _: refresh(fw, figure()), names="value")
    return widgets.VBox([widgets.HBox(controls), fw])
