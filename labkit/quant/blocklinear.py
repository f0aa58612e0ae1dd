"""A linear layer whose weight is stored in a block format: GGUF's Q4_0, Q4_1, Q5_0, Q8_0 and the K-quants
Q4_K, Q5_K, Q6_K, or the microscaling MXFP4, MXFP8 and NVFP4.

    activations="float"  the weight is dequantized once and multiplied in float32: the format's
                         numbers at float speed (the reference path, for measuring quality)
    activations="int8"   (Q8_0 and Q4_1 weights) each input row is quantized to Q8_0 / Q8_1 per
                         block of 32 and the layer multiplies integers (`labkit.quant.intdot`),
                         as llama.cpp does; `sums` picks the plain-torch int32 reference, "float"
                         (exact float32 block products), `torch._int_mm`, or "auto" (the default: "float")

`nbytes()` is what the format stores (codes and scales), whatever path computes the product.

    >>> layer = BlockLinear(torch.randn(64, 128), "Q8_0", activations="int8", sums="reference")
    >>> layer(torch.randn(3, 128)).shape
    torch.Size([3, 64])
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from labkit.quant import ggml, intdot, mx
from labkit.quant.linear import float_product

__all__ = ["BlockLinear", "BLOCK_FORMATS", "GGML_FORMATS", "INT_ACT_FORMATS", "ACTIVATIONS", "check_options", "fits"]

INT_ACT_FORMATS = ("Q8_0", "Q4_1")
GGML_FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")  # float activations: a dequantized copy
BLOCK_FORMATS = GGML_FORMATS + tuple(mx.FORMATS)


def block_size(fmt: str) -> int:
    """Weights per block of `fmt` along a row (a K-quant's super-block of 256): a row's length must be a multiple."""
    return mx.LAYOUT[fmt][0] if fmt in mx.LAYOUT else ggml.TYPES[fmt][1]


def fits(fmt: str, in_features: int) -> bool:
    """Whether rows of `in_features` weights cut into whole blocks of `fmt`."""
    return in_features % block_size(fmt) == 0
ACTIVATIONS = ("float", "int8")


def check_options(fmt, activations, sums) -> None:
    """ValueError naming the first of fmt, activations, sums that this layer cannot do."""
    if fmt not in BLOCK_FORMATS:
        raise ValueError(f"fmt must be one of {BLOCK_FORMATS}, got {fmt!r}")
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {ACTIVATIONS}, got {activations!r}")
    if activations == "int8" and fmt not in INT_ACT_FORMATS:
        raise ValueError(f"activations='int8' multiplies integer codes: fmt must be one of {INT_ACT_FORMATS}, got {fmt!r}")
    if sums not in intdot.ACT_SUMS:
        raise ValueError(f"sums must be one of {intdot.ACT_SUMS}, got {sums!r}")
    if sums == "int_mm" and activations == "int8" and not intdot.has_int_mm():
        raise ValueError("sums='int_mm' needs torch._int_mm on the CPU, which this torch lacks; use sums='reference'")
    if sums == "int_mm" and activations == "int8" and not intdot.int_mm_exact():
        raise ValueError("sums='int_mm': torch._int_mm gives inexact sums on this CPU (its int8 kernel saturates "
                         "without VNNI, see labkit.quant.intdot.int_mm_exact); use sums='reference' or 'auto'")


class BlockLinear(nn.Module):
    """y = x Wᵀ with W [out, in] in `fmt`; see the module docstring for `activations` and `sums`."""

    def __init__(self, weight: torch.Tensor, fmt: str, activations: str = "float", sums: str = "auto"):
        super().__init__()
        check_options(fmt, activations, sums)
        if not isinstance(weight, torch.Tensor) or not weight.is_floating_point() or weight.dim() != 2:
            raise TypeError(f"weight must be a floating-point matrix [out, in], got {type(weight).__name__} "
                            f"{tuple(getattr(weight, 'shape', ()))}")
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        if not fits(fmt, self.in_features):
            raise ValueError(f"fmt={fmt!r} stores rows in blocks of {block_size(fmt)} weights; this matrix's rows hold "
                             f"{self.in_features} (llama.cpp falls back to another type for such rows: "
                             f"quantize_model(..., fallback=...))")
        self.fmt, self.activations, self.sums = fmt, activations, intdot.resolve_sums(sums)
        if fmt in INT_ACT_FORMATS:
            data = ggml.quantize(w.numpy(), fmt)
            codes, d, m = ggml.block_parts(data, fmt, tuple(w.shape))
            self._nbytes = int(data.size)
            self.register_buffer("codes", torch.from_numpy(np.ascontiguousarray(codes)).to(torch.int8))  # Q4_1: 0..15
            self.register_buffer("d", torch.from_numpy(d))
            self.register_buffer("m", None if m is None else torch.from_numpy(m))
            dense = self.codes.float() * self.d.repeat_interleave(ggml.BLOCK, 1)
            if self.m is not None:
                dense = dense + self.m.repeat_interleave(ggml.BLOCK, 1)
        elif fmt in GGML_FORMATS:  # Q4_0, Q5_0 and the K-quants: the format's numbers, multiplied in float32
            data = ggml.quantize(w.numpy(), fmt)
            self._nbytes, self.codes, self.d, self.m = int(data.size), None, None, None
            dense = torch.from_numpy(ggml.dequantize(data, fmt, tuple(w.shape)))
        else:
            t = mx.quantize(w, fmt)
            self._nbytes = int(t.nbytes())
            dense = t.dequantize()
        self.register_buffer("dense", dense if activations == "float" else None)
        self.invariant = False  # float activations: each row with its one-row bits (`float_product`)

    @property
    def weight(self) -> torch.Tensor:
        """The float32 matrix the stored format stands for."""
        if self.dense is not None:
            return self.dense
        w = self.codes.float() * self.d.repeat_interleave(ggml.BLOCK, 1)
        return w if self.m is None else w + self.m.repeat_interleave(ggml.BLOCK, 1)

    def nbytes(self) -> int:
        """Bytes the format stores for this matrix: codes and every scale."""
        return self._nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self.activations == "float":
            y = float_product(x2, self.dense, self.invariant)
        else:
            q4 = self.m is not None
            qa, da, sa = intdot.quantize_activations(x2, with_sum=q4)
            if self.sums == "int_mm":
                sums = intdot.int_mm_block_sums(qa, self.codes.t())
            elif self.sums == "float":
                sums = intdot.float_block_sums(qa, self.codes)
            else:
                sums = intdot.block_sums(qa, self.codes)
            y = intdot.combine(sums, da, self.d, sa, self.m)
        y = y if y.dtype == x.dtype else y.to(x.dtype)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        act = "float32 activations" if self.activations == "float" else f"int8 activations, {self.sums} sums"
        return f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt}, {act}"
