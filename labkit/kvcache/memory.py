"""How much memory a KV cache takes: per token, per model preset, per cache kind.

The formula (Kwon et al. 2023 §2; `../research` §4.1): every token stores one key and
one value vector per layer per KV head,

    bytes/token = 2 · n_layers · n_kv_heads · head_dim · bytes_per_value

so grouped-query attention (Ainslie et al. 2023) shrinks the cache by n_heads / n_kv_heads.
A quantized cache stores `bits` per value plus a float16 scale and minimum per group
(KIVI); a paged cache rounds each sequence up to whole blocks (vLLM).

    >>> from labkit.model import ModelConfig
    >>> round(kv_bytes_per_token(ModelConfig.from_name("llama-2-13b"), bits=16) / 1e6, 2)    # MB per token, fp16
    0.82
    >>> paged_slots([5, 17], block_size=8)                               # 1 + 3 blocks
    32
"""
from __future__ import annotations

import math

__all__ = ["kv_bytes_per_token", "memory_rows", "paged_slots", "paged_fragmentation", "contiguous_fragmentation"]


def _config(model):
    if isinstance(model, str):
        raise TypeError(f"pass a model or its config, not the name {model!r}: "
                        f"labkit.model.ModelConfig.from_name({model!r}) builds the config of a preset")
    cfg = getattr(model, "config", model)
    if not all(hasattr(cfg, a) for a in ("n_layers", "n_kv_heads", "head_dim")):
        raise TypeError(f"expected a model or a config with n_layers, n_kv_heads and head_dim, got {type(model).__name__}")
    return cfg


def kv_bytes_per_token(model, bits: float = 16, group_size: int | None = None) -> float:
    """Bytes one token adds to the cache of `model` (a model or its config).

    `bits`: 32, 16 (float), or 8 / 4 with `group_size` for a quantized cache, where each
    group of `group_size` values also stores a float16 scale and minimum.
    """
    cfg = _config(model)
    if not hasattr(cfg, "kv_bytes_per_token"):
        raise TypeError(f"expected a labkit model or its ModelConfig, got {type(cfg).__name__}")
    return cfg.kv_bytes_per_token(bits / 8, group_size)  # the config's formula: one place


def memory_rows(configs, context: int = 4096, bits: float = 16) -> list[dict]:
    """One row per config (or model): shapes, bytes per token, the cache at `context` tokens, GQA's saving."""
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"context must be a positive integer, got {context!r}")
    rows = []
    for item in configs:
        cfg = _config(item)
        per_token = kv_bytes_per_token(cfg, bits)
        rows.append({
            "model": cfg.name, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
            "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "bytes_per_token": per_token,
            "cache_bytes": per_token * context, "gqa_saving": cfg.n_heads / cfg.n_kv_heads,
            "mha_bytes_per_token": per_token * cfg.n_heads / cfg.n_kv_heads,
        })
    return rows


def paged_slots(lengths, block_size: int) -> int:
    """Token slots a paged cache reserves for sequences of `lengths`: whole blocks each."""
    if not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    return sum(math.ceil(n / block_size) * block_size for n in lengths)


def paged_fragmentation(lengths, block_size: int) -> float:
    """Share of reserved slots left empty (internal fragmentation: < one block per sequence).

    >>> paged_fragmentation([5, 17], block_size=8)      # 22 tokens in 32 slots
    0.3125
    """
    lengths = list(lengths)
    slots = paged_slots(lengths, block_size)
    return 0.0 if slots == 0 else 1 - sum(lengths) / slots


def contiguous_fragmentation(lengths, max_len: int) -> float:
    """The same for caches preallocated at `max_len` tokens per sequence (what paging avoids)."""
    lengths = list(lengths)
    if any(n > max_len for n in lengths):
        raise ValueError(f"a sequence is longer than max_len={max_len}: {max(lengths)}")
    return 1 - sum(lengths) / (max_len * len(lengths)) if lengths else 0.0
