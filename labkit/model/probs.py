"""One layer's attention probabilities, written out (the forward pass's fused kernel never forms them)."""
from __future__ import annotations

import torch

from labkit.model.attention import Captured
from labkit.model.transformer import Transformer
from labkit.model.window import window_mask

__all__ = ["attention_probs"]


@torch.inference_mode()
def attention_probs(model: Transformer, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """The causal attention probabilities of one layer: float32 [n_heads, T, T] (batch item 0).

    The model's own pass runs up to that layer's attention (`Attention.capture`: every embedding scale, norm,
    QK-norm and the layer's own RoPE base as the forward applies them), which hands over its rotated queries
    and keys; softmax(q·kᵀ/√head_dim) is then written out, causal, and within the layer's window on a local
    layer (Gemma 3's sliding layers): the forward itself uses a fused kernel that never materialises it.
    """
    model.check_ids(ids)
    if model.config.compressed_attention:
        raise ValueError("attention_probs covers dense attention; this model's layers are compressed attention "
                         "(their queries see a window and chosen entries, not every token)")
    if not 0 <= layer < model.config.n_layers:
        raise ValueError(f"layer must be in [0, {model.config.n_layers}), got {layer}")
    attn = model.layers[layer].attn
    attn.capture = []
    try:
        model(ids)
    except Captured:
        pass
    finally:
        got, attn.capture = attn.capture, None
    q, k = got[0]  # [B, T, H, head_dim], [B, T, Hkv, head_dim]
    q, k = q[0].transpose(0, 1).float(), k[0].transpose(0, 1).float()
    k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=0)  # head h reads KV head h // g
    scores = q @ k.transpose(-1, -2) / attn.head_dim ** 0.5  # [n_heads, T, T]
    T = ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
    seen = window_mask(T, T, attn.window, ids.device) if attn.window else causal
    return scores.masked_fill(~seen, float("-inf")).softmax(-1)
