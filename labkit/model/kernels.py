"""The two pieces every layer of the transformer calls: the weight product and RMSNorm, lean.

A SmolLM2 decode step calls them 121 and 61 times. At batch 1 what they cost beyond their
arithmetic is operator calls: `F.linear` is nine (linear, t, transpose, as_strided, matmul,
mm, ...), `torch.mm` on a kept view of Wᵀ four; `F.rms_norm` is 24 on this torch (its
Python-number constants are each wrapped and copied), the form below nine for one token.
Same numbers either way: the decode path's greedy tokens are those of the plain calls.

    >>> layer = Linear(8, 4)
    >>> with torch.inference_mode():
    ...     y = layer(torch.ones(2, 8))                 # torch.mm(x, Wᵀ)
    >>> torch.equal(y, torch.nn.functional.linear(torch.ones(2, 8), layer.weight.detach()))
    True
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Linear", "RMSNorm", "linear", "transposed", "SPLIT_MAX_TOKENS"]

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


def transposed(weight: torch.Tensor, kept: tuple | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, Wᵀ view): `kept` again while it still views this weight's memory, else a new view."""
    if kept is None or kept[0] is not weight or kept[1].data_ptr() != weight.data_ptr():
        kept = (weight, weight.detach().t())
    return kept


class Linear(nn.Linear):
    """`nn.Linear` without bias whose inference forward is one `torch.mm` on a kept view of Wᵀ.

    `F.linear` costs nine operator calls (linear, t, transpose, as_strided, matmul, mm, ...),
    `torch.mm(x, Wᵀ)` four; the transposed view is made once and reused while the weight is
    the same Parameter. Training (gradients on) takes `F.linear`.
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)
        self.split = False  # see `linear`; set for a whole model with `Transformer.split_matvec`
        self.lean = True  # False: `F.linear`, the plain call (`Transformer.lean_step`)
        self._wt = None

    def weight_t(self) -> torch.Tensor:
        """Wᵀ [in, out], a view of the weight (contiguous when the weight is column-major)."""
        self._wt = transposed(self.weight, self._wt)
        return self._wt[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or self.split or not self.lean or torch.is_grad_enabled():
            return linear(x, self.weight, self.split)
        return torch.mm(x, self.weight_t())  # [N, in] @ [in, out]


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight, over the last dimension (no mean subtraction, no bias)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self._constants = None  # (d, eps) as float32 tensors on the input's device, made on first use
        self.lean = True  # False: `F.rms_norm`, the plain call (`Transformer.lean_step`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or not self.lean or torch.is_grad_enabled():
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # the constants as tensors: a Python number costs four operator calls a use (wrapped, then copied)
        if self._constants is None or self._constants[0].device != x.device:
            self._constants = (torch.tensor(float(x.shape[-1]), device=x.device), torch.tensor(self.eps, device=x.device))
        n, eps = self._constants
        if x.numel() == x.shape[-1]:  # one decode token: a dot product costs far less than the reduction kernel
            flat = x.view(-1)
            return x * (torch.rsqrt(torch.dot(flat, flat).div(n).add(eps)) * self.weight)
        return x * torch.rsqrt(torch.mean(x * x, -1, keepdim=True).add(eps)) * self.weight  # = F.rms_norm


