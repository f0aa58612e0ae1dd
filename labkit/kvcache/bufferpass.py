"""One pass over a contiguous cache's buffers, as tensors only: the cache a compiled or exported program sees.

A `ContiguousCache` keeps its length in Python and builds its mask in `begin`; a program traced once and run
for every step cannot read Python state. `BufferPass` hands the model's own forward (`Transformer.run_pass`)
what that pass needs as tensors: the per-layer key and value buffers (written in place at `positions`) and
`span`, the slots 0 .. n−1 of the keys so far, whose length is the one size that moves from step to step. The
model's code is the same code the eager step runs; only the cache it talks to differs.

Two ways to attend:

- `attend` calls `labkit.kvcache.base.attention` as the eager step does (the one-query GQA call for one token,
  one masked call for several).
- with `rows=True`, `attend` (and `attend_alone`, the batch-invariant mode's entry) writes each query's
  attention out as plain arithmetic: scores as products summed over the head dimension, a softmax over the keys
  it sees, the weighted sum of values. A program traced with the pass length symbolic then runs the same
  loops for every row whatever the number of rows, so a row's bits never depend on the other rows of its pass:
  with weight products that are row-invariant too (labkit's block kernels), one program serves a one-token
  step, a verification pass and the batch-invariant mode alike, and speculative decoding replies exactly what
  plain decoding replies.
"""
from __future__ import annotations

import math

import torch

from labkit.kvcache.base import attention

__all__ = ["BufferPass", "attention_by_row"]


def attention_by_row(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q·kᵀ/√D)·v written out, each query on its own: q [B, T, H, D], keys/values [B, Hkv, S, D], mask bool
    [T, S] (True: seen). Returns [B·T, H·D]. Query head h reads KV head h // (H / Hkv)."""
    B, T, H, D = q.shape
    Hkv = keys.shape[1]
    qg = q.reshape(B, T, Hkv, H // Hkv, D).permute(0, 2, 3, 1, 4)  # [B, Hkv, g, T, D]
    scores = (qg.unsqueeze(-2) * keys[:, :, None, None]).sum(-1) * (1.0 / math.sqrt(D))  # [B, Hkv, g, T, S]
    weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    out = (weights.unsqueeze(-1) * values[:, :, None, None]).sum(-2)  # [B, Hkv, g, T, D]
    return out.permute(0, 3, 1, 2, 4).reshape(B * T, H * D)


class BufferPass:
    """The cache of one traced pass: `keys[i]`, `values[i]` [B, Hkv, capacity, D] per layer, the new tokens'
    `positions` [T] (their slots) and `span` = arange(keys so far, new ones included)."""

    rotate_new_keys = True  # the model rotates keys before they are stored, as for the contiguous cache
    packed = False

    def __init__(self, keys, values, positions: torch.Tensor, span: torch.Tensor, rows: bool = False):
        self.keys, self.values, self.positions, self.span, self.rows = keys, values, positions, span, rows
        torch._check(span.shape[0] <= keys[0].shape[2])  # the keys so far fit the buffer (the last slot included)
        one = positions.shape[0] == 1 and not rows
        self.mask = None if one else span[None, :] <= positions[:, None]  # [T, n]

    @property
    def pass_end(self):
        return self.span.shape[0]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope=None) -> torch.Tensor:
        """Store k, v [B, T, Hkv, D] at the pass's slots, then attend q [B, T, H, D] over the keys so far: [B·T, H·D]."""
        keys, values = self.keys[layer], self.values[layer]
        keys[:, :, self.positions] = k.transpose(1, 2).to(keys.dtype)
        values[:, :, self.positions] = v.transpose(1, 2).to(values.dtype)
        n = self.span.shape[0]
        kk, vv = keys[:, :, :n], values[:, :, :n]
        if self.rows:
            return attention_by_row(q, kk.to(q.dtype), vv.to(q.dtype), self.mask)
        return attention(q, kk, vv, self.mask)

    def attend_alone(self, layer: int, q, k, v, rope=None) -> torch.Tensor:
        """The batch-invariant mode's call (`labkit.model.kernels.attend_rows`): each query alone."""
        if not self.rows:
            raise RuntimeError("this pass was traced without rows=True: its queries do not attend alone")
        return self.attend(layer, q, k, v, rope)
