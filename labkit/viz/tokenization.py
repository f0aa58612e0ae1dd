"""Figures of chapter 01: token boundaries, vocabulary size vs compression, and what token counts cost.

References: the coloured-token view of OpenAI's tokenizer page and Karpathy's
minbpe lecture; prefill cost per token = 2 x parameters FLOPs (Kaplan et al. 2020,
the forward-pass estimate) for the model's matrix multiplies.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["HTMLText", "token_boundaries_html", "token_spans", "vocab_size_figure", "token_cost_figure", "token_costs"]

PALETTE = ["#fde2a7", "#b9e4c9", "#c6d8f7", "#f7c6d9", "#d9c6f7", "#c6f1f7"]
SPECIAL = "#444444"


class HTMLText(str):
    """A str of HTML that Jupyter shows rendered (its `_repr_html_`); still an ordinary str."""

    def _repr_html_(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"<HTML, {len(self)} characters>"


def token_spans(tok, text: str, allowed_special="all") -> list[tuple[list[int], str]]:
    """Group ids into the spans that display as text: ([ids], text) pairs.

    A token that ends inside a multi-byte character joins the next one, so every
    span is whole characters: '中' may be two tokens, [7906, 240] -> '中'.
    """
    ids = tok.encode(text, allowed_special=allowed_special)
    dec = tok.stream_decoder()
    spans, pending = [], []
    for i in ids:
        pending.append(i)
        piece = dec.push(i)
        if piece:
            spans.append((pending, piece))
            pending = []
    if pending:
        spans.append((pending, dec.flush()))
    return spans


def _visible(piece: str) -> str:
    # Make whitespace visible: a space is a middle dot, a newline an arrow and a real break.
    out = html.escape(piece).replace(" ", "·").replace("\t", "→").replace("\r", "␍")
    return out.replace("\n", "↵\n")


def token_boundaries_html(tok, text: str, allowed_special="all", summary: bool = True) -> HTMLText:
    """Text with each token on its own coloured background; hover shows the ids and bytes.

    Spaces show as '·', newlines as '↵'. Special tokens are white on dark.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    spans = token_spans(tok, text, allowed_special)
    parts = []
    for k, (ids, piece) in enumerate(spans):
        raw = tok.decode_bytes(ids)
        title = html.escape(f"id {' + '.join(map(str, ids))}: {raw!r}", quote=True)
        if len(ids) == 1 and tok.is_special(ids[0]):
            style = f"background:{SPECIAL};color:white"
        else:
            style = f"background:{PALETTE[k % len(PALETTE)]}"
            if len(ids) > 1:  # one character split over several byte tokens
                style += ";outline:1px dashed #888"
        parts.append(f'<span style="{style};border-radius:3px;padding:1px 0" title="{title}">{_visible(piece)}</span>')
    body = "".join(parts)
    out = f'<div style="font-family:monospace;white-space:pre-wrap;line-height:1.9">{body}</div>'
    if summary:
        n_ids = sum(len(ids) for ids, _ in spans)
        n_bytes = len(text.encode("utf-8"))
        out += (
            f'<div style="font-size:90%;color:#555">{n_ids} tokens · {len(text)} characters · {n_bytes} bytes'
            f" · {n_bytes / max(n_ids, 1):.2f} bytes per token ({html.escape(tok.name)}, vocab {tok.vocab_size:,})</div>"
        )
    return HTMLText(out)


def vocab_size_figure(sweep, vocab_size: int) -> go.Figure:
    """Compression, tokens per word and training time against vocabulary size; `vocab_size` marked."""
    row = sweep.at(vocab_size)
    x = sweep.vocab_sizes
    fig = make_subplots(rows=1, cols=3, subplot_titles=("bytes per token<br>(higher: shorter sequences)", "tokens per word<br>(lower: fewer steps)", "training time (s)"))
    series = [sweep.bytes_per_token, sweep.tokens_per_word, sweep.train_seconds]
    keys = ["bytes_per_token", "tokens_per_word", "train_seconds"]
    for col, (y, key) in enumerate(zip(series, keys), start=1):
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", line=dict(color="#4c72b0"), showlegend=False), row=1, col=col)
        fig.add_trace(
            go.Scatter(x=[vocab_size], y=[row[key]], mode="markers", marker=dict(size=14, color="#c44e52"), showlegend=False),
            row=1, col=col,
        )
        fig.update_xaxes(title_text="vocabulary size", type="log", dtick="D2", row=1, col=col)
    fig.update_layout(
        title=(
            f"vocab {vocab_size:,}: {row['bytes_per_token']:.2f} bytes/token, {row['tokens_per_word']:.2f} tokens/word, "
            f"trained in {row['train_seconds']:.2f} s on {sweep.train_bytes / 1e6:.1f} MB"
        ),
        height=380,
        margin=dict(t=100, l=40, r=20, b=50),
    )
    return fig


def token_costs(tokenizers: dict, texts: dict[str, str], n_params: float, head_params: float = 0) -> list[dict]:
    """Token count and prefill FLOPs of each text under each tokenizer.

    Prefill multiplies every prompt token by the `n_params` weights of the layers (2 FLOPs per
    weight) and runs the LM head (`head_params` weights) for the last position only, as
    `labkit.prefill` does: 2 x (n_params x tokens + head_params).
    """
    if not (isinstance(n_params, (int, float)) and n_params > 0):
        raise ValueError(f"n_params must be a positive number, got {n_params!r}")
    if not (isinstance(head_params, (int, float)) and head_params >= 0):
        raise ValueError(f"head_params must be a number >= 0, got {head_params!r}")
    rows = []
    for tok_name, tok in tokenizers.items():
        for label, text in texts.items():
            n = len(tok.encode(text, allowed_special="none"))
            rows.append({"tokenizer": tok_name, "text": label, "characters": len(text), "bytes": len(text.encode("utf-8")),
                         "tokens": n, "prefill_gflop": 2 * (n_params * n + head_params) / 1e9})
    return rows


def token_cost_figure(rows: list[dict]) -> go.Figure:
    """Grouped bars: tokens per text for each tokenizer, with the prefill GFLOP it costs on hover and as labels."""
    fig = go.Figure()
    for tok_name in dict.fromkeys(r["tokenizer"] for r in rows):
        mine = [r for r in rows if r["tokenizer"] == tok_name]
        fig.add_trace(go.Bar(
            x=[r["text"] for r in mine], y=[r["tokens"] for r in mine], name=tok_name,
            text=[f"{r['tokens']} tok<br>{r['prefill_gflop']:.1f} GFLOP" for r in mine], textposition="outside",
        ))
    fig.update_layout(barmode="group", title="the same request, three ways: tokens and prefill work (2 x params x tokens)",
                      yaxis_title="tokens", height=380, margin=dict(t=60, l=50, r=20, b=40))
    return fig
