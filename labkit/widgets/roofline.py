"""Widget of chapter 03's modelled half: the roofline and the ridge point, for any hardware and model."""
from __future__ import annotations

__all__ = ["roofline_explorer"]

PROMPTS = [1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def roofline_explorer(config: str = "llama-2-7b", hw: str = "h100-sxm", prompt_len: int = 512):
    """Sliders: hardware, model, prompt length, decode context, batch, weight and KV bits.

    Shows the roofline with prefill and decode on it, tokens/s vs tokens per weight pass, and the
    estimate's numbers with the diagnosis (which phase is slow, and which roof limits it).
    """
    import ipywidgets as widgets
    import plotly.graph_objects as go

    from labkit.costmodel.estimator import diagnose, estimate
    from labkit.viz import _spec
    from labkit.viz.roofline import ridge_figure, ridge_spec, roofline_figure, roofline_spec
    from labkit.widgets.power import _box, _guard, _options, hardware_names, model_names

    c = {
        "hw": widgets.Dropdown(options=hardware_names(), value=hw, description="hardware"),
        "model": widgets.Dropdown(options=model_names(), value=config, description="model"),
        "prompt": widgets.SelectionSlider(options=_options(PROMPTS, prompt_len), value=prompt_len, description="prompt"),
        "context": widgets.SelectionSlider(options=_options(PROMPTS, prompt_len), value=prompt_len, description="decode context"),
        "batch": widgets.SelectionSlider(options=BATCHES, value=1, description="batch"),
        "wbits": widgets.Dropdown(options=[16, 8, 4], value=16, description="weight bits"),
        "kvbits": widgets.Dropdown(options=[16, 8, 4], value=16, description="KV bits"),
    }
    message = widgets.HTML()

    def args():
        return dict(config=c["model"].value, hw=c["hw"].value, batch=c["batch"].value,
                    weight_bits=c["wbits"].value, kv_bits=c["kvbits"].value)

    a = args()
    roof = go.FigureWidget(roofline_figure(prompt_len=c["prompt"].value, context=c["context"].value, **a))
    ridge = go.FigureWidget(ridge_figure(prompt_len=c["prompt"].value, **{k: v for k, v in a.items() if k != "kv_bits"}))

    def redraw():
        def draw():
            a = args()
            _spec.apply(roof, roofline_spec(prompt_len=c["prompt"].value, context=c["context"].value, **a))
            _spec.apply(ridge, ridge_spec(prompt_len=c["prompt"].value, **a))
            est = estimate(a["config"], a["hw"], c["prompt"].value, 256, a["batch"], a["weight_bits"], a["kv_bits"])
            message.value = "<br>".join([est.summary()] + diagnose(est))
        _guard(message, draw)

    redraw()
    return _box(c, [roof, ridge], redraw, message)
