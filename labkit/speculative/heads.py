"""Two more heads on a frozen backbone, next to the chained EAGLE-style head of `mtp`.

**Zero-copy head** (the design Google describes for Pixel phones: the MTP head reuses the main
model's KV cache). Where `MTPHead` keeps a one-layer KV cache of its own, which it must fill
with the prompt (a draft prefill) and catch up after every round, `ZeroCopyHead` keeps none: its
attention reads the backbone's own last-layer keys and values, straight from the target's cache,
plus the key and value of its own current input:

    x_t   = W · [norm(h_t) ; norm(embed(token_{t+1}))]        as in MTPHead
    a_t   = attention(q(x_t), [K_backbone[0..t] ; k(x_t)], [V_backbone[0..t] ; v(x_t)])
    h'_t  = x_t + o(a_t), then + MLP                         p(token_{t+2}) from the backbone's norm and LM head

Chaining γ steps feeds h'_t back as the next h and attends over the same backbone keys (the target
has not computed the drafted positions' keys yet): nothing is stored between rounds, nothing to
prefill, nothing to roll back.

**Parallel heads** (Medusa, Cai et al. 2024): n independent residual blocks on the last verified
hidden state h_t; head i guesses the token i + 1 positions after the one the backbone predicts from
h_t, without seeing the tokens in between. One draft step yields all n guesses, but each later
guess is made blind to the earlier ones, a reason for acceptance to fall with the position that a
chained head, which sees its own previous guess, has less of (`costs.acceptance_by_position`
measures it, with the rounds each position got).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from labkit.model.transformer import RMSNorm, SwiGLU, linear
from labkit.sampling.pipeline import sample_next
from labkit.speculative.headfile import head_from_file, register_head
from labkit.speculative.tap import HiddenTap, vocab_logits, vocab_rows

__all__ = ["ZeroCopyHead", "ZeroCopyDrafter", "MedusaHeads", "MedusaDrafter", "zero_copy_chain", "medusa_guess"]


def _vocab(config, vocab_ids):
    return torch.arange(config.vocab_size) if vocab_ids is None else vocab_ids.long()


def _check_fits(head, target) -> None:
    if head.config.d_model != target.config.d_model or head.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"the head was made for d_model={head.config.d_model}, vocab_size={head.config.vocab_size}; "
                         f"the target has {target.config.d_model} and {target.config.vocab_size}")


@register_head("zero-copy")
class ZeroCopyHead(nn.Module):
    """The head's fusing projection, one attention over the backbone's last-layer KV, one MLP (see the module doc)."""

    def __init__(self, config, vocab_ids: torch.Tensor | None = None):
        super().__init__()
        d, eps = config.d_model, config.norm_eps
        self.config = config.replace(n_layers=1)
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.h_norm, self.e_norm, self.attn_norm, self.ffn_norm = (RMSNorm(d, eps) for _ in range(4))
        self.fuse = nn.Linear(2 * d, d, bias=False)
        self.wqkv = nn.Linear(d, (self.n_heads + 2 * self.n_kv_heads) * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, d, bias=False)
        self.mlp = SwiGLU(self.config)
        self.register_buffer("vocab_ids", _vocab(config, vocab_ids))

    def forward(self, backbone, hidden, next_ids, keys, values, positions, visible=None) -> torch.Tensor:
        """h' [B, T, d] for hidden states [B, T, d], the tokens that followed them [B, T] at `positions` [T].

        keys, values [B, n_kv_heads, S, head_dim]: the backbone's last layer, rotated (a contiguous cache's
        layout); visible [T, S] bool: which of them each query sees (None: all)."""
        B, T, _ = hidden.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        x = linear(torch.cat([self.h_norm(hidden), self.e_norm(backbone.tok_embeddings(next_ids))], -1), self.fuse.weight)
        qkv = linear(self.attn_norm(x), self.wqkv.weight).view(B, T, H + 2 * Hkv, D)
        qk = backbone.rope.rotate_tokens(qkv[:, :, :H + Hkv], positions)
        q = qk[:, :, :H].reshape(B, T, Hkv, H // Hkv, D).permute(0, 2, 3, 1, 4)  # [B, Hkv, g, T, D]
        k = qk[:, :, H:].transpose(1, 2)[:, :, None]  # [B, Hkv, 1, T, D]: the query's own key
        v = qkv[:, :, H + Hkv:].transpose(1, 2)[:, :, None]
        scale = D ** -0.5
        s_ctx = torch.einsum("bkgtd,bksd->bkgts", q, keys) * scale  # [B, Hkv, g, T, S]
        if visible is not None:
            s_ctx = s_ctx.masked_fill(~visible, float("-inf"))
        s_own = (q * k).sum(-1, keepdim=True) * scale  # [B, Hkv, g, T, 1]
        p = torch.softmax(torch.cat([s_ctx, s_own], -1).float(), -1).to(q.dtype)
        out = torch.einsum("bkgts,bksd->bkgtd", p[..., :-1], values) + p[..., -1:] * v
        x = x + linear(out.permute(0, 3, 1, 2, 4).reshape(B, T, H * D), self.wo.weight)
        return x + self.mlp(self.ffn_norm(x))

    def logits(self, backbone, h: torch.Tensor) -> torch.Tensor:
        return vocab_logits(self, backbone, h)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class ZeroCopyDrafter(HiddenTap):
    """Drafts with a `ZeroCopyHead` over the target's own cache (`attach`ed by the decoding loop); stores nothing."""

    def __init__(self, target, head: ZeroCopyHead):
        _check_fits(head, target)
        super().__init__(target)
        self.head, self.cache, self.steps = head, None, 0
        vocab_rows(head, target)

    @classmethod
    def from_file(cls, target, path=None) -> "ZeroCopyDrafter":
        """The zero-copy head trained for SmolLM2 (`labkit train --model smollm2-heads`) on `target`."""
        return cls(target, head_from_file(target, "zero-copy", path))

    def attach(self, target_cache) -> None:
        if getattr(target_cache, "kind", None) != "contiguous":
            raise ValueError(f"the zero-copy head reads the target's keys in place and needs a contiguous cache, got "
                             f"{getattr(target_cache, 'kind', type(target_cache).__name__)!r}")
        self.cache = target_cache
        self.reset_tap()

    @torch.inference_mode()
    def propose(self, history: list[int], gamma: int, params=None, generator=None):
        if self.cache is None:
            raise RuntimeError("ZeroCopyDrafter needs attach(cache) first (labkit.speculative.generate does it)")
        _, h = self.verified(history)
        n = len(history) - 1  # the target's cache holds positions 0 .. n − 1: every token but the last
        if self.cache.seq_len < n:
            raise RuntimeError(f"the target's cache holds {self.cache.seq_len} tokens; the history needs {n}")
        layer = self.target.config.n_layers - 1
        keys, values = self.cache.keys[layer, :1, :, :n], self.cache.values[layer, :1, :, :n]  # views: no copy
        tokens = zero_copy_chain(self.head, self.target, keys, values, h[-1], history[-1], gamma)
        self.steps += len(tokens)
        return tokens, None


def zero_copy_chain(head: ZeroCopyHead, target, keys, values, h: torch.Tensor, token: int, gamma: int) -> list[int]:
    """γ greedy tokens of the zero-copy head from the last verified hidden state h [d] and the token after it,
    attending over the backbone's last-layer keys, values [1, n_kv_heads, n, head_dim] (rotated) of the n
    positions before that token. One stream (`ZeroCopyDrafter`, the contiguous cache's views) and each request
    of the serving engine (its blocks gathered, `labkit.serving.engine.heads`) draft through it."""
    n = keys.shape[2]
    out, tokens, vocab = h[None, None], [], head.vocab_ids
    for i in range(gamma):
        ids = torch.tensor([[token]], device=out.device)
        out = head(target, out, ids, keys, values, torch.tensor([n + i], device=out.device))
        token = int(vocab[sample_next(head.logits(target, out)[0, -1].float())])  # greedy
        tokens.append(token)
    return tokens


@register_head("medusa")
class MedusaHeads(nn.Module):
    """n residual blocks h + SiLU(W_i h + b_i) on one hidden state; head i guesses i + 1 tokens past the backbone's."""

    def __init__(self, config, n_heads: int = 4, vocab_ids: torch.Tensor | None = None):
        super().__init__()
        if not isinstance(n_heads, int) or n_heads < 1:
            raise ValueError(f"n_heads must be an integer >= 1, got {n_heads!r}")
        d = config.d_model
        self.config, self.n_heads = config.replace(n_layers=1), n_heads
        self.weight = nn.Parameter(torch.zeros(n_heads, d, d))  # zero: each head starts as the backbone's own state
        self.bias = nn.Parameter(torch.zeros(n_heads, d))
        self.register_buffer("vocab_ids", _vocab(config, vocab_ids))

    def file_meta(self) -> dict:
        return {"n_heads": self.n_heads}

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., d] -> [..., n_heads, d]."""
        z = torch.einsum("...d,ned->...ne", hidden, self.weight) + self.bias
        return hidden[..., None, :] + F.silu(z)

    def logits(self, backbone, h: torch.Tensor) -> torch.Tensor:
        return vocab_logits(self, backbone, h)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class MedusaDrafter(HiddenTap):
    """Drafts min(γ, n_heads) tokens in one step of `MedusaHeads` on the last verified hidden state."""

    def __init__(self, target, heads: MedusaHeads):
        _check_fits(heads, target)
        super().__init__(target)
        self.head, self.steps = heads, 0
        vocab_rows(heads, target)

    @classmethod
    def from_file(cls, target, path=None) -> "MedusaDrafter":
        """The parallel heads trained for SmolLM2 (`labkit train --model smollm2-heads`) on `target`."""
        return cls(target, head_from_file(target, "medusa", path))

    def attach(self, target_cache) -> None:
        self.reset_tap()

    @torch.inference_mode()
    def propose(self, history: list[int], gamma: int, params=None, generator=None):
        _, h = self.verified(history)
        tokens = medusa_guess(self.head, self.target, h[-1], gamma)
        self.steps += bool(tokens)
        return tokens, None


def medusa_guess(heads: MedusaHeads, target, h: torch.Tensor, gamma: int) -> list[int]:
    """min(γ, n_heads) greedy guesses of the parallel heads from one verified hidden state h [d], in one step."""
    n = min(gamma, heads.n_heads)
    if n < 1:
        return []
    out = heads(h)[:n]  # [n, d]: only the heads this round uses
    picks = heads.logits(target, out).float().argmax(-1)  # greedy, first maximum on ties
    return [int(t) for t in heads.vocab_ids[picks]]
