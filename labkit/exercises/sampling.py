"""Exercises of chapter 05: write top-p (nucleus) filtering and the repetition penalty."""
from __future__ import annotations

import torch

from labkit.exercises._core import check
from labkit.sampling.processors import apply_repetition_penalty, token_counts, top_p_filter

__all__ = ["check_top_p", "check_repetition_penalty"]


def _reference_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    return top_p_filter(logits.unsqueeze(0), top_p)[0]


def _reference_repetition_penalty(logits: torch.Tensor, history: list[int], penalty: float) -> torch.Tensor:
    counts = token_counts(torch.tensor([history], dtype=torch.long).reshape(1, -1), logits.numel())
    return apply_repetition_penalty(logits.unsqueeze(0), counts, penalty)[0]


def _top_p_cases() -> list[tuple]:
    gen = torch.Generator().manual_seed(5)
    cases = [
        (torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64).log(), 0.75),  # keeps 2: 0.8 >= 0.75
        (torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64).log(), 0.9),   # keeps 3
        (torch.tensor([0.05, 0.15, 0.5, 0.3], dtype=torch.float64).log(), 0.6),   # unsorted input
        (torch.tensor([0.9, 0.05, 0.05], dtype=torch.float64).log(), 0.5),        # one token is enough
        (torch.tensor([2.0, 1.0, 0.0, -1.0], dtype=torch.float64), 1.0),          # p = 1 keeps all
    ]
    for top_p in (0.3, 0.9):  # random logits, away from the boundary
        cases.append((torch.randn(12, generator=gen, dtype=torch.float64) * 2, top_p))
    return cases


def check_top_p(fn) -> bool:
    """Check `fn(logits [V], top_p) -> logits [V]` with the removed tokens at -inf.

    Keep the smallest set of most likely tokens whose probabilities add up to at least
    top_p (the token that crosses top_p is kept), as Hugging Face and llama.cpp do.
    """
    return check(
        "top_p",
        fn,
        _reference_top_p,
        _top_p_cases(),
        hint="sort the probabilities in descending order, take the cumulative sum, and keep every "
        "token up to and including the first one where the sum reaches top_p; set the rest to -inf",
    )


def check_repetition_penalty(fn) -> bool:
    """Check `fn(logits [V], history: list[int], penalty) -> logits [V]` (CTRL's penalty, HF's sign rule)."""
    cases = [
        (torch.tensor([2.0, -1.0, 0.5, 0.0]), [0, 1, 3], 2.0),   # divide positive, multiply negative
        (torch.tensor([2.0, -1.0, 0.5, 0.0]), [0, 1, 3], 0.5),   # penalty < 1 rewards repeats
        (torch.tensor([3.0, 1.0, -2.0]), [0, 0, 0, 2], 1.5),      # once per distinct token, not per occurrence
        (torch.tensor([1.0, -1.0]), [], 1.3),                     # no history: unchanged
        (torch.tensor([4.0, -4.0, 1.0, 1.0]), [2, 1], 1.0),       # penalty 1: unchanged
    ]
    return check(
        "repetition_penalty",
        fn,
        _reference_repetition_penalty,
        cases,
        hint="for each distinct token in the history: a positive logit is divided by the penalty, "
        "a negative one multiplied by it (so both become less likely when penalty > 1)",
    )
