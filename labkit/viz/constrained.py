"""Chapter 05's constrained-decoding figure: how many tokens the format allows at each step, and how much of the
model's own probability those tokens had."""
from __future__ import annotations

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from labkit.viz.sampling import token_label

__all__ = ["constraint_steps", "constraint_masks_figure", "dfa_figure"]


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


def _edge_label(byte_values: list[int]) -> str:
    """Bytes as the characters they are, runs of consecutive ones as a range: [0-9], 'y', [a-z_]."""
    chars, run = [], [byte_values[0], byte_values[0]]
    for b in byte_values[1:] + [None]:
        if b is not None and b == run[1] + 1:
            run[1] = b
            continue
        show = lambda v: chr(v) if 32 < v < 127 else f"\\x{v:02x}"  # noqa: E731
        chars.append(show(run[0]) if run[0] == run[1] else f"{show(run[0])}-{show(run[1])}")
        if b is not None:
            run = [b, b]
    return chars[0] if len(chars) == 1 and len(byte_values) == 1 else "[" + "".join(chars) + "]"


def dfa_figure(dfa, title: str | None = None) -> go.Figure:
    """The automaton drawn: states in columns by their distance from the start, one arrow per (state, next state)
    labelled with the bytes that take it; accepting states ringed."""
    if dfa.n_states > 60:
        raise ValueError(f"the automaton has {dfa.n_states} states; dfa_figure draws 60 at most (try a smaller regex)")
    depth, order = {0: 0}, [0]
    for s in order:
        for t in sorted(set(int(v) for v in dfa.table[s] if v >= 0)):
            if t not in depth:
                depth[t] = depth[s] + 1
                order.append(t)
    rows: dict[int, list[int]] = {}
    for s in order:
        rows.setdefault(depth[s], []).append(s)
    pos = {s: (d, -i) for d, states in rows.items() for i, s in enumerate(states)}
    fig = go.Figure()
    for s in order:
        targets: dict[int, list[int]] = {}
        for b in range(256):
            if dfa.table[s, b] >= 0:
                targets.setdefault(int(dfa.table[s, b]), []).append(b)
        for t, byte_values in targets.items():
            (x0, y0), (x1, y1) = pos[s], pos[t]
            label = _edge_label(byte_values)
            if s == t:  # a loop: a label above the state
                fig.add_annotation(x=x0, y=y0 + 0.28, text=f"↻ {label}", showarrow=False, font=dict(size=12))
                continue
            fig.add_annotation(x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y", showarrow=True,
                               arrowhead=2, arrowsize=1.2, standoff=14, startstandoff=14, arrowcolor="#888")
            fig.add_annotation(x=(x0 + x1) / 2, y=(y0 + y1) / 2 + 0.12, text=label, showarrow=False,
                               font=dict(size=12, color="#333"))
    fig.add_trace(go.Scatter(
        x=[pos[s][0] for s in order], y=[pos[s][1] for s in order], mode="markers+text", text=[str(s) for s in order],
        textposition="middle center", hovertext=[("accepting " if dfa.accepting[s] else "") + f"state {s}" for s in order],
        marker=dict(size=30, color=["#c7e9c0" if dfa.accepting[s] else "#deebf7" for s in order],
                    line=dict(width=[4 if dfa.accepting[s] else 1 for s in order], color="#333")), showlegend=False))
    fig.update_xaxes(visible=False, range=[-0.5, max(rows) + 0.5])
    fig.update_yaxes(visible=False, range=[-max(len(v) for v in rows.values()) + 0.5, 0.6])
    fig.update_layout(title=title or f"The DFA of {dfa.pattern!r} (start: state 0; ringed: accepting)", height=300,
                      plot_bgcolor="white", margin=dict(t=60, l=20, r=20, b=20))
    return fig
