"""One layer's attention probabilities, written out (the forward pass's fused kernel never forms them)."""
from __future__ import annotations

import torch

from labkit.model.transformer import Transformer

__all__ = ["attention_probs"]


@torch.inference_mode()
def attention_probs(model: Transformer, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """The causal attention probabilities of one layer: float32 [n_heads, T, T] (batch item 0).

    Runs the blocks before `layer`, then recomputes that layer's softmax(q·kᵀ/√d) explicitly
    (the forward pass itself uses a fused kernel that never materialises it).
    """
    model.check_ids(ids)
    if model.config.compressed_attention:
        raise ValueError("attention_probs covers dense attention; this model's layers are compressed attention "
                         "(their queries see a window and chosen entries, not every token)")
    if not 0 <= layer < model.config.n_layers:
        raise ValueError(f"layer must be in [0, {model.config.n_layers}), got {layer}")
    T = ids.shape[1]
    positions = torch.arange(T, device=ids.device)
    x = model.tok_embeddings(ids)
    for block in model.layers[:layer]:
        x = block(x, model.rope, positions)
    attn = model.layers[layer].attn
    q, k, _ = attn.wqkv(model.layers[layer].attn_norm(x)).split(attn.split, dim=-1)
    q = model.rope(q.view(*ids.shape, attn.n_heads, attn.head_dim).transpose(1, 2), positions)  # [B, n_heads, T, hd]
    k = model.rope(k.view(*ids.shape, attn.n_kv_heads, attn.head_dim).transpose(1, 2), positions)
    k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)  # [B, n_heads, T, hd]: head h reads KV head h // g
    scores = (q @ k.transpose(-1, -2)).float() / attn.head_dim ** 0.5  # [B, n_heads, T, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1)[0]
