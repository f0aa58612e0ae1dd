"""Widgets of chapter 03, the measured half: prompt- and reply-length sliders over this machine's timings."""
from __future__ import annotations

from labkit.measure.clock import now as clock_now

__all__ = ["reply_time_explorer"]


def reply_time_explorer(ttft_rows, itl_rows, model=None, prompt_len: int = 256, reply_len: int = 64):
    """Prompt and reply sliders: one reply's prefill and decode time estimated from the measured sweeps
    (`labkit.viz.reply_time_figure`); with a `model`, a button measures that reply live."""

    import ipywidgets as widgets
    import plotly.graph_objects as go

    from labkit.viz.prefill_decode import reply_time_figure
    from labkit.widgets._refresh import refresh

    p = widgets.SelectionSlider(options=[16, 32, 64, 128, 256, 512, 1024, 2048], value=prompt_len, description="prompt")
    r = widgets.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512], value=reply_len, description="reply")
    measured: dict = {}
    fw = go.FigureWidget(reply_time_figure(ttft_rows, itl_rows, p.value, r.value))

    def redraw(_=None):
        key = (p.value, r.value)
        refresh(fw, reply_time_figure(ttft_rows, itl_rows, p.value, r.value, measured.get(key)))

    def measure(_=None):
        import labkit
        from labkit.generation.latency import filler_ids

        button.disabled, button.description = True, "measuring..."
        start = clock_now()
        state = labkit.prefill(model, filler_ids(p.value, model.config.vocab_size), max_len=p.value + r.value)
        int(state.logits.argmax())
        ttft = clock_now() - start
        labkit.decode(model, state, r.value - 1)
        measured[(p.value, r.value)] = {"ttft_s": ttft, "decode_s": clock_now() - start - ttft}
        button.disabled, button.description = False, "measure this reply"
        redraw()

    p.observe(redraw, names="value")
    r.observe(redraw, names="value")
    controls = [p, r]
    if model is not None:
        button = widgets.Button(description="measure this reply")
        button.on_click(measure)
        controls.append(button)
    return widgets.VBox([widgets.HBox(controls), fw])
