"""Verification: keep the longest prefix of the draft the target agrees with, then one token of the target's own.

Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative Decoding"
(Algorithm 1); Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative
Sampling". The draft proposed x_1..x_γ with probabilities q_i(·); one target forward over
them gives p_1..p_{γ+1}. For i = 1..γ: accept x_i with probability min(1, p_i(x_i)/q_i(x_i));
at the first rejection draw the replacement from the residual norm(max(0, p_i − q_i)) and
stop; if all γ pass, draw a bonus token from p_{γ+1}. Every emitted token is then
distributed exactly as the target would have sampled it (the proof: P(x) = min(q, p) +
(1 − Σ min(q, p))·norm(p − q)⁺ = p). A drafter that proposes tokens deterministically has
q_i = one-hot(x_i): accept with probability p_i(x_i), residual p_i with x_i removed.

Greedy decoding (temperature 0) accepts x_i iff it is the target's argmax; the first
mismatch is replaced by the argmax; all pass gives the argmax of p_{γ+1}. The output is then
token for token the target's greedy output.

    >>> p = torch.tensor([[0.6, 0.4], [0.5, 0.5], [1.0, 0.0]])   # target at 3 positions
    >>> accept_greedy(p, torch.tensor([0, 1]))                      # argmax of row 1 is 0, not 1
    (1, 0)
"""
from __future__ import annotations

import torch

__all__ = ["accept_sampled", "accept_greedy", "residual"]


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)): where the target wants more mass than the draft gave. Falls back to p if p == q."""
    r = (p - q).clamp(min=0)
    total = r.sum()
    return r / total if float(total) > 0 else p


def accept_sampled(p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor,
                   generator: torch.Generator | None) -> tuple[int, int]:
    """(number of draft tokens accepted, the token that follows them) for target probs p [γ+1, V],
    draft probs q [γ, V] (None: the draft tokens were proposed deterministically) and tokens [γ]."""
    gamma = draft.numel()
    if p.shape[0] != gamma + 1 or (q is not None and q.shape != (gamma, p.shape[1])):
        raise ValueError(f"need p [γ+1, V] and q [γ, V] for γ = {gamma} draft tokens, got p {tuple(p.shape)}, "
                         f"q {None if q is None else tuple(q.shape)}")
    for i in range(gamma):
        x = int(draft[i])
        qx = 1.0 if q is None else float(q[i, x])
        px = float(p[i, x])
        u = float(torch.rand((), generator=generator))
        if qx > 0 and u < min(1.0, px / qx):
            continue
        q_row = torch.nn.functional.one_hot(draft[i], p.shape[1]).to(p.dtype) if q is None else q[i]
        return i, int(torch.multinomial(residual(p[i], q_row), 1, generator=generator))
    return gamma, int(torch.multinomial(p[gamma], 1, generator=generator))


def accept_greedy(p: torch.Tensor, draft: torch.Tensor) -> tuple[int, int]:
    """Greedy verification: accept while the draft token is the target's argmax (lowest id on ties)."""
    best = torch.argmax(p, dim=-1)
    for i in range(draft.numel()):
        if int(best[i]) != int(draft[i]):
            return i, int(best[i])
    return draft.numel(), int(best[draft.numel()])
