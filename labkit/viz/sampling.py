"""Figures of chapter 05: one next-token distribution reshaped stage by stage.

`sampling_stage_probs` runs `labkit.sampling.process_stages` and keeps, for the most likely
tokens, the probability after every stage of the chosen order (NaN once a token is removed).
`sampling_pipeline_figure` draws it: a grid of stages x tokens, and below it the input and
final distributions side by side.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labkit.sampling.pipeline import ORDERS, SamplingParams, process_stages

__all__ = ["StageProbs", "sampling_stage_probs", "sampling_pipeline_figure", "token_label", "repetition_rate_figure"]

STAGE_LABELS = {
    "input": "input",
    "repetition_penalty": "repetition penalty",
    "frequency_presence": "freq./presence penalty",
    "temperature": "temperature",
    "top_k": "top-k",
    "top_p": "top-p",
    "min_p": "min-p",
    "typical_p": "typical-p",
    "greedy": "greedy (argmax)",
}


def token_label(tok, token_id: int) -> str:
    """A token as a short visible string: spaces as '␣', newlines as '↵'.

    >>> token_label(None, 42)
    '#42'
    """
    if tok is None:
        return f"#{token_id}"
    text = tok.decode([int(token_id)])
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") or f"#{token_id}"


@dataclass
class StageProbs:
    """Probabilities of the `top_n` most likely input tokens after each stage (rows), NaN = removed."""

    stages: list[str]          # row labels, "input" first, in pipeline order
    token_ids: list[int]       # columns: the most likely input tokens, most likely first
    probs: np.ndarray          # [len(stages), top_n]
    kept: list[int]            # how many tokens of the whole vocabulary survive each stage
    active: list[bool]         # False for a stage whose knob is at its neutral value (a copy of the row above)


def sampling_stage_probs(logits, history=None, params: SamplingParams | None = None, top_n: int = 15, **knobs) -> StageProbs:
    """Track the `top_n` most likely tokens through every stage of the pipeline.

    >>> l = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    >>> sp = sampling_stage_probs(l, temperature=1.0, top_k=2, top_n=4)
    >>> sp.kept
    [4, 4, 4, 4, 2, 2, 2, 2]
    """
    params = SamplingParams.from_kwargs(params, **knobs)
    if logits.dim() != 1:
        raise ValueError(f"logits must have shape [V], got {tuple(logits.shape)}")
    if not isinstance(top_n, int) or top_n < 1:
        raise ValueError(f"top_n must be an int >= 1, got {top_n!r}")
    done = dict(process_stages(logits, history, params))
    names = ["input"] + list(ORDERS[params.order])
    if params.greedy:  # greedy skips the truncation stages; its argmax replaces the temperature row
        names = ["input", "repetition_penalty", "frequency_presence", "greedy"]
    ids = torch.argsort(done["input"], descending=True, stable=True)[: min(top_n, logits.numel())]
    rows, kept, active, current = [], [], [], done["input"]
    for name in names:
        active.append(name in done)
        current = done.get(name, current)
        p = torch.softmax(current.double(), dim=-1)
        row = p[ids].numpy().copy()
        row[~torch.isfinite(current[ids]).numpy()] = np.nan
        rows.append(row)
        kept.append(int(torch.isfinite(current).sum()))
    return StageProbs([STAGE_LABELS[n] for n in names], ids.tolist(), np.stack(rows), kept, active)


def sampling_pipeline_figure(logits, tok=None, history=None, params: SamplingParams | None = None,
                             top_n: int = 15, **knobs) -> go.Figure:
    """Stages x tokens grid (probability in %, blank once removed) above input vs final bars."""
    params = SamplingParams.from_kwargs(params, **knobs)
    sp = sampling_stage_probs(logits, history, params, top_n)
    labels = [token_label(tok, i) for i in sp.token_ids]
    seen: dict[str, int] = {}
    for j, lab in enumerate(labels):  # plotly merges equal category names: keep them apart
        seen[lab] = seen.get(lab, 0) + 1
        if seen[lab] > 1:
            labels[j] = f"{lab} #{sp.token_ids[j]}"
    rows = [f"{s} ({k} kept)" if a or s == "input" else f"{s} (off)" for s, k, a in zip(sp.stages, sp.kept, sp.active)]
    pct = sp.probs * 100
    text = [["" if np.isnan(v) else f"{v:.1f}" for v in row] for row in pct]
    fig = make_subplots(rows=2, cols=1, row_heights=[0.62, 0.38], vertical_spacing=0.12, shared_xaxes=True)
    fig.add_trace(go.Heatmap(z=pct, x=labels, y=rows, text=text, texttemplate="%{text}", colorscale="Blues",
                             zmin=0, zmax=100, showscale=False, hoverongaps=False,
                             hovertemplate="%{x} after %{y}: %{z:.2f}%<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=pct[0], name="input", marker_color="#bbbbbb"), row=2, col=1)
    fig.add_trace(go.Bar(x=labels, y=np.nan_to_num(pct[-1]), name="after the pipeline", marker_color="#1f77b4"), row=2, col=1)
    mode = "greedy" if params.greedy else f"order: {params.order}"
    fig.update_layout(
        title=f"Which tokens survive each stage ({mode}): {sp.kept[0]} -> {sp.kept[-1]} tokens",
        barmode="group", height=560, margin=dict(l=10, r=10, t=60, b=10),
        legend=dict(orientation="h", y=-0.08),
    )
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(title_text="probability (%)", row=2, col=1)
    return fig


def repetition_rate_figure(penalties, rates, n: int = 3, title: str | None = None) -> go.Figure:
    """Repeated-n-gram rate (share of n-grams seen before) against the repetition penalty.

    `rates` is one list per penalty (one value per prompt or seed); the mean is drawn as a line.
    """
    penalties = list(penalties)
    rates = [list(np.atleast_1d(r)) for r in rates]
    if len(penalties) != len(rates):
        raise ValueError(f"penalties and rates must have the same length, got {len(penalties)} and {len(rates)}")
    fig = go.Figure()
    xs = [p for p, r in zip(penalties, rates) for _ in r]
    ys = [v for r in rates for v in r]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="one text", marker=dict(color="#bbbbbb", size=8)))
    fig.add_trace(go.Scatter(x=penalties, y=[float(np.mean(r)) for r in rates], mode="lines+markers", name="mean"))
    fig.update_layout(
        title=title or f"Repeated {n}-grams vs repetition penalty",
        xaxis_title="repetition penalty", yaxis_title=f"repeated {n}-gram rate", yaxis_rangemode="tozero", height=380,
    )
    return fig
