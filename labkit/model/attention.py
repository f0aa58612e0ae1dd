"""Causal grouped-query attention, the Llama block's (and, with QK-norm and per-layer windows, Gemma 3's).

One module for every way a pass attends: with no cache (the whole sequence, causal), through the cache's own
`attend` (each kind stores and reads its keys its own way), each query alone (the batch-invariant mode,
`labkit.model.kernels.attend_rows`), or over the last `window` keys on a local layer past its window
(`labkit.model.window`). A compiled program traces this same code with a `labkit.kvcache.bufferpass.BufferPass`.
"""
from __future__ import annotations

import torch
from torch import nn

from labkit.kvcache.base import attention
from labkit.model.config import ModelConfig
from labkit.model.kernels import Linear, RMSNorm, attend_rows
from labkit.model.rope import Rotary
from labkit.model.window import attend_window

__all__ = ["Attention"]


class Attention(nn.Module):
    """Causal grouped-query attention: n_heads query heads share n_kv_heads key/value heads.

    Query head h reads KV head h // (n_heads / n_kv_heads).
    """

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        q_out, kv_out = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        self.split = (q_out, kv_out, kv_out)
        self.wqkv = Linear(config.d_model, q_out + 2 * kv_out)  # rows: [Wq; Wk; Wv]
        self.wo = Linear(q_out, config.d_model)
        self.q_norm = RMSNorm(config.head_dim, config.norm_eps) if config.qk_norm else None  # per head (Gemma 3)
        self.k_norm = RMSNorm(config.head_dim, config.norm_eps) if config.qk_norm else None
        self.window = config.layer_windows[layer] if config.layer_windows else 0  # 0: global attention
        self.invariant = False  # each query attends alone (`kernels.attend_rows`; `Transformer.batch_invariant`)

    def projections(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of Wq, Wk, Wv inside the fused matrix, each [out_features, d_model]."""
        return self.wqkv.weight.split(self.split, dim=0)

    def forward(self, x: torch.Tensor, rope: Rotary, positions: torch.Tensor, cache=None, batch: int = 1) -> torch.Tensor:
        """x [N, d_model] holds `batch` rows of N / batch tokens each (or x [B, T, d_model]); returns x's shape."""
        if x.dim() == 3:
            return self.forward(x.reshape(-1, x.shape[-1]), rope, positions, cache, x.shape[0]).view(x.shape)
        H, Hkv = self.n_heads, self.n_kv_heads
        T = x.shape[0] // batch
        qkv = self.wqkv(x).view(batch, T, H + 2 * Hkv, self.head_dim)  # [B, T, H + 2·Hkv, head_dim]: q, k, v heads
        v = qkv[:, :, H + Hkv:]  # [B, T, Hkv, head_dim]
        if self.q_norm is not None:  # each head normed over its head_dim before it rotates
            qkv = torch.cat([self.q_norm(qkv[:, :, :H]), self.k_norm(qkv[:, :, H:H + Hkv]), v], dim=2)
        if cache is None or cache.rotate_new_keys:
            qk = rope.rotate_tokens(qkv[:, :, :H + Hkv], positions)  # q and k heads rotated in one call
            q, k = qk[:, :, :H], qk[:, :, H:]
        else:  # the cache rotates keys itself (by slot, at read time)
            q, k = rope.rotate_tokens(qkv[:, :, :H], positions), qkv[:, :, H:H + Hkv]
        if self.window and (T if cache is None else cache.pass_end) > self.window:  # a local layer, past its window
            out = attend_window(cache, self.layer, q, k, v, rope, self.window)
        elif cache is None:
            out = attention(q, k.transpose(1, 2), v.transpose(1, 2), causal=T > 1)  # [B·T, H·head_dim]
        else:
            out = attend_rows(cache, self.layer, q, k, v, rope) if self.invariant else cache.attend(self.layer, q, k, v, rope)
        return self.wo(out)
