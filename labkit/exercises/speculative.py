"""Exercises of chapter 07: tokens per round, and the residual distribution a rejection draws from."""
from __future__ import annotations

import torch

from labkit.exercises._core import check

__all__ = ["check_expected_tokens", "check_residual"]


def check_expected_tokens(fn) -> bool:
    """Check `fn(alpha, gamma) -> tokens` one round emits on average (each draft token accepted with prob. alpha)."""
    from labkit.speculative import expected_tokens

    cases = [(0.0, 4), (0.5, 1), (0.5, 4), (0.8, 4), (0.9, 8), (0.3, 2), (1.0, 3)]
    return check("expected_tokens", fn, expected_tokens, cases,
                 hint="the round emits the accepted prefix plus one token: P(at least i accepted) = alpha^i, so "
                      "E = 1 + alpha + ... + alpha^gamma; and alpha = 1 accepts everything")


def check_residual(fn) -> bool:
    """Check `fn(p, q) -> distribution` a rejected position resamples from: norm(max(0, p − q))."""
    from labkit.speculative import residual

    cases = [(torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.3, 0.5])),
             (torch.tensor([0.1, 0.9]), torch.tensor([0.6, 0.4])),
             (torch.tensor([0.25, 0.25, 0.25, 0.25]), torch.tensor([0.7, 0.1, 0.1, 0.1])),
             (torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.0, 0.0, 1.0]))]
    return check("residual", fn, residual, cases,
                 hint="keep only where the target wants more than the draft gave: (p - q).clamp(min=0), then divide by its sum")
