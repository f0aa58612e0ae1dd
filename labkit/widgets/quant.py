"""Widgets of chapter 06: bits, group size and method over one layer (`labkit.viz.tradeoff_figure`)."""
from __future__ import annotations

__all__ = ["quant_explorer"]


def quant_explorer(w, x, n_weights: float, bandwidth_gb_s: float, bits: int = 4, group_size=32,
                   model_name: str = "the whole model"):
    """Bits and group-size buttons; each choice quantizes the layer `w` (inputs `x`) by RTN, GPTQ and AWQ.

    The title gives the memory and predicted decode speed of `model_name`, a model of `n_weights`
    weights (pass the model the layer comes from).

    Results are kept per choice, so going back to one is instant; a new one takes a second or two.
    """
    import ipywidgets as widgets

    from labkit.quant.tradeoff import TRADEOFF_METHODS, layer_tradeoff
    from labkit.viz.quant import tradeoff_figure
    from labkit.widgets._refresh import figure_box

    b = widgets.ToggleButtons(options=[8, 4, 3], value=bits, description="bits")
    g = widgets.ToggleButtons(options=[32, 64, "channel"], value=group_size, description="group")
    seen: dict = {}

    def figure():
        key = (b.value, g.value)
        if key not in seen:
            seen[key] = [layer_tradeoff(w, x, b.value, g.value, m, n_weights, bandwidth_gb_s) for m in TRADEOFF_METHODS]
        return tradeoff_figure(seen[key], model_name)

    return figure_box([b, g], figure)
