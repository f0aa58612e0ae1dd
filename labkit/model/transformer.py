"""A Llama-architecture transformer, small enough to read in one sitting.

Follows Touvron et al. 2023, "LLaMA" / "Llama 2": pre-norm decoder blocks with RMSNorm
(Zhang & Sennrich 2019), rotary position embedding (Su et al. 2021, `labkit.model.rope`),
grouped-query attention (Ainslie et al. 2023) and a SwiGLU MLP (Shazeer 2020). The code
shape follows gpt-fast's `model.py` and nanoGPT: one class per idea, shapes in comments.

Batch-1 decoding is a stream of matrix-vector products, so three layout choices make it
fast without changing the maths: the Q, K and V projections are one matrix (`wqkv`) and
the gate and up projections another (`w_gate_up`), each read in a single product; and a
loaded model stores its weights column-major (`Transformer.column_major_`), the order in
which the BLAS streams them fastest.

A decode step is also some three thousand operator calls, whose fixed cost is a good part of a
laptop's step (`labkit bench --only step`), so the inference path is lean: the hidden state stays
[B·T, d_model] (no 3-D views), each product is one `torch.mm` on a kept view of Wᵀ
(`labkit.model.kernels`), q and k heads rotate in one call, and nothing in a step reads a tensor
back into Python. `compile_step` goes further: the whole step as one compiled program.

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
from labkit.model.attention import Attention
from labkit.model.compressed import CompressedAttention
from labkit.model.config import ModelConfig
from labkit.model.kernels import Linear, RMSNorm, linear, rows_mm, transposed
from labkit.model.rope import Rotary
from labkit.model.settings import KernelSettings
from labkit.model.window import check as check_window
from labkit.quant.rows import as_usual

__all__ = ["RMSNorm", "Attention", "SwiGLU", "Block", "Transformer"]


class SwiGLU(nn.Module):
    """down(silu(gate(x)) · up(x)), with gate and up fused into one matrix; GeGLU (tanh-GELU) where the config says."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ffn_dim = config.ffn_dim
        self.act = F.silu if config.activation == "silu" else lambda g: F.gelu(g, approximate="tanh")
        self.w_gate_up = Linear(config.d_model, 2 * config.ffn_dim)  # rows: [W_gate; W_up]
        self.w_down = Linear(config.ffn_dim, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.w_gate_up(x)  # [..., 2·ffn_dim]
        gate, up = gate_up[..., :self.ffn_dim], gate_up[..., self.ffn_dim:]
        return self.w_down(self.act(gate).mul_(up))


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(·)); with sandwich norms (Gemma) each output is
    normed too before it is added: x + norm(attn(norm(x)))."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = (CompressedAttention if config.compressed_attention else Attention)(config, layer)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = SwiGLU(config)
        sandwich = config.norm_placement == "sandwich"
        self.post_attn_norm = RMSNorm(config.d_model, config.norm_eps) if sandwich else None
        self.post_ffn_norm = RMSNorm(config.d_model, config.norm_eps) if sandwich else None

    def forward(self, x, rope, positions, cache=None, batch: int | None = None):
        """x [N, d_model] (`batch` rows of tokens) or [B, T, d_model]; returns the same shape."""
        if x.dim() == 3:
            return self.forward(x.reshape(-1, x.shape[-1]), rope, positions, cache, x.shape[0]).view(x.shape)
        a = self.attn(self.attn_norm(x), rope, positions, cache, batch or 1)
        x = x + (a if self.post_attn_norm is None else self.post_attn_norm(a))
        m = self.mlp(self.ffn_norm(x))
        return x + (m if self.post_ffn_norm is None else self.post_ffn_norm(m))


class Transformer(KernelSettings, nn.Module):
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
        self._rope = self._rope_local = None
        self._head_t = None  # (weight, Wᵀ) of the tied head, a view (see `head`)
        self._split, self._lean, self._invariant = False, True, False  # see split_matvec, lean_step, batch_invariant
        self.compiled = None  # the compiled passes (`compile_step`), or None: every pass eager

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

    def rope_of(self, block: Block) -> Rotary:
        """The RoPE tables a block rotates with: a sliding layer's own base where the config gives one."""
        cfg = self.config
        if not block.attn.window or cfg.rope_local_base is None:
            return self.rope
        if self._rope_local is None or self._rope_local.device != self.device:
            self._rope_local = Rotary(cfg.head_dim, cfg.rope_local_base, cfg.max_seq_len, cfg.rope_layout,
                                      device=self.device)
        return self._rope_local

    def column_major_(self) -> "Transformer":
        """Store every matmul weight column-major ([out, in] whose transpose is contiguous), in place.

        The values do not change. `x @ W.T` then reads W in memory order, which makes batch-1
        decode (one matrix-vector product per weight) markedly faster with MKL on CPU, in
        float32. Not for bfloat16 on a CPU without native bf16: there the column-major
        product takes a slow path (many times slower per decode step of SmolLM2: `labkit bench --only smollm2`
        measures it on this machine), so loaders keep half-precision weights row-major.
        """
        changed = False
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)) and not module.weight.t().is_contiguous():
                    w = module.weight
                    module.weight = nn.Parameter(w.t().contiguous().t(), requires_grad=w.requires_grad)
                    changed = True
        if changed and self.compiled is not None:  # traced on the old layout: the next pass compiles afresh
            self.compiled.reset()
        return self

    def output_weight(self) -> torch.Tensor:
        """The LM head matrix [vocab_size, d_model] (the embedding when tied)."""
        return self.tok_embeddings.weight if self.lm_head is None else self.lm_head.weight

    def new_cache(self, kind: str | None = None, max_len: int | None = None, batch_size: int = 1,
                  dtype: torch.dtype | None = None, **opts):
        """A KV cache for this model: `kind` is any registered kind (`labkit.kvcache.kinds()`), default 'contiguous'.

        A compressed-attention model takes only 'compressed' ('contiguous' or None give it that).
        `max_len` defaults to the context window; size it to prompt + reply to save memory.
        """
        if self.config.compressed_attention:  # its exact cache: 'contiguous', every caller's default, means it too
            if kind not in (None, "contiguous", "compressed"):
                raise ValueError(f"a compressed-attention model takes only its own cache (kind 'compressed'), got {kind!r}")
            kind = "compressed"
        kind = kind or "contiguous"
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
        Checks the ids (`check_ids`), then runs `step`.
        """
        self.check_ids(ids)
        return self.step(ids, cache, last_only, n_layers)

    def step(self, ids: torch.Tensor, cache=None, last_only: bool = False, n_layers: int | None = None) -> torch.Tensor:
        """`forward` without looking at the ids' values: for loops that feed back tokens the model chose.

        Reading the ids' range costs two reductions and two reads back to Python a pass; a
        decode loop validates its prompt once (`check_ids`) and every later token comes out of
        this model's own vocabulary. Everything else is checked here with Python numbers only.
        The hidden state stays [B·T, d_model] from the embedding to the LM head.
        """
        if n_layers is not None and (not isinstance(n_layers, int) or not 1 <= n_layers <= self.n_blocks):
            raise ValueError(f"n_layers must be an integer in [1, {self.n_blocks}], got {n_layers!r}")
        B, T = ids.shape
        if cache is None and T > self.config.max_seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than the context window of "
                             f"{self.config.max_seq_len} tokens")
        if cache is not None and B != cache.batch_size:
            raise ValueError(f"ids have batch size {B} but the cache was made for batch_size={cache.batch_size}")
        if self.compiled is not None:
            why = self.compiled.eager_reason(ids, cache, n_layers)
            if why is None:
                return self.compiled.run(ids, cache, last_only)
            self.compiled.eager[why] += 1
        with forward_pass(cache, T, ids.device) as positions:
            if cache is not None and cache.pass_end > self.config.max_seq_len:
                raise ValueError(f"sequence of {cache.pass_end} tokens is longer than the context window "
                                 f"of {self.config.max_seq_len} tokens")
            if self.config.sliding_window:  # a model with sliding layers: refuse what labkit cannot window
                check_window(cache, self._invariant, self.config.sliding_window, T if cache is None else cache.pass_end)
            with as_usual(self._invariant and T > 1 and (cache is None or cache.pass_end == T and not cache.packed)):  # a prompt
                return self.run_pass(ids, positions, cache, last_only, n_layers)

    def run_pass(self, ids: torch.Tensor, positions: torch.Tensor, cache=None, last_only: bool = False,
                 n_layers: int | None = None) -> torch.Tensor:
        """The pass itself, inside the cache's pass (`step` opens it): embedding → blocks → norm → LM head.

        Logits [B, T, V] (or [B, 1, V] with `last_only`) for ids [B, T] at `positions` [T]. This is also what a
        compiled or exported program traces (`labkit.model.compiled`), with a `labkit.kvcache.bufferpass.BufferPass`
        for the cache: one implementation of the model, eager and compiled.
        """
        B, T = ids.shape
        x = self.embed(ids.reshape(-1))  # [B·T, d_model]
        for block in self.layers if n_layers is None else self.layers[:n_layers]:
            x = block(x, self.rope_of(block), positions, cache, B)
        if last_only and T > 1:  # a packed batch keeps each of its rows' last token
            x = x.index_select(0, cache.last_index) if cache is not None and cache.packed else x.view(B, T, -1)[:, -1]
        h = self.norm(x)  # the LM head: the tied embedding, or its own (possibly quantized) module
        logits = self.head(h)  # [B·T', V]
        return logits.view(B, -1, logits.shape[-1])  # [B, T, V]

    def compile_step(self, progress: bool = True) -> "Transformer":
        """Passes of up to 16 tokens on a contiguous cache as one compiled program, in place, any format
        (`labkit.model.compiled`); the programs follow the model's weights, and are dropped when its modules change."""
        from labkit.model.compiled import CompiledStep
        self.compiled = CompiledStep(self, progress=progress)
        return self

    def export_step(self, progress: bool = True) -> "Transformer":
        """`compile_step`'s passes exported ahead of time with AOTInductor (`labkit.model.exported`): built once per
        weights, instruction set and torch version under .build/exported/, loaded from there in a fresh process."""
        from labkit.model.exported import ExportedStep
        self.compiled = ExportedStep(self, progress=progress)
        return self

    def auxiliary_loss(self) -> torch.Tensor | None:
        """The layers' own losses of the last training forward (the compressed attention's indexer), summed."""
        losses = [b.attn.aux_loss for b in self.layers if getattr(b.attn, "aux_loss", None) is not None]
        return sum(losses) if losses else None

    @property
    def n_blocks(self) -> int:
        return len(self.layers)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [N, d_model] for ids [N] (one gather; the module call when training)."""
        x = self.tok_embeddings(ids) if not self._lean or torch.is_grad_enabled() else \
            self.tok_embeddings.weight.index_select(0, ids)
        return x if self.config.embed_scale == 1.0 else x * self.config.embed_scale

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits [N, V] for final hidden states [N, d_model]: the LM head, or the tied embedding."""
        if self.lm_head is not None:
            return self.lm_head(h)
        if torch.is_grad_enabled() or not self._invariant and (self.split_matvec or not self._lean):
            return linear(h, self.tok_embeddings.weight, self.split_matvec)
        if torch.compiler.is_compiling():  # a traced pass keeps no view on the model
            return torch.mm(h, self.tok_embeddings.weight.t())
        self._head_t = transposed(self.tok_embeddings.weight, self._head_t)
        return (rows_mm if self._invariant else torch.mm)(h, self._head_t[1])
