"""Figures of chapter 04: what the KV cache saves (time), what it costs (memory), and its variants.

    >>> fig = kv_memory_figure(["llama-2-7b", "llama-3-8b"], context=4096)   # doctest: +SKIP
"""
from __future__ import annotations

import plotly.graph_objects as go

from labkit.model.config import ModelConfig
from labkit.kvcache.memory import contiguous_fragmentation, memory_rows, paged_fragmentation, paged_slots

__all__ = ["kv_memory_figure", "cache_speedup_figure", "window_perplexity_figure", "block_size_figure",
           "kv_quant_figure", "sliding_slots_figure"]

_LAYOUT = dict(height=420, margin=dict(t=70, l=60, r=20, b=50), legend=dict(orientation="h", y=-0.2))


def kv_memory_figure(names, context: int = 4096, bits: float = 16) -> go.Figure:
    """Cache size at `context` tokens per preset name, next to what the same model would need with MHA."""
    rows = memory_rows([ModelConfig.from_name(n) for n in names], context, bits)
    x = [r["model"] for r in rows]
    fig = go.Figure([
        go.Bar(x=x, y=[r["cache_bytes"] / 1e9 for r in rows], name="KV cache (as built)",
               text=[f"{r['cache_bytes'] / 1e9:.2f} GB" for r in rows], textposition="outside"),
        go.Bar(x=x, y=[r["mha_bytes_per_token"] * context / 1e9 for r in rows], name="same model with MHA (n_kv_heads = n_heads)",
               marker=dict(color="rgba(0,0,0,0.15)")),
    ])
    fig.update_layout(title=f"KV cache at {context:,} tokens, {bits:g}-bit values (batch 1)", barmode="group",
                      yaxis=dict(title="GB"), **_LAYOUT)
    return fig


def cache_speedup_figure(rows, level: float = 5.0, predicted=None) -> go.Figure:
    """Measured speed-up of the KV cache vs generated length (rows of `labkit.generation.latency.speedup_run`),
    with the `level` line and, optionally, a `predicted` curve [(new_tokens, speedup), ...]."""
    from labkit.generation.latency import crossing

    n = [r["new_tokens"] for r in rows]
    fig = go.Figure(go.Scatter(x=n, y=[r["speedup"] for r in rows], mode="lines+markers", name="measured"))
    if predicted:
        fig.add_trace(go.Scatter(x=[p[0] for p in predicted], y=[p[1] for p in predicted], mode="lines",
                                 line=dict(dash="dot"), name="predicted from a calibration run"))
    fig.add_hline(y=level, line=dict(color="red", dash="dash"), annotation_text=f"{level:g}x")
    cross = crossing(rows, "new_tokens", "speedup", level)
    where = f"crosses {level:g}x at about {cross:.0f} new tokens" if cross else f"stays below {level:g}x up to {n[-1]} tokens"
    if predicted and not cross:
        p_cross = crossing([{"n": a, "s": b} for a, b in predicted], "n", "s", level)
        where += f"; predicted to cross at about {p_cross:.0f}" if p_cross else f"; predicted below it up to {predicted[-1][0]}"
    fig.update_layout(title=f"KV cache speed-up over re-running the sequence:<br>measured, it {where}",
                      xaxis=dict(title="generated tokens"), yaxis=dict(title="time without cache / time with cache"), **_LAYOUT)
    return fig


def window_perplexity_figure(rows, full_ppl: float | None = None, window: int | None = None) -> go.Figure:
    """Perplexity vs window size, one line per sink count (rows of `labkit.kvcache.evaluate.window_perplexities`)."""
    fig = go.Figure()
    for s in sorted({r["sinks"] for r in rows}):
        pts = sorted((r["window"], r["ppl"]) for r in rows if r["sinks"] == s)
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[round(p[1], 2) for p in pts], mode="lines+markers",
                                 name=f"{s} sink tokens" if s else "no sinks (plain window)"))
    # drawn as traces: a line's annotation on a log axis takes log10 coordinates (it stretched the axis to 1e18)
    xs = [r["window"] for r in rows] + ([window] if window is not None else [])
    lo, hi = min(xs), max(xs)
    if full_ppl is not None:
        fig.add_trace(go.Scatter(x=[lo, hi], y=[round(full_ppl, 2)] * 2, mode="lines", line=dict(color="black", dash="dot"),
                                 name=f"full cache {full_ppl:.1f}"))
    if window is not None:
        ys = [r["ppl"] for r in rows] + ([full_ppl] if full_ppl is not None else [])
        fig.add_trace(go.Scatter(x=[window, window], y=[min(ys), max(ys)], mode="lines", line=dict(color="gray"),
                                 name=f"window {window}"))
    fig.update_layout(title="Perplexity on long text through a sliding window", xaxis=dict(title="window (tokens)", type="log"),
                      yaxis=dict(title="perplexity (lower is better)", type="log"), **_LAYOUT)
    return fig


def block_size_figure(lengths, block_size: int, max_len: int) -> go.Figure:
    """Slots reserved vs used for sequences of `lengths`: paged with `block_size` vs preallocated at `max_len`."""
    lengths = list(lengths)
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    reserved = [paged_slots([n], block_size) for n in lengths]
    names = [f"seq {i}" for i in range(len(lengths))]
    fig = go.Figure([
        go.Bar(x=names, y=lengths, name="tokens", marker=dict(color="#1f77b4")),
        go.Bar(x=names, y=[r - n for r, n in zip(reserved, lengths)], name=f"empty slots, paged (block {block_size})",
               marker=dict(color="#ff7f0e")),
        go.Scatter(x=names, y=[max_len] * len(lengths), mode="lines", name=f"preallocated: {max_len} slots each",
                   line=dict(color="red", dash="dash")),
    ])
    paged = paged_fragmentation(lengths, block_size)
    fixed = contiguous_fragmentation(lengths, max_len)
    curve = ", ".join(f"{b}: {paged_fragmentation(lengths, b):.0%}" for b in sizes)
    fig.update_layout(barmode="stack", title=(f"Block size {block_size}: {paged:.1%} of reserved slots empty "
                                              f"(preallocated at {max_len}: {fixed:.1%})<br><sub>block size → waste: {curve}</sub>"),
                      yaxis=dict(title="token slots"), **_LAYOUT)
    return fig


def kv_quant_figure(rows) -> go.Figure:
    """Memory vs logit error of the quantized caches (rows of `labkit.kvcache.evaluate.quantized_error_rows`)."""
    floor = 1e-7  # a log axis has no 0: an exact cache is drawn at this floor, and its label says so
    labels = [f"{r['bits']}-bit" + (" (float)" if r["max_abs_err"] == 0 else "")
              + (f": KL {r['kl']:.0g}, drawn at {floor:g}" if r["kl"] < floor else "") for r in rows]
    fig = go.Figure(go.Scatter(x=[round(r["bytes_used"] / r["float_bytes"], 4) for r in rows],
                               y=[float(f"{max(r['kl'], floor):.2g}") for r in rows],
                               mode="markers+text", text=labels, textposition="top center", marker=dict(size=12),
                               name="cache"))
    fig.update_layout(title="Quantized KV cache: memory against the float cache vs error of the next-token distribution",
                      xaxis=dict(title="bytes used / float cache bytes", range=[0, 1.1]),
                      yaxis=dict(title="mean KL(float ‖ quantized), nats", type="log"), **_LAYOUT)
    return fig


def sliding_slots_figure(seen: int, window: int, sinks: int) -> go.Figure:
    """Which of the first `seen` tokens a sliding cache (window, sinks) still holds, and their slots."""
    if not 0 < sinks + 1 <= window:
        raise ValueError(f"window must be larger than sinks, got window={window} and sinks={sinks}")
    if seen <= window:
        kept = list(range(seen))
    else:
        kept = list(range(sinks)) + list(range(seen - (window - sinks), seen))
    kept_set = set(kept)
    evicted = [t for t in range(seen) if t not in kept_set]
    fig = go.Figure([
        go.Scatter(x=kept, y=list(range(len(kept))), mode="markers", name="kept: text position → cache slot",
                   marker=dict(size=6, color=["#d62728" if t < sinks else "#1f77b4" for t in kept])),
        go.Scatter(x=evicted, y=[-1] * len(evicted), mode="markers", name="evicted", marker=dict(size=4, color="lightgray")),
    ])
    fig.update_layout(title=f"{seen} tokens seen, {len(kept)} kept: {min(sinks, seen)} sinks (red) + the latest {len(kept) - min(sinks, seen)}",
                      xaxis=dict(title="position in the text"), yaxis=dict(title="cache slot = RoPE position"), **_LAYOUT)
    return fig
