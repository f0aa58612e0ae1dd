"""Chapter 05's constrained-decoding figure: how many tokens the format allows at each step, and how much of the
model's own probability those tokens had."""
from __future__ import annotations

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labkit.viz.sampling import token_label

__all__ = ["constraint_steps", "constraint_masks_figure"]


@torch.inference_mode()
def constraint_steps(model, tok, prompt_ids: list[int], constraint, max_new_tokens: int = 24) -> list[dict]:
    """Greedy constrained decoding, step by step: the token chosen (`id`, and `token` as a label), how many tokens
    were allowed, the mass the unconstrained distribution put on them, and what it would have chosen."""
    ids, steps = list(prompt_ids), []
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([ids]))[0, -1].float()
        probs = torch.softmax(logits, -1)
        mask = constraint.automaton.mask(constraint.state)
        token = int(constraint.apply(logits).argmax())
        steps.append({"id": token, "token": token_label(tok, token), "allowed": int(mask.sum()), "p_legal": float(probs[mask].sum()),
                      "free": token_label(tok, int(probs.argmax())), "state": constraint.state})
        if token == getattr(tok, "eos_id", None):
            break
        constraint.advance(token)
        ids.append(token)
        if constraint.done:
            break
    return steps


def constraint_masks_figure(steps: list[dict], vocab_size: int, title: str | None = None) -> go.Figure:
    """Two rows over the steps of a constrained reply: tokens allowed (log scale, out of `vocab_size`), and the
    probability the unconstrained model gave to them (the mask renormalises over that mass)."""
    if not steps:
        raise ValueError("steps is empty: run constraint_steps first")
    x = list(range(len(steps)))
    labels = [s["token"] for s in steps]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=(f"tokens the format allows (of {vocab_size})",
                                        "probability the model gave them before the mask"))
    fig.add_trace(go.Bar(x=x, y=[s["allowed"] for s in steps], text=labels, textposition="outside", name="allowed",
                         hovertext=[f"chosen {s['token']!r}; unconstrained choice {s['free']!r}" for s in steps]),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=[s["p_legal"] for s in steps], mode="lines+markers", name="legal mass"),
                  row=2, col=1)
    fig.update_yaxes(type="log", title_text="tokens", row=1, col=1)
    fig.update_yaxes(range=[0, 1.05], title_text="probability", row=2, col=1)
    fig.update_xaxes(title_text="step", row=2, col=1)
    fig.update_layout(title=title or "Constrained decoding: the mask at each step", height=520, showlegend=False,
                      margin=dict(t=90))
    return fig
