"""How well a model predicts a text: negative log-likelihood and perplexity, with or without a KV cache.

perplexity = exp(mean over positions t >= 1 of −log p(ids[t] | ids[:t])), in nats; a
lossy cache (a sliding window, a quantized cache) is measured by streaming the text
through it, StreamingLLM's evaluation (Xiao et al. 2024, §4.1): every token is
predicted from what the cache still holds. The text goes in chunks (`chunk` tokens per
forward pass) rather than one token at a time, which is the same policy at a fraction
of the cost.

    >>> perplexity(model, ids)                                                         # doctest: +SKIP
    >>> perplexity(model, ids, cache=model.new_cache("sliding", window=128, sinks=4))  # doctest: +SKIP
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from labkit.metrics.protocol import scored_logits

__all__ = ["cache_logits", "nll", "perplexity", "bits_per_byte"]


@torch.inference_mode()
def cache_logits(model, ids, cache=None, chunk: int = 32) -> torch.Tensor:
    """Logits [T, V] for every position of `ids`, streamed through `cache` in chunks (None: one pass, no cache)."""
    x = torch.as_tensor(list(ids)).reshape(1, -1)
    if cache is None:
        return model(x)[0]
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    step = min(chunk, getattr(cache, "max_chunk", chunk))
    return torch.cat([model(x[:, i:i + step], cache=cache)[0] for i in range(0, x.shape[1], step)])


def nll(model, ids, cache=None, chunk: int = 32, window: int | None = None, stride: int | None = None) -> float:
    """Mean negative log-likelihood (nats per token) of ids[1:] given what came before.

    With `window`, a text longer than the model's context is scored the way Hugging Face's
    perplexity guide does: windows of `window` tokens every `stride` tokens (default: window),
    each scoring only the tokens the previous window did not, with the rest as context.
    """
    ids = list(ids)
    if len(ids) < 2:
        raise ValueError(f"ids must hold at least 2 tokens to score a prediction, got {len(ids)}")
    if window is not None:
        return _strided_nll(model, ids, window, stride or window)
    logits = cache_logits(model, ids, cache, chunk)[:-1].float()
    return float(F.cross_entropy(logits, torch.tensor(ids[1:], device=logits.device), reduction="mean"))


def _strided_nll(model, ids: list[int], window: int, stride: int) -> float:
    logits, targets = scored_logits(model, ids, window, stride)
    return float(F.cross_entropy(logits, targets, reduction="mean"))


def perplexity(model, ids, cache=None, chunk: int = 32, window: int | None = None, stride: int | None = None) -> float:
    """exp(mean NLL) of ids[1:] given what came before: through `cache` (see `cache_logits`), or in
    windows of `window` tokens every `stride` (see `nll`)."""
    return math.exp(nll(model, ids, cache, chunk, window, stride))


def bits_per_byte(nats_per_token: float, tok, targets) -> float:
    """A loss in nats per token as bits per byte of the text the `targets` ids stand for.

    Comparable across tokenizers (a character-level model's bits per character on ASCII text
    is the same number): nats · tokens / (bytes · ln 2). `tok` needs `token_bytes(id)`.
    """
    ids = [int(i) for i in (targets.reshape(-1).tolist() if hasattr(targets, "reshape") else targets)]
    n_bytes = sum(len(tok.token_bytes(i)) for i in ids)
    if n_bytes == 0:
        raise ValueError("targets stand for no bytes of text; bits per byte is undefined")
    return nats_per_token * len(ids) / n_bytes / math.log(2)
