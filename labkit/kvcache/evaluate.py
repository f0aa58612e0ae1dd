"""What a lossy KV cache costs in quality: perplexity through a sliding window, logit error of a quantized cache.

The measures are `labkit.metrics`' (perplexity streamed through a cache, KL to the
float cache's logits, top-1 agreement); this module runs them over the cache kinds.

    >>> window_perplexities(model, ids, windows=[64, 128])   # doctest: +SKIP
"""
from __future__ import annotations

import torch

from labkit.metrics.compare import kl_to_reference, top1_agreement
from labkit.metrics.likelihood import perplexity

__all__ = ["window_perplexities", "quantized_error_rows"]


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
    rows = [{"bits": 8 * model.dtype.itemsize, "bytes_used": ref_bytes, "float_bytes": ref_bytes,
             "max_abs_err": 0.0, "kl": 0.0, "top1_agree": 1.0}]
    for b in bits:
        got, used = run(model.new_cache("quantized", max_len=len(ids), bits=b, group_size=group_size, residual=residual))
        rows.append({"bits": b, "bytes_used": used, "float_bytes": ref_bytes, "max_abs_err": float((got - ref).abs().max()),
                     "kl": kl_to_reference(ref, got), "top1_agree": top1_agreement(ref, got)})
    return rows
