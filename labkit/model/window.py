"""Attention of a sliding-window layer (Gemma 3's local layers) once the sequence is longer than its window.

A query at position p sees the keys at positions p − W + 1 .. p (W keys, itself included), as llama.cpp
and Hugging Face mask Gemma 3's local layers. Within the window it is plain causal attention; beyond it,
this module slices the keys no query of the pass can see and masks the band:

    >>> window_mask(2, 4, 3).int()                  # 2 new queries at positions 2, 3 over keys 0..3, W = 3
    tensor([[1, 1, 1, 0],
            [0, 1, 1, 1]], dtype=torch.int32)

It runs without a cache, on the contiguous cache, which keeps every token in every layer, and on the windowed
cache (`labkit.kvcache.windowed`), whose local layers keep only what their window can still see: their
memory is capped by the window. Other cache kinds and the batch-invariant mode are
refused beyond the window (`check`), never silently given global attention.
"""
from __future__ import annotations

import torch

from labkit.kvcache.base import attention
from labkit.kvcache.contiguous import ContiguousCache
from labkit.kvcache.windowed import WindowedCache

__all__ = ["window_mask", "attend_window", "check"]


def window_mask(n_new: int, n_keys: int, window: int, device=None) -> torch.Tensor:
    """bool [n_new, n_keys]: query i (the (n_keys − n_new + i)-th key) sees key j iff 0 ≤ its position − j < window."""
    pos = torch.arange(n_keys - n_new, n_keys, device=device)[:, None]
    j = torch.arange(n_keys, device=device)[None, :]
    return (j <= pos) & (pos - j < window)


def check(cache, invariant: bool, window: int, end: int) -> None:
    """ValueError when a pass reaching `end` tokens would need window attention where labkit has none."""
    if end <= window:
        return
    if cache is not None and not isinstance(cache, (ContiguousCache, WindowedCache)):
        raise ValueError(f"sequence of {end} tokens passes the sliding window of {window} tokens of this model's local "
                         f"layers: attention beyond the window is implemented without a cache and on the contiguous "
                         f"and windowed caches, not on cache kind {cache.kind!r}")
    if invariant:
        raise ValueError(f"sequence of {end} tokens passes the sliding window of {window} tokens: the batch-invariant "
                         f"mode is not implemented beyond the window")


def attend_window(cache, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope, window: int) -> torch.Tensor:
    """A local layer's attention: q [B, T, H, D], k, v [B, T, Hkv, D] -> [B·T, H·D]; `cache` None, contiguous or
    windowed (the keys it returns may start after position 0: only their order and their last ones matter here)."""
    if cache is None:
        keys, values = k.transpose(1, 2), v.transpose(1, 2)
    else:
        keys, values, _ = cache.update(layer, k.transpose(1, 2), v.transpose(1, 2), rope)
    T, S = q.shape[1], keys.shape[2]
    lo = max(0, S - T - window + 1)  # keys before the first query's window: no query of this pass sees them
    keys, values = keys[:, :, lo:], values[:, :, lo:]
    mask = None if T == 1 else window_mask(T, S - lo, window, q.device)
    return attention(q, keys, values, mask)
