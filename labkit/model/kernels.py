"""The pieces every layer of the transformer calls: the weight product and RMSNorm, lean, and row-invariant on demand.

A SmolLM2 decode step calls them 121 and 61 times. At batch 1 what they cost beyond their
arithmetic is operator calls: `F.linear` is nine (linear, t, transpose, as_strided, matmul,
mm, ...), `torch.mm` on a kept view of Wᵀ four; `F.rms_norm` is 24 on this torch (its
Python-number constants are each wrapped and copied), the form below eight.
Same numbers either way: the decode path's greedy tokens are those of the plain calls.

Batch invariance. Speculative decoding checks k drafted tokens in one k-token pass while
plain decoding runs k one-token steps; its greedy output is the plain output only if each
row of the k-token pass is computed with the same arithmetic, in the same order of
additions, as that row alone. A floating-point sum rounds differently in another order, so
a kernel that picks its algorithm by the number of rows shifts the logits by a few units in
the last place, and where two tokens nearly tie the argmax flips. Measured on this torch
(MKL, oneDNN, x86): a float32 product at one row is a matrix-vector kernel and a different
rounding from the same row inside a product of 2 to 16 rows (which agree with each other);
bfloat16 products and the packed int8/int4 kernels give every row the same bits at any row
count; `torch.dot` (the old one-token RMSNorm) rounds unlike the row reduction; attention
over a cache (`scaled_dot_product_attention`) splits its work by query count and key count.
What each costs to fix decides where it is fixed:

  * RMSNorm: one form for every row count, always (a one-token step pays ~1 µs a norm).
  * the product: with `invariant` (`Transformer.batch_invariant`), a one-row float32
    product runs as two identical rows, the kernel multi-row passes use (`rows_mm`); it
    reads the weights at the two-row kernel's speed, so plain decoding pays for it.
  * attention: with `invariant`, each query of a multi-token pass over a contiguous cache
    attends alone over the keys it sees, the very call a one-token step makes
    (`attend_rows`): k calls instead of one.

    >>> layer = Linear(8, 4)
    >>> with torch.inference_mode():
    ...     y = layer(torch.ones(2, 8))                 # torch.mm(x, Wᵀ)
    >>> torch.equal(y, torch.nn.functional.linear(torch.ones(2, 8), layer.weight.detach()))
    True
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from labkit.kvcache.base import KVCache, attention, causal_mask

__all__ = ["Linear", "RMSNorm", "linear", "transposed", "rows_mm", "attend_rows", "batch_invariant",
           "SPLIT_MAX_TOKENS", "INVARIANT_MAX_ROWS"]

SPLIT_MAX_TOKENS = 16  # up to this many tokens per product take the split (measured: beyond, F.linear is as fast)
INVARIANT_MAX_ROWS = 16  # float32 products of 2..16 rows give each row the same bits here (MKL re-blocks beyond)


def linear(x: torch.Tensor, weight: torch.Tensor, split: bool = False) -> torch.Tensor:
    """x @ weight.T; `split`: products over a few tokens spread over torch's threads by hand.

    At batch 1 a decode step is a matrix-vector product per weight. With `split`, for a
    column-major weight ([out, in] whose transpose Wᵀ [in, out] is contiguous, see
    `Transformer.column_major_`) the input features are cut into one slab of rows of Wᵀ per
    thread: every slab is one contiguous piece of memory, the slabs run as one batched product
    (`torch.bmm`, one core per slab), and their partial sums are added. Same arithmetic, in a
    different order of additions (results agree to rounding). Recent MKL builds already run
    the plain product on every thread (`labkit bench --only smollm2` measures both), so the
    split is off unless a model turns it on (`Transformer.split_matvec`).
    """
    n_split = torch.get_num_threads()
    out_features, in_features = weight.shape
    tokens = x.numel() // in_features
    if split and n_split > 1 and tokens <= SPLIT_MAX_TOKENS and weight.stride(0) == 1 and in_features % n_split == 0:
        slabs = weight.t().view(n_split, in_features // n_split, out_features)  # [n_split, in/n_split, out]
        pieces = x.reshape(tokens, n_split, in_features // n_split).transpose(0, 1)  # [n_split, tokens, in/n_split]
        partial = torch.bmm(pieces, slabs)  # [n_split, tokens, out]
        return partial.sum(0).view(*x.shape[:-1], out_features)
    return F.linear(x, weight)


def rows_mm(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
    """x [N, in] @ wt [in, out] with each row's bits independent of N (for N up to `INVARIANT_MAX_ROWS`).

    A float32 row alone runs as two copies of itself (a stride-0 view, no copy in Python) and
    keeps the first: the kernel a multi-row pass takes instead of the matrix-vector one.
    """
    if x.shape[0] == 1 and x.dtype == torch.float32:
        return torch.mm(x.expand(2, -1), wt)[:1]
    return torch.mm(x, wt)


def transposed(weight: torch.Tensor, kept: tuple | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, Wᵀ view): `kept` again while it still views this weight's memory, else a new view."""
    if kept is None or kept[0] is not weight or kept[1].data_ptr() != weight.data_ptr():
        kept = (weight, weight.detach().t())
    return kept


class Linear(nn.Linear):
    """`nn.Linear` without bias whose inference forward is one `torch.mm` on a kept view of Wᵀ.

    `F.linear` costs nine operator calls (linear, t, transpose, as_strided, matmul, mm, ...),
    `torch.mm(x, Wᵀ)` four; the transposed view is made once and reused while the weight is
    the same Parameter. Training (gradients on) takes `F.linear`. `invariant` (see the module
    docstring) takes `rows_mm` before the split and the plain call.
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)
        self.split = False  # see `linear`; set for a whole model with `Transformer.split_matvec`
        self.lean = True  # False: `F.linear`, the plain call (`Transformer.lean_step`)
        self.invariant = False  # rows independent of the row count (`Transformer.batch_invariant`)
        self._wt = None

    def weight_t(self) -> torch.Tensor:
        """Wᵀ [in, out], a view of the weight (contiguous when the weight is column-major)."""
        self._wt = transposed(self.weight, self._wt)
        return self._wt[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return linear(x, self.weight, self.split)
        if self.invariant:
            return rows_mm(x.reshape(-1, x.shape[-1]), self.weight_t()).view(*x.shape[:-1], self.out_features)
        if x.dim() != 2 or self.split or not self.lean:
            return linear(x, self.weight, self.split)
        return torch.mm(x, self.weight_t())  # [N, in] @ [in, out]


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight, over the last dimension (no mean subtraction, no bias).

    One form for any number of rows: a one-token special case (`torch.dot` for the sum of
    squares) saved ~1 µs a call but rounded unlike the row reduction, so a token's hidden
    state depended on how many tokens shared its pass (see the module docstring).
    """

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self._eps = None  # eps as a float32 tensor on the input's device, made on first use
        self.lean = True  # False: `F.rms_norm`, the plain call (`Transformer.lean_step`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or not self.lean or torch.is_grad_enabled():
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # eps as a tensor: a Python number costs four operator calls a use (wrapped, then copied)
        if self._eps is None or self._eps.device != x.device:
            self._eps = torch.tensor(self.eps, device=x.device)
        return x * torch.rsqrt(torch.mean(x * x, -1, keepdim=True).add(self._eps)) * self.weight  # = F.rms_norm


def attend_rows(cache, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope) -> torch.Tensor:
    """`cache.attend` whose T queries each attend alone over the keys they see: [B·T, H·D], row-invariant.

    A one-token step at position p attends over the cache's first p + 1 keys with no mask (the
    one-query GQA call of `labkit.kvcache.base.attention`). Query i of a T-token pass over a
    contiguous cache of S keys sees the first S − T + i + 1: the same call on the same views
    gives it the same bits, which one masked call over all T queries does not (the attention
    kernel splits its work by query and key counts). Kinds that attend their own way, or
    whose mask is not that causal prefix (a sliding window), take their usual call.
    """
    T = q.shape[1]
    if T == 1 or type(cache).attend is not KVCache.attend:
        return cache.attend(layer, q, k, v, rope)
    keys, values, mask = cache.update(layer, k.transpose(1, 2), v.transpose(1, 2), rope)
    S = keys.shape[2]
    if mask is not None and not torch.equal(mask, causal_mask(T, S, mask.device)):
        return attention(q, keys, values, mask)
    rows = [attention(q[:, i:i + 1], keys[:, :, :S - T + i + 1], values[:, :, :S - T + i + 1]) for i in range(T)]
    return torch.stack(rows, 1).view(q.shape[0] * T, -1)  # [B, T, H·D] -> [B·T, H·D]


@contextmanager
def batch_invariant(model, on: bool = True):
    """`with batch_invariant(model):` runs the block with `model.batch_invariant = on`, then restores it."""
    before = model.batch_invariant
    model.batch_invariant = on
    try:
        yield model
    finally:
        model.batch_invariant = before
