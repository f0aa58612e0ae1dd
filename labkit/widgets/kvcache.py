"""Widgets of chapter 04: sliders wired to the figures of `labkit.viz.kvcache`."""
from __future__ import annotations

__all__ = ["kv_memory_calculator", "block_size_explorer", "window_explorer", "sliding_slots_explorer", "compression_explorer"]

from labkit.widgets._refresh import figure_box as _figure_box

CONTEXTS = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]


def kv_memory_calculator(names=None, context: int = 4096, bits: int = 16):
    """Context and bit-width sliders over the presets' KV cache size (`labkit.viz.kv_memory_figure`)."""
    import ipywidgets as widgets

    from labkit.model.config import PRESETS
    from labkit.viz.kvcache import kv_memory_figure

    names = list(names or [n for n, shape in PRESETS.items() if not shape.get("csa_block")])  # per-token sizes: dense
    ctx = widgets.SelectionSlider(options=CONTEXTS, value=context, description="context")
    b = widgets.ToggleButtons(options=[32, 16, 8, 4], value=bits, description="bits")
    return _figure_box([ctx, b], lambda: kv_memory_figure(names, ctx.value, b.value))


def block_size_explorer(lengths, max_len: int = 2048, block_size: int = 16):
    """Block-size slider: empty slots of a paged cache vs preallocation (`labkit.viz.block_size_figure`)."""
    import ipywidgets as widgets

    from labkit.viz.kvcache import block_size_figure

    bs = widgets.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256], value=block_size, description="block size")
    return _figure_box([bs], lambda: block_size_figure(lengths, bs.value, max_len))


def window_explorer(model, ids, rows, full_ppl: float, window: int = 128, sinks=(0, 4)):
    """Window slider; each new window's perplexity is measured on release (`labkit.viz.window_perplexity_figure`).

    `rows` (from `labkit.kvcache.evaluate.window_perplexities`) are the points measured so far; new
    ones are added to it.
    """
    import ipywidgets as widgets

    from labkit.kvcache.evaluate import window_perplexities
    from labkit.viz.kvcache import window_perplexity_figure

    w = widgets.SelectionSlider(options=[16, 32, 64, 128, 256, 512], value=window, description="window",
                                continuous_update=False)

    def figure():
        missing = [s for s in sinks if not any(r["window"] == w.value and r["sinks"] == s for r in rows)]
        if missing:
            rows.extend(window_perplexities(model, ids, [w.value], sinks=missing))
        return window_perplexity_figure(rows, full_ppl, w.value)

    return _figure_box([w], figure)


def sliding_slots_explorer(window: int = 16, sinks: int = 4, seen: int = 40):
    """Sliders for tokens seen, window and sinks: which tokens the sliding cache keeps (`labkit.viz.sliding_slots_figure`)."""
    import ipywidgets as widgets

    from labkit.viz.kvcache import sliding_slots_figure

    n = widgets.IntSlider(value=seen, min=1, max=200, description="tokens seen")
    w = widgets.IntSlider(value=window, min=2, max=64, description="window")
    s = widgets.IntSlider(value=sinks, min=0, max=8, description="sinks")

    def figure():
        return sliding_slots_figure(n.value, max(w.value, s.value + 1), s.value)

    return _figure_box([n, w, s], figure)


def compression_explorer(stored: dict, fraction: float = 0.25):
    """Budget slider over stored equal-bytes tables (`labkit.viz.compression_figure`): `stored` as
    `labkit.benchmarks.kvcache.compression_tables` returns it (or `data/kv_compression.json`'s "eviction")."""
    import ipywidgets as widgets

    from labkit.viz.kvcompression import compression_figure

    tables = {t["fraction"]: t for t in stored["tables"]}
    if fraction not in tables:
        raise ValueError(f"fraction must be one of the stored budgets {sorted(tables)}, got {fraction!r}")
    f = widgets.SelectionSlider(options=[(f"{x:.0%}", x) for x in sorted(tables)], value=fraction, description="budget")
    return _figure_box([f], lambda: compression_figure(tables[f.value]))
