"""Widgets of chapter 01: type text and see its tokens; slide the vocabulary size and see compression move."""
from __future__ import annotations

__all__ = ["token_boundaries", "vocab_size_explorer"]


def token_boundaries(tokenizers, text: str = "The capital of France is Paris. 法国的首都是巴黎。 x = 12345"):
    """A text box and a tokenizer menu wired to `labkit.viz.token_boundaries_html`.

    `tokenizers`: one tokenizer or a dict name -> tokenizer.
    """
    import ipywidgets as widgets

    from labkit.viz.tokenization import token_boundaries_html

    if not isinstance(tokenizers, dict):
        tokenizers = {tokenizers.name: tokenizers}
    box = widgets.Textarea(value=text, description="text", layout=widgets.Layout(width="95%", height="80px"))
    menu = widgets.Dropdown(options=list(tokenizers), description="tokenizer")
    out = widgets.HTML()

    def redraw(_=None):
        out.value = str(token_boundaries_html(tokenizers[menu.value], box.value))

    box.observe(redraw, names="value")
    menu.observe(redraw, names="value")
    redraw()
    return widgets.VBox([menu, box, out])


def vocab_size_explorer(sweep, sample: str = "To be, or not to be, that is the question:"):
    """A vocabulary-size slider wired to `labkit.viz.vocab_size_figure`, with `sample` tokenized at that size."""
    import ipywidgets as widgets
    import plotly.graph_objects as go

    from labkit.tokenizer.stats import truncate
    from labkit.viz.tokenization import token_boundaries_html, vocab_size_figure

    sizes = sweep.vocab_sizes
    slider = widgets.SelectionSlider(options=sizes, value=sizes[len(sizes) // 2], description="vocab size")
    fig = go.FigureWidget(vocab_size_figure(sweep, slider.value))
    view = widgets.HTML()

    def redraw(_=None):
        new = vocab_size_figure(sweep, slider.value)
        with fig.batch_update():
            for trace, new_trace in zip(fig.data, new.data):
                trace.x, trace.y = new_trace.x, new_trace.y
            fig.layout.title.text = new.layout.title.text
        view.value = str(token_boundaries_html(truncate(sweep.tokenizer, slider.value), sample))

    slider.observe(redraw, names="value")
    redraw()
    return widgets.VBox([slider, fig, view])
