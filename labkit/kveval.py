"""What a lossy KV cache costs in quality: perplexity through a sliding window, logit error of a quantized cache.

Perplexity on long text with a window follows StreamingLLM's evaluation (Xiao et al. 2024,
§4.1): the text streams through the cache, every token is predicted from what the cache
still holds, and perplexity = exp(mean negative log-likelihood). The text goes in
chunks (`chunk` tokens per forward pass) rather than one token at a time, which is the
same policy at a fraction of the cost.

    >>> perplexity(model, ids, cache=model.new_cache("sliding", window=128, sinks=4))   # doctest: +SKIP
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["cache_logits", "perplexity", "window_perplexities", "quantized_error_rows"]


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


def perplexity(model, ids, cache=None, chunk: int = 32) -> float:
    """exp(mean NLL) of ids[1:] given what came before, through `cache` (see `cache_logits`)."""
    ids = list(ids)
    if len(ids) < 2:
        raise ValueError(f"perplexity needs at least 2 tokens, got {len(ids)}")
    logits = cache_logits(model, ids, cache, chunk)[:-1].float()
    nll = F.cross_entropy(logits, torch.tensor(ids[1:]), reduction="mean")
    return math.exp(float(nll))


def window_perplexities(model, ids, windows, sinks=(0, 4), chunk: int = 64) -> list[dict]:
    """Perplexity of `ids` through a sliding cache for every window and sink count.

    Each pass adds at most `chunk` tokens and half of the recent window, so every token
    sees at least half of the window besides the sinks. Rows: {window, sinks, ppl}.
    """
    rows = []
    for window in windows:
        for s in sinks:
            cache = model.new_cache("sliding", window=window, sinks=s)
            step = max(1, min(chunk, (window - s) // 2))
            rows.append({"window": window, "sinks": s, "ppl": perplexity(model, ids, cache, step)})
    return rows


@torch.inference_mode()
def quantized_error_rows(model, ids, n_prompt: int, bits=(8, 4), group_size: int = 32, residual: int = 32,
                         chunk: int = 8) -> list[dict]:
    """Prefill `n_prompt` tokens, then feed the rest in chunks: logit error and memory of each
    quantized cache against the float cache. Rows: {bits, bytes_used, float_bytes, max_abs_err,
    kl, top1_agree} (the first row is the float cache itself)."""
    ids = list(ids)
    if not 0 < n_prompt < len(ids):
        raise ValueError(f"n_prompt must be in [1, {len(ids) - 1}], got {n_prompt}")
    x = torch.tensor([ids])

    def run(cache):
        out = [model(x[:, :n_prompt], cache=cache)[0]]
        out += [model(x[:, i:i + chunk], cache=cache)[0] for i in range(n_prompt, len(ids), chunk)]
        return torch.cat(out)[n_prompt:].float(), cache.bytes_used()

    ref, ref_bytes = run(model.new_cache("contiguous", max_len=len(ids)))
    p_ref = ref.log_softmax(-1)
    rows = [{"bits": 8 * model.dtype.itemsize, "bytes_used": ref_bytes, "float_bytes": ref_bytes,
             "max_abs_err": 0.0, "kl": 0.0, "top1_agree": 1.0}]
    for b in bits:
        got, used = run(model.new_cache("quantized", max_len=len(ids), bits=b, group_size=group_size, residual=residual))
        p = got.log_softmax(-1)
        kl = float((p_ref.exp() * (p_ref - p)).sum(-1).mean())
        rows.append({"bits": b, "bytes_used": used, "float_bytes": ref_bytes, "max_abs_err": float((got - ref).abs().max()),
                     "kl": kl, "top1_agree": float((got.argmax(-1) == ref.argmax(-1)).float().mean())})
    return rows
