"""Widgets of chapter 00: the decode-speed bound on this machine's measured bandwidth."""
from __future__ import annotations

__all__ = ["decode_speed"]


def decode_speed(bandwidth_gb_s: float | None = None):
    """Sliders for model size and bytes per weight, wired to `labkit.viz.decode_speed_figure`.

    With no bandwidth given, this machine's streaming-read bandwidth is measured (~0.5 s).
    """
    import ipywidgets as widgets
    import plotly.graph_objects as go

    from labkit.viz.welcome import MODEL_SIZES, WEIGHT_FORMATS, decode_speed_figure

    if bandwidth_gb_s is None:
        from labkit.costmodel.measure import read_bandwidth_gb_s

        bandwidth_gb_s = read_bandwidth_gb_s(seconds=0.5)
    size = widgets.SelectionSlider(options=list(MODEL_SIZES), value="135M", description="model size")
    fmt = widgets.SelectionSlider(options=list(WEIGHT_FORMATS), value="fp32", description="weights")
    fig = go.FigureWidget(decode_speed_figure(bandwidth_gb_s, MODEL_SIZES[size.value], WEIGHT_FORMATS[fmt.value]))

    def redraw(_=None):
        new = decode_speed_figure(bandwidth_gb_s, MODEL_SIZES[size.value], WEIGHT_FORMATS[fmt.value])
        with fig.batch_update():
            for trace, new_trace in zip(fig.data, new.data):
                trace.x, trace.y = new_trace.x, new_trace.y
            fig.layout.title.text = new.layout.title.text

    size.observe(redraw, names="value")
    fmt.observe(redraw, names="value")
    return widgets.VBox([widgets.HBox([size, fmt]), fig])
