"""How far a cheaper computation's predictions are from a reference's, position by position.

The KV-cache, quantization and speculative-decoding chapters all ask the same question
(is the cheaper variant still the same model?) and answer it with the same two numbers:

- `kl_to_reference`: mean over positions of KL(p_ref ‖ p) = Σ p_ref · (log p_ref − log p),
  in nats; 0 when the distributions agree, and it weighs the tokens the reference
  believes in.
- `top1_agreement`: the share of positions whose argmax is the same; for greedy
  speculative decoding this is the acceptance rate α of a draft.

    >>> ref = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]])
    >>> top1_agreement(ref, torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]))
    0.5
    >>> kl_to_reference(ref, ref)
    0.0
"""
from __future__ import annotations

import torch

__all__ = ["kl_to_reference", "top1_agreement"]


def _pair(ref: torch.Tensor, got: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(ref, torch.Tensor) and isinstance(got, torch.Tensor)):
        raise TypeError(f"ref and got must be torch.Tensor logits, got {type(ref).__name__} and {type(got).__name__}")
    if ref.shape != got.shape or ref.dim() == 0:
        raise ValueError(f"ref and got must be logits of one shape [..., V], got {tuple(ref.shape)} and {tuple(got.shape)}")
    return ref.float().reshape(-1, ref.shape[-1]), got.float().reshape(-1, got.shape[-1])


def kl_to_reference(ref: torch.Tensor, got: torch.Tensor) -> float:
    """Mean KL(softmax(ref) ‖ softmax(got)) over positions (nats), for logits [..., V]."""
    ref, got = _pair(ref, got)
    log_ref, log_got = ref.log_softmax(-1), got.log_softmax(-1)
    return max(0.0, float((log_ref.exp() * (log_ref - log_got)).sum(-1).mean()))


def top1_agreement(ref: torch.Tensor, got: torch.Tensor) -> float:
    """Share of positions where argmax(got) == argmax(ref), for logits [..., V]."""
    ref, got = _pair(ref, got)
    return float((ref.argmax(-1) == got.argmax(-1)).float().mean())
