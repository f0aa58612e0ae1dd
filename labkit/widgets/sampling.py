"""Widgets of chapter 05: sliders that reshape one real next-token distribution."""
from __future__ import annotations

__all__ = ["sampling_pipeline"]


def sampling_pipeline(logits, tok=None, history=None, top_n: int = 15, **start):
    """Sliders for every sampling knob and the pipeline order, wired to `labkit.viz.sampling_pipeline_figure`.

    `start` sets the initial knob values, e.g. `sampling_pipeline(logits, tok, temperature=0.7, top_p=0.9)`.
    """
    import ipywidgets as widgets
    import plotly.graph_objects as go

    from labkit.sampling.pipeline import SamplingParams
    from labkit.viz.sampling import sampling_pipeline_figure

    init = SamplingParams.from_kwargs(**{"temperature": 1.0, **start})
    style = {"description_width": "130px"}
    layout = widgets.Layout(width="380px")
    controls = {
        "temperature": widgets.FloatSlider(value=init.temperature, min=0.0, max=2.0, step=0.05, description="temperature"),
        "top_k": widgets.IntSlider(value=init.top_k, min=0, max=50, description="top_k (0 = off)"),
        "top_p": widgets.FloatSlider(value=init.top_p, min=0.05, max=1.0, step=0.01, description="top_p"),
        "min_p": widgets.FloatSlider(value=init.min_p, min=0.0, max=0.5, step=0.01, description="min_p"),
        "typical_p": widgets.FloatSlider(value=init.typical_p, min=0.05, max=1.0, step=0.01, description="typical_p"),
        "repetition_penalty": widgets.FloatSlider(value=init.repetition_penalty, min=0.5, max=2.0, step=0.05,
                                                  description="repetition penalty"),
        "presence_penalty": widgets.FloatSlider(value=init.presence_penalty, min=0.0, max=2.0, step=0.1,
                                                description="presence penalty"),
        "order": widgets.ToggleButtons(options=["hf", "llama.cpp"], value=init.order, description="order"),
    }
    for c in controls.values():
        c.style, c.layout = style, layout

    def figure():
        knobs = {name: c.value for name, c in controls.items()}
        return sampling_pipeline_figure(logits, tok, history, SamplingParams(**knobs), top_n=top_n)

    fig = go.FigureWidget(figure())

    def redraw(_=None):
        new = figure()
        with fig.batch_update():
            for trace, new_trace in zip(fig.data, new.data):
                trace.update({k: v for k, v in new_trace.to_plotly_json().items() if k not in ("type", "uid")})
            fig.layout.title.text = new.layout.title.text

    for c in controls.values():
        c.observe(redraw, names="value")
    names = list(controls)
    left = widgets.VBox([controls[n] for n in names[:4]])
    right = widgets.VBox([controls[n] for n in names[4:]])
    return widgets.VBox([widgets.HBox([left, right]), fig])
