"""Exercises of chapter 04 (a cache of local and global layers, StreamingLLM's eviction, KIVI's rounding) and
of deep dive 04a (an H2O budget at equal bytes, what a compressed-attention layer's cache holds)."""
from __future__ import annotations

import torch

from labkit.checks import is_int
from labkit.exercises._core import check

__all__ = ["check_mixed_cache_bytes", "check_streaming_keep", "check_asym_quantize",
           "check_csa_layer_values", "check_csa_quarter", "check_h2o_budget"]


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


def _h2o_budget(cfg, length, fraction):
    from labkit.kvcache.sizing import equal_bytes_options

    rows = equal_bytes_options(cfg, length, fraction)  # float32 keys and values, as the exercise states
    return next(r for r in rows if r["name"] == "h2o")["options"]["budget"]


def check_h2o_budget(fn) -> bool:
    """Check `fn(cfg, length, fraction) -> budget`: the largest H2O budget (tokens kept per layer and KV head) whose
    cache takes at most `fraction` of the full float32 cache's bytes at `length` tokens, each kept token storing
    its float32 keys and values plus an int32 position and a float32 score per layer and KV head. Checked against
    `labkit.kvcache.sizing.equal_bytes_options`, on model shapes and budgets the deep dive does not print."""
    from labkit.model import ModelConfig

    shapes = [ModelConfig.from_name(n) for n in ("smollm2-135m", "llama-3.2-1b", "llama-2-7b")]
    cases = [(c, n, f) for c in shapes for n, f in ((2048, 0.25), (4096, 0.1), (3000, 0.2), (1500, 0.37))]
    return check("h2o_budget", fn, _h2o_budget, cases,
                 compare=lambda want, got: is_int(got) and got == want,
                 hint="the target is fraction x length x (one token's float32 keys and values); each kept token "
                      "costs those bytes plus 8 per layer and KV head; round down, and return an int")


def _mixed_bytes(windows, context, n_kv_heads, head_dim, bytes_per_value):
    held = sum(context if w == 0 else min(context, w) for w in windows)
    return 2 * n_kv_heads * head_dim * bytes_per_value * held


def check_mixed_cache_bytes(fn) -> bool:
    """Check `fn(windows, context, n_kv_heads, head_dim, bytes_per_value) -> bytes` of the keys and values a cache
    holds after `context` tokens, for a model whose layer i keeps the last `windows[i]` tokens (0: a global layer,
    which keeps them all), as `ModelConfig.layer_windows` says: the tokens held, not what a cache preallocates."""
    gemma = (512, 512, 512, 512, 512, 0) * 3  # Gemma 3 270M's pattern: 5 local layers of 512, then a global one
    cases = [(gemma, 32_768, 1, 256, 4), (gemma, 300, 1, 256, 4), (gemma, 512, 1, 256, 2), ((0,) * 30, 2048, 3, 64, 4),
             ((1024,) * 4, 4096, 8, 128, 2), ((4096, 0, 128), 1000, 2, 64, 1), ((0, 0), 1, 1, 1, 4)]
    return check("mixed_cache_bytes", fn, _mixed_bytes, cases,
                 hint="per layer: a global layer holds every token, a local one at most its window (and no more "
                      "than the tokens seen); each held token costs a key and a value per KV head")
