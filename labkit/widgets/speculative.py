"""Widgets of chapter 07: α and c sliders over the predicted speed-up (`labkit.viz.speedup_figure`)."""
from __future__ import annotations

__all__ = ["speedup_explorer"]


def speedup_explorer(alpha: float, c: float, t_rel: dict | None = None, measured: list[dict] | None = None):
    """Sliders for the acceptance α and the draft's cost c; the measured points stay where they were measured."""
    import ipywidgets as widgets

    from labkit.viz.speculative import speedup_figure
    from labkit.widgets._refresh import figure_box

    a = widgets.FloatSlider(value=round(alpha, 2), min=0.0, max=0.95, step=0.05, description="α")
    k = widgets.FloatSlider(value=round(c, 2), min=0.0, max=1.0, step=0.01, description="c")
    return figure_box([a, k], lambda: speedup_figure(a.value, k.value, t_rel, measured))
