"""Widgets of chapter 09: a cost-per-million-tokens calculator (`labkit.viz.cost_figure`)."""
from __future__ import annotations

__all__ = ["cost_calculator"]


def cost_calculator(measured_tok_s: float, config="llama-2-7b"):
    """Sliders for the two prices per hour and the GPU profile; bars of $ per 1M tokens redraw in place."""
    import ipywidgets as widgets

    from labkit.viz.serving import cost_figure
    from labkit.widgets._refresh import figure_box

    here = widgets.FloatSlider(value=0.10, min=0.01, max=2.0, step=0.01, description="$/h here")
    gpu_price = widgets.FloatSlider(value=3.0, min=0.5, max=12.0, step=0.25, description="$/h GPU")
    gpu = widgets.Dropdown(options=["a100-sxm", "h100-sxm", "h200-sxm", "mi300x"], value="h100-sxm", description="GPU")
    return figure_box([here, gpu_price, gpu], lambda: cost_figure(measured_tok_s, here.value, gpu_price.value,
                                                                  gpu.value, config))
