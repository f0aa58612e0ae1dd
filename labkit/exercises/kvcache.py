"""Exercises of chapter 04: the cache's size, the paged slot mapping, StreamingLLM's eviction, KIVI's rounding,
what a compressed-attention layer's cache holds."""
from __future__ import annotations

import torch

from labkit.exercises._core import check

__all__ = ["check_kv_bytes_per_token", "check_slot_mapping", "check_streaming_keep", "check_asym_quantize",
           "check_csa_layer_values", "check_csa_quarter"]


def check_kv_bytes_per_token(fn) -> bool:
    """Check `fn(n_layers, n_kv_heads, head_dim, bytes_per_value) -> bytes` one token adds to the cache."""
    cases = [(40, 40, 128, 2), (32, 8, 128, 2), (30, 3, 64, 4), (80, 8, 128, 1), (16, 8, 64, 0.5)]
    return check("kv_bytes_per_token", fn, lambda L, H, D, b: 2 * L * H * D * b, cases,
                 hint="every layer stores one key AND one value vector per KV head: 2 · layers · kv_heads · head_dim · bytes")


def _slot(block_table, block_size, position):
    return block_table[position // block_size] * block_size + position % block_size


def check_slot_mapping(fn) -> bool:
    """Check `fn(block_table, block_size, position) -> physical slot` of a token in a paged cache."""
    cases = [([7, 2, 9], 4, 0), ([7, 2, 9], 4, 5), ([7, 2, 9], 4, 11), ([3], 16, 15), ([0, 5, 1, 4], 1, 2), ([4, 0], 8, 8)]
    return check("slot_mapping", fn, _slot, cases,
                 hint="the token's logical block is position // block_size; look it up in the block table, "
                      "then add the offset position % block_size inside that physical block")


def _keep(n_cached, n_new, window, sinks):
    if n_cached + n_new <= window:
        return list(range(n_cached))
    recent = window - sinks - n_new
    return list(range(sinks)) + list(range(n_cached - recent, n_cached)) if recent > 0 else list(range(sinks))


def check_streaming_keep(fn) -> bool:
    """Check `fn(n_cached, n_new, window, sinks) -> slots kept` before `n_new` tokens arrive (StreamingLLM).

    Keep everything if it all fits in `window`; otherwise keep the first `sinks` slots and
    as many of the latest slots as leave room for the new tokens.
    """
    cases = [(5, 1, 8, 2), (8, 1, 8, 2), (8, 3, 8, 2), (10, 1, 10, 4), (6, 4, 6, 2), (20, 1, 20, 0)]
    return check("streaming_keep", fn, _keep, cases,
                 hint="after eviction, sinks + recent + n_new must equal window: recent = window - sinks - n_new "
                      "of the latest cached slots survive, together with slots 0 .. sinks-1")


def _asym(x: torch.Tensor, bits: int) -> torch.Tensor:
    lo, hi = x.min(), x.max()
    scale = (hi - lo) / (2 ** bits - 1)
    if scale == 0:
        return x.clone()
    return ((x - lo) / scale).round() * scale + lo


def check_asym_quantize(fn) -> bool:
    """Check `fn(x [G], bits) -> x_hat [G]`: asymmetric quantization of one group, then back.

    scale = (max − min) / (2^bits − 1), code = round((x − min) / scale), x_hat = code · scale + min.
    """
    g = torch.Generator().manual_seed(4)
    cases = [(torch.tensor([0.0, 1.0, 2.0, 3.0]), 2), (torch.tensor([-1.0, 0.3, 0.5, 2.0]), 4),
             (torch.randn(32, generator=g) * 3, 8), (torch.randn(32, generator=g) + 20, 4), (torch.full((4,), 0.5), 8)]
    return check("asym_quantize", fn, _asym, cases,
                 hint="use the group's min as the zero point and spread 2^bits - 1 steps up to its max; "
                      "x_hat is within scale/2 of x (a constant group has scale 0: return it unchanged)")


def _csa_values(n_tokens, block, window, kv_dim, index_dim):
    from labkit.kvcache.compressed import CompressedCache
    from labkit.model.config import ModelConfig

    cfg = ModelConfig(vocab_size=8, d_model=kv_dim, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=kv_dim, ffn_dim=8,
                      max_seq_len=max(n_tokens, block), csa_block=block, csa_topk=1, csa_window=window,
                      csa_index_heads=1, csa_index_dim=index_dim)
    cache = CompressedCache(cfg, max_len=cfg.max_seq_len)
    return cache.bytes_at(n_tokens) // cache.win_k.element_size()


def check_csa_layer_values(fn) -> bool:
    """Check `fn(n_tokens, block, window, kv_dim, index_dim) -> values` one compressed-attention layer caches.

    After `n_tokens` tokens of one sequence: the window's keys and values (the last `window - 1`
    tokens, `kv_dim` each), one entry (`kv_dim`) and one index key (`index_dim`) per finished block
    of `block` tokens, and for each token of the unfinished block its candidate and its logits
    (`kv_dim` each) and its index key. `labkit.kvcache.compressed.CompressedCache` is the reference.
    """
    cases = [(5, 4, 8, 128, 32), (3, 4, 8, 128, 32), (1024, 4, 64, 128, 32), (1000, 8, 16, 64, 16),
             (7, 8, 8, 64, 8), (130, 128, 128, 512, 128)]
    return check("csa_layer_values", fn, _csa_values, cases,
                 hint="three parts: min(n, window - 1) tokens of keys AND values; n // block entries, each an entry plus "
                      "an index key; n % block pending rows, each a candidate, its logits and an index key")


def _csa_quarter(block, window, kv_dim, index_dim, dense_per_token, horizon):
    values = [_csa_values(n, block, window, kv_dim, index_dim) for n in range(1, horizon + 1)]
    over = [n for n, v in zip(range(1, horizon + 1), values) if v > 0.25 * dense_per_token * n]
    shortest = (max(over) + 1) if over else 1
    return shortest, (kv_dim + index_dim) / (block * dense_per_token)


def check_csa_quarter(fn) -> bool:
    """Check `fn(block, window, kv_dim, index_dim, dense_per_token, horizon) -> (n, limit)`.

    `n`: the shortest context from which every longer one, up to `horizon` tokens, has a compressed layer
    holding at most a quarter of the dense layer's `dense_per_token` values a token (the share is not
    monotone: the pending rows of an unfinished block come and go, so the first context under a quarter
    is not the answer). `limit`: the share the compressed layer tends to as the context grows (only the
    block entries and their index keys grow with it).
    """
    cases = [(4, 64, 128, 32, 256, 2048), (8, 16, 64, 16, 128, 1024), (4, 8, 32, 8, 64, 512), (2, 32, 64, 64, 128, 600)]
    return check("csa_quarter", fn, _csa_quarter, cases,
                 hint="compute the share at EVERY length up to the horizon and take one past the last length above a "
                      "quarter; the limit counts only an entry and an index key per block of tokens")
