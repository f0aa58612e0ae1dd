"""A Llama-architecture transformer, small enough to read in one sitting.

Follows Touvron et al. 2023, "LLaMA" / "Llama 2": pre-norm decoder blocks with RMSNorm
(Zhang & Sennrich 2019), rotary position embedding (Su et al. 2021, `labkit.model.rope`),
grouped-query attention (Ainslie et al. 2023) and a SwiGLU MLP (Shazeer 2020). The code
shape follows gpt-fast's `model.py` and nanoGPT: one class per idea, shapes in comments.

Batch-1 decoding is a stream of matrix-vector products, so three layout choices make it
fast without changing the maths: the Q, K and V projections are one matrix (`wqkv`) and
the gate and up projections another (`w_gate_up`), each read in a single product; and a
loaded model stores its weights column-major (`Transformer.column_major_`), the order in
which the BLAS streams them fastest, and which lets `linear` hand each thread one contiguous
slab of it.

    >>> cfg = ModelConfig(vocab_size=100, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64)
    >>> model = Transformer(cfg)
    >>> model(torch.tensor([[1, 2, 3]])).shape              # logits [B, T, V]
    torch.Size([1, 3, 100])
    >>> cache = model.new_cache(max_len=8)
    >>> model(torch.tensor([[1, 2]]), cache=cache).shape     # prefill: positions 0, 1
    torch.Size([1, 2, 100])
    >>> model(torch.tensor([[3]]), cache=cache).shape        # decode: position 2
    torch.Size([1, 1, 100])
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from labkit.kvcache.base import forward_pass, new_cache as _new_cache
from labkit.model.config import ModelConfig
from labkit.model.rope import Rotary

__all__ = ["RMSNorm", "Attention", "SwiGLU", "Block", "Transformer", "attention_probs"]


# Split one-token products across threads (see `linear`): None (the default) splits whenever torch
# uses more than one thread; False keeps every product on one core. On a machine whose cores are
# busy with other programs every parallel region waits for a descheduled thread, the split ones and
# torch's own alike: there `torch.set_num_threads(1)` decodes fastest (measured here with one of two
# cores kept busy: 12.4 tok/s on one thread, 4.5 tok/s on two).
SPLIT_MATVEC: bool | None = None
SPLIT_MAX_TOKENS = 16  # up to this many tokens per product take the split (measured: beyond, F.linear is as fast)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T, with products over a few tokens spread over all of torch's threads.

    At batch 1 a decode step is a matrix-vector product per weight, and the BLAS runs it on
    one core, which streams the weights at one core's share of the memory bandwidth. For a
    column-major weight ([out, in] whose transpose Wᵀ [in, out] is contiguous, see
    `Transformer.column_major_`) the input features are cut into one slab of rows of Wᵀ per
    thread: every slab is one contiguous piece of memory, the slabs run as one batched product
    (`torch.bmm`, one core per slab), and their partial sums are added. Same arithmetic, in a
    different order of additions (results agree to rounding). The same split serves up to
    `SPLIT_MAX_TOKENS` tokens at once (a speculative verification pass, a short prompt), where
    the BLAS's own small-matrix path is slower still; longer inputs go to `F.linear`.
    """
    n_split = torch.get_num_threads()
    out_features, in_features = weight.shape
    split = n_split > 1 and (SPLIT_MATVEC is None or SPLIT_MATVEC)
    tokens = x.numel() // in_features
    if split and tokens <= SPLIT_MAX_TOKENS and weight.stride(0) == 1 and in_features % n_split == 0:
        slabs = weight.t().view(n_split, in_features // n_split, out_features)  # [n_split, in/n_split, out]
        pieces = x.reshape(tokens, n_split, in_features // n_split).transpose(0, 1)  # [n_split, tokens, in/n_split]
        partial = torch.bmm(pieces, slabs)  # [n_split, tokens, out]
        return partial.sum(0).view(*x.shape[:-1], out_features)
    return F.linear(x, weight)


class Linear(nn.Linear):
    """`nn.Linear` without bias whose forward is `linear` (a thread-parallel matrix-vector product at batch 1)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight, over the last dimension (no mean subtraction, no bias)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == x.shape[-1] and x.dtype == torch.float32:
            # one decode token: a dot product costs far less than the general reduction kernel
            flat = x.reshape(-1)
            return x * (torch.rsqrt(torch.dot(flat, flat).div_(flat.numel()).add_(self.eps)) * self.weight)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


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

    def projections(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of Wq, Wk, Wv inside the fused matrix, each [out_features, d_model]."""
        return self.wqkv.weight.split(self.split, dim=0)

    def forward(self, x: torch.Tensor, rope: Rotary, positions: torch.Tensor, cache=None) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.wqkv(x).split(self.split, dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # [B, n_heads, T, head_dim]
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # [B, n_kv_heads, T, head_dim]
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # [B, n_kv_heads, T, head_dim]
        q = rope(q, positions)
        if hasattr(cache, "attend"):  # many sequences packed in one row: the cache attends per sequence
            out = cache.attend(self.layer, q, k, v, rope)  # [1, n_heads, T, head_dim] (labkit.kvcache.batch)
            return self.wo(out.transpose(1, 2).reshape(B, T, -1))
        if cache is None:
            k, mask = rope(k, positions), None
            causal = T > 1
        else:
            k, v, mask = cache.update(self.layer, k, v, rope)  # k, v: [B, n_kv_heads, n_keys, head_dim]
            causal = False
        if mask is None and not causal and self.n_heads != self.n_kv_heads and T == 1:
            # one query per head that sees every key: the g query heads of a group become g
            # "rows" of one KV head, so no key or value is ever copied
            g = self.n_heads // self.n_kv_heads
            q = q.reshape(B, self.n_kv_heads, g, self.head_dim)  # [B, n_kv_heads, g, head_dim]
            out = F.scaled_dot_product_attention(q, k, v)  # [B, n_kv_heads, g, head_dim]
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                 enable_gqa=self.n_heads != self.n_kv_heads)
        out = out.reshape(B, self.n_heads, T, self.head_dim).transpose(1, 2).reshape(B, T, -1)  # [B, T, n_heads·head_dim]
        return self.wo(out)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) · up(x)), with gate and up fused into one matrix."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ffn_dim = config.ffn_dim
        self.w_gate_up = Linear(config.d_model, 2 * config.ffn_dim)  # rows: [W_gate; W_up]
        self.w_down = Linear(config.ffn_dim, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(x).split(self.ffn_dim, dim=-1)  # [B, T, ffn_dim] each
        return self.w_down(F.silu(gate).mul_(up))


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(·))."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config, layer)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x, rope, positions, cache=None):
        x = x + self.attn(self.attn_norm(x), rope, positions, cache)
        return x + self.mlp(self.ffn_norm(x))


class Transformer(nn.Module):
    """Token embedding → n_layers blocks → RMSNorm → LM head (tied to the embedding or not).

    `model(ids)` runs the whole sequence from position 0; `model(ids, cache=cache)`
    continues after what the cache holds and adds the new keys and values to it.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = None if config.tie_embeddings else Linear(config.d_model, config.vocab_size)
        self._rope = None

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embeddings.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.tok_embeddings.weight.device

    @property
    def rope(self) -> Rotary:
        """The RoPE tables (built on first use, and again after a move to another device)."""
        if self._rope is None or self._rope.device != self.device:
            cfg = self.config
            self._rope = Rotary(cfg.head_dim, cfg.rope_base, cfg.max_seq_len, cfg.rope_layout, device=self.device)
        return self._rope

    def column_major_(self) -> "Transformer":
        """Store every matmul weight column-major ([out, in] whose transpose is contiguous), in place.

        The values do not change. `x @ W.T` then reads W in memory order, which makes batch-1
        decode (one matrix-vector product per weight) markedly faster with MKL on CPU, in
        float32. Not for bfloat16 on a CPU without native bf16: there the column-major
        product takes a slow path (about 20x slower per decode step of SmolLM2, measured with
        `labkit bench --only smollm2`), so loaders keep half-precision weights row-major.
        """
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)) and not module.weight.t().is_contiguous():
                    w = module.weight
                    module.weight = nn.Parameter(w.t().contiguous().t(), requires_grad=w.requires_grad)
        return self

    def output_weight(self) -> torch.Tensor:
        """The LM head matrix [vocab_size, d_model] (the embedding when tied)."""
        return self.tok_embeddings.weight if self.lm_head is None else self.lm_head.weight

    def new_cache(self, kind: str = "contiguous", max_len: int | None = None, batch_size: int = 1,
                  dtype: torch.dtype | None = None, **opts):
        """A KV cache for this model: `kind` is any registered kind (`labkit.kvcache.kinds()`).

        `max_len` defaults to the context window; size it to prompt + reply to save memory.
        """
        return _new_cache(kind, self.config, max_len=max_len, batch_size=batch_size,
                                 dtype=dtype or self.dtype, device=self.device, **opts)

    def check_ids(self, ids: torch.Tensor) -> None:
        """Raise TypeError/ValueError, with the numbers, for ids the model cannot take."""
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"ids must be an integer torch.Tensor [B, T], got {type(ids).__name__} "
                            f"{getattr(ids, 'dtype', '')}".rstrip())
        if ids.dim() != 2 or ids.shape[1] == 0:
            raise ValueError(f"ids must have shape [B, T] with T >= 1, got {tuple(ids.shape)}")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.config.vocab_size})")

    def forward(self, ids: torch.Tensor, cache=None, last_only: bool = False, n_layers: int | None = None) -> torch.Tensor:
        """Logits [B, T, V] for ids [B, T] (`last_only`: only the last position, [B, 1, V]).

        `n_layers`: exit early, after the first n_layers blocks, into the final norm and LM head
        (self-speculative drafting); the cache then gets keys and values for those layers only.
        """
        self.check_ids(ids)
        depth = len(self.layers) if n_layers is None else n_layers
        if not isinstance(depth, int) or not 1 <= depth <= len(self.layers):
            raise ValueError(f"n_layers must be an integer in [1, {len(self.layers)}], got {n_layers!r}")
        B, T = ids.shape
        if cache is None and T > self.config.max_seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than the context window of "
                             f"{self.config.max_seq_len} tokens")
        if cache is not None and B != cache.batch_size:
            raise ValueError(f"ids have batch size {B} but the cache was made for batch_size={cache.batch_size}")
        with forward_pass(cache, T, ids.device) as positions:
            if cache is not None and int(positions[-1]) >= self.config.max_seq_len:
                raise ValueError(f"sequence of {int(positions[-1]) + 1} tokens is longer than the context window "
                                 f"of {self.config.max_seq_len} tokens")
            rope = self.rope
            x = self.tok_embeddings(ids)  # [B, T, d_model]
            for block in self.layers[:depth]:
                x = block(x, rope, positions, cache)
            if last_only:  # a packed batch keeps each of its rows' last token
                x = x[:, cache.last_index] if hasattr(cache, "last_index") else x[:, -1:]
            h = self.norm(x)  # the LM head: the tied embedding, or its own (possibly quantized) module
            return linear(h, self.tok_embeddings.weight) if self.lm_head is None else self.lm_head(h)  # [B, T, V]


@torch.inference_mode()
def attention_probs(model: Transformer, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """The causal attention probabilities of one layer: float32 [n_heads, T, T] (batch item 0).

    Runs the blocks before `layer`, then recomputes that layer's softmax(q·kᵀ/√d) explicitly
    (the forward pass itself uses a fused kernel that never materialises it).
    """
    model.check_ids(ids)
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
