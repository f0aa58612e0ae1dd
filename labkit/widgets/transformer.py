"""Widgets for chapter 02: RoPE sliders and an attention-head picker (figures in `labkit.viz.transformer`)."""
from __future__ import annotations

__all__ = ["rope", "attention"]


def _update(widget, fig) -> None:
    with widget.batch_update():
        for target, source in zip(widget.data, fig.data):
            target.update(source.to_plotly_json())
        widget.layout.update(fig.layout.to_plotly_json())


def rope(position: int = 10, freq_index: int = 0, head_dim: int = 64, base: float = 100000.0):
    """Sliders for the position and the frequency index of one RoPE dimension pair."""
    import ipywidgets as w
    import plotly.graph_objects as go

    from labkit.viz.transformer import rope_figure

    fw = go.FigureWidget(rope_figure(position, freq_index, head_dim, base))
    pos = w.IntSlider(value=position, min=0, max=200, description="position m", continuous_update=False)
    freq = w.IntSlider(value=freq_index, min=0, max=head_dim // 2 - 1, description="pair i", continuous_update=False)

    def redraw(_=None):
        _update(fw, rope_figure(pos.value, freq.value, head_dim, base))

    pos.observe(redraw, "value")
    freq.observe(redraw, "value")
    return w.VBox([w.HBox([pos, freq]), fw])


def attention(probs, tokens: list[str], head: int = 0):
    """A slider over the heads of one layer's attention probabilities [n_heads, T, T]."""
    import ipywidgets as w
    import plotly.graph_objects as go

    from labkit.viz.transformer import attention_heatmap

    fw = go.FigureWidget(attention_heatmap(probs, tokens, head))
    slider = w.IntSlider(value=head, min=0, max=len(probs) - 1, description="head")

    def redraw(_=None):
        _update(fw, attention_heatmap(probs, tokens, slider.value))

    slider.observe(redraw, "value")
    return w.VBox([slider, fw])
