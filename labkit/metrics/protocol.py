"""One fixed protocol for "is the cheaper model still the same model?": perplexity, KL and top-1, together.

A quantized (or otherwise cheapened) model is scored on a held-out text in windows of
`window` tokens every `stride` tokens (Hugging Face's perplexity guide): each window
predicts only the tokens no earlier window scored, with the rest of the window as
context. The same windows give every scored position's logits, so the KL divergence to
the float reference's next-token distribution and the top-1 agreement are measured on
exactly the positions the perplexity counts.

    >>> ref = reference_logits(model, ids, window=256, stride=128)                  # doctest: +SKIP
    >>> quality(qmodel, ids, reference=ref, window=256, stride=128)                  # doctest: +SKIP
    {'tokens': 1023, 'nll': 3.12, 'ppl': 22.6, 'kl': 0.004, 'top1': 0.97}
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from labkit import checks
from labkit.metrics.compare import kl_to_reference, top1_agreement

__all__ = ["windows", "scored_logits", "reference_logits", "quality"]


def windows(n_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first scored position) of each window over a text of `n_tokens` tokens.

    Window k covers ids[begin:end] and scores ids[first:end]; together they score every
    position 1 … n_tokens − 1 exactly once. A window begins at least one token before the first
    position it scores (the prediction of ids[first] is made at ids[first − 1]), so a window
    advances by at most window − 1 tokens even when `stride` equals `window`.

    >>> windows(10, 4, 2)
    [(0, 4, 1), (2, 6, 4), (4, 8, 6), (6, 10, 8)]
    >>> windows(10, 4, 4)
    [(0, 4, 1), (3, 7, 4), (6, 10, 7)]
    """
    checks.integer("window", window, 2)
    checks.integer("stride", stride, 1, window, why="at most the window")
    if n_tokens < 2:
        raise ValueError(f"the text must hold at least 2 tokens to score a prediction, got {n_tokens}")
    out, scored = [], 1  # ids[0] is never predicted
    end = min(window, n_tokens)
    while True:
        out.append((max(0, end - window), end, scored))
        scored = end
        if end == n_tokens:
            return out
        end = min(end + stride, scored - 1 + window, n_tokens)


@torch.inference_mode()
def scored_logits(model, ids, window: int, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [N, V] float32, targets [N]) of every position `windows` scores, N = len(ids) − 1."""
    if isinstance(ids, (str, bytes)):
        raise TypeError("ids must be token ids (a list of ints or a 1-D tensor), got text: encode it with the "
                        "model's tokenizer first (tok.encode(text))")
    if isinstance(ids, torch.Tensor) and ids.dim() != 1:
        raise ValueError(f"ids must be one sequence of token ids (1-D), got a tensor of shape {tuple(ids.shape)}")
    ids = [int(i) for i in ids]
    parts, targets = [], []
    for begin, end, first in windows(len(ids), window, stride):
        logits = model(torch.tensor([ids[begin:end]]))[0, :-1].float()  # predictions of ids[begin + 1:end]
        parts.append(logits[first - begin - 1:])
        targets.extend(ids[first:end])
    return torch.cat(parts), torch.tensor(targets)


def reference_logits(model, ids, window: int, stride: int) -> torch.Tensor:
    """The reference model's scored logits, to hand to `quality(..., reference=...)`."""
    return scored_logits(model, ids, window, stride)[0]


def quality(model, ids, window: int, stride: int, reference: torch.Tensor | None = None) -> dict:
    """tokens scored, nll (nats/token), ppl, and with `reference` (from `reference_logits` on the same ids,
    window and stride) the mean KL(reference ‖ model) in nats and the top-1 agreement."""
    logits, targets = scored_logits(model, ids, window, stride)
    nll = float(F.cross_entropy(logits, targets, reduction="mean"))
    row = {"tokens": int(targets.numel()), "nll": nll, "ppl": math.exp(nll)}
    if reference is not None:
        if reference.shape != logits.shape:
            raise ValueError(f"reference holds logits of shape {tuple(reference.shape)}, but these ids, window and "
                             f"stride score {tuple(logits.shape)}: compute it with reference_logits on the same text")
        row["kl"] = kl_to_reference(reference, logits)
        row["top1"] = top1_agreement(reference, logits)
    return row
