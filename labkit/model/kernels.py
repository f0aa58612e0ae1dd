"""The pieces every layer of the transformer calls: the weight product and RMSNorm, lean, and row-invariant on demand.

A SmolLM2 decode step calls them 121 and 61 times. At batch 1 what they cost beyond their
arithmetic is operator calls: `F.linear` is nine (linear, t, transpose, as_strided, matmul,
mm, ...), `torch.mm` on a kept view of Wᵀ four; `F.rms_norm` is 24 on this torch (its
Python-number constants are each wrapped and copied), the form below eight.
Same numbers either way: the decode path's greedy tokens are those of the plain calls.

Batch invariance. Speculative decoding checks k drafted tokens in one k-token pass while
plain decoding runs k one-token steps, and "lossless" means its greedy output is the plain
greedy output whatever γ. That holds only if each row of a k-token pass gets the bits it
gets alone: floating-point addition is not associative, so a kernel that picks its
blocking by the number of rows rounds the same row differently, the logits move in their
last bits, and where two tokens nearly tie the argmax flips. Which kernels do so depends on
the CPU, its instruction set and the thread count (`labkit.quant.rows` lists what was seen),
so the model's switch, `Transformer.batch_invariant` (off by default; `batch_invariant(model)`
turns it on for a block), does not rely on any of them, for passes of up to
`INVARIANT_MAX_ROWS` tokens:

  * products (`rows_mm` here, the quantized layers alike) go through
    `labkit.quant.rows.row_invariant`: one call where this process has checked that the
    kernel gives every row its one-row bits at this shape, dtype and thread count, else one
    call per row, the call a one-token step makes;
  * `attend_rows`: each query of a multi-token pass attends alone, the very call a one-token
    step makes: T calls instead of one (what the mode costs per format: `labkit bench --only step`).
  * RMSNorm has one form for every row count (a row's sum of squares is one reduction of its
    own, whatever the rows beside it), switch or not.

A one-token step is the same call with the switch or without, so speculative decoding with
the switch reproduces plain decoding without it, in every format.

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
from labkit.quant.rows import INVARIANT_MAX_ROWS, row_invariant

__all__ = ["Linear", "RMSNorm", "linear", "transposed", "rows_mm", "attend_rows", "batch_invariant",
           "SPLIT_MAX_TOKENS", "INVARIANT_MAX_ROWS"]

SPLIT_MAX_TOKENS = 16  # up to this many tokens per product take the split (measured: beyond, F.linear is as fast)


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
    """x [N, in] @ wt [in, out] with each row's bits those of the row alone (for N up to `INVARIANT_MAX_ROWS`).

    `torch.mm(x, wt)`, the lean step's own call, through `labkit.quant.rows.row_invariant`: one call
    where this kernel at this shape and layout is checked row-invariant here, one call per row otherwise.
    """
    return row_invariant(lambda a: torch.mm(a, wt), x, ("mm", tuple(wt.shape), wt.stride(), wt.dtype))


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
    docstring) takes `rows_mm`, the lean call made row-invariant, before the split and the plain call.
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)
        self.split = False  # see `linear`; set for a whole model with `Transformer.split_matvec`
        self.lean = True  # False: `F.linear`, the plain call (`Transformer.lean_step`)
        self.invariant = False  # rows independent of the row count (`Transformer.batch_invariant`)
        self._wt = None

    def weight_t(self) -> torch.Tensor:
        """Wᵀ [in, out], a view of the weight (contiguous when the weight is column-major)."""
        if torch.compiler.is_compiling():  # a traced pass keeps no view on the module
            return self.weight.t()
        self._wt = transposed(self.weight, self._wt)
        return self._wt[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return linear(x, self.weight, self.split)
        if self.invariant:
            if x.dim() == 2:
                return rows_mm(x, self.weight_t())
            return rows_mm(x.reshape(-1, x.shape[-1]), self.weight_t()).view(*x.shape[:-1], self.out_features)
        if x.dim() != 2 or self.split or not self.lean:
            return linear(x, self.weight, self.split)
        return torch.mm(x, self.weight_t())  # [N, in] @ [in, out]


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight, over the last dimension (no mean subtraction, no bias).

    One form for any number of rows. A one-token special case (`torch.dot` for the sum of
    squares) once saved the reduction kernel's overhead but rounded unlike the row reduction,
    so a token's hidden state depended on how many tokens shared its pass (see the module
    docstring). sum(x²) / d is bit for bit `torch.mean` (which sums, then divides) in eight
    operator calls for one token where `torch.mean` takes thirteen and the dot form took ten.
    """

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self._constants = None  # (d, eps) as float32 tensors on the input's device, made on first use
        self.lean = True  # False: `F.rms_norm`, the plain call (`Transformer.lean_step`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or not self.lean or torch.is_grad_enabled():
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        if torch.compiler.is_compiling():  # a traced pass: plain numbers, nothing kept on the module
            return x * torch.rsqrt((x * x).sum(-1, keepdim=True).div(x.shape[-1]).add(self.eps)) * self.weight
        # the constants as tensors: a Python number costs four operator calls a use (wrapped, then copied)
        if self._constants is None or self._constants[0].device != x.device:
            self._constants = (torch.tensor(float(x.shape[-1]), device=x.device), torch.tensor(self.eps, device=x.device))
        n, eps = self._constants
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True).div(n).add(eps)) * self.weight  # = F.rms_norm


def attend_rows(cache, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope) -> torch.Tensor:
    """`cache.attend` whose T queries each attend alone over the keys they see: [B·T, H·D], row-invariant.

    A one-token step at position p attends over the cache's first p + 1 keys with no mask (the
    one-query GQA call of `labkit.kvcache.base.attention`). Query i of a T-token pass over a
    contiguous cache of S keys sees the first S − T + i + 1: the same call on the same views
    gives it the same bits, which one masked call over all T queries does not (the attention
    kernel splits its work by query and key counts). Under any other mask (a token tree, a
    sliding window that has slid) each query attends alone over the keys its row of the mask
    lets it see, in slot order: a tree node gets the bits a one-token step on its own path gets
    once the path sits in consecutive slots. A prompt's pass (into an empty cache, or of more
    than `INVARIANT_MAX_ROWS` tokens) and kinds that attend their own way take the usual single
    call, so the switch never changes how a prompt is read. A packed serving batch (`attend_alone`)
    gives every query of a pass of up to `INVARIANT_MAX_ROWS` tokens its own one-query call.
    """
    T = q.shape[1]
    if T <= INVARIANT_MAX_ROWS and hasattr(cache, "attend_alone"):  # a packed batch: each query alone, one-token bits
        return cache.attend_alone(layer, q, k, v, rope)
    if T == 1 or T > INVARIANT_MAX_ROWS or type(cache).attend is not KVCache.attend:
        return cache.attend(layer, q, k, v, rope)
    keys, values, mask = cache.update(layer, k.transpose(1, 2), v.transpose(1, 2), rope)
    S = keys.shape[2]
    if S == T or mask is not None and mask.shape != (T, S):
        return attention(q, keys, values, mask)  # what `cache.attend` does
    if mask is None or _is_causal_prefix(mask, T, S):
        rows = [attention(q[:, i:i + 1], keys[:, :, :S - T + i + 1], values[:, :, :S - T + i + 1]) for i in range(T)]
    else:  # a tree (or a slid window): each query over the keys it sees, in slot order, as a step on that path would
        rows = []
        for i, seen in enumerate(_visible_slots(mask)):
            k_i, v_i = (keys[:, :, :seen], values[:, :, :seen]) if isinstance(seen, int) else \
                (keys.index_select(2, seen), values.index_select(2, seen))
            rows.append(attention(q[:, i:i + 1], k_i, v_i))
    return torch.stack(rows, 1).view(q.shape[0] * T, -1)  # [B, T, H·D] -> [B·T, H·D]


_visible: list = [None, None]  # the last mask seen and its rows' visible slots


def _visible_slots(mask: torch.Tensor) -> list:
    """Per query row of `mask`: the number of keys it sees if they are a prefix, else their slots (computed once a pass)."""
    if mask is not _visible[0]:
        rows = []
        for row in mask:
            slots = row.nonzero().flatten()
            n = slots.numel()
            rows.append(n if n and int(slots[-1]) == n - 1 else slots)
        _visible[:] = [mask, rows]
    return _visible[1]


_checked_mask: list = [None, None, False]  # the last mask seen, its (T, S), whether it was the causal prefix


def _is_causal_prefix(mask: torch.Tensor, T: int, S: int) -> bool:
    """Whether `mask` is `causal_mask(T, S)`: checked once a pass (every layer hands over the same mask)."""
    if mask is not _checked_mask[0] or _checked_mask[1] != (T, S):
        _checked_mask[:] = [mask, (T, S), mask.shape == (T, S) and torch.equal(mask, causal_mask(T, S, mask.device))]
    return _checked_mask[2]


@contextmanager
def batch_invariant(model, on: bool = True):
    """`with batch_invariant(model):` runs the block with `model.batch_invariant = on`, then restores it."""
    before = model.batch_invariant
    model.batch_invariant = on
    try:
        yield model
    finally:
        model.batch_invariant = before
