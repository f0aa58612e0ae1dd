"""Weight-only quantized linear layers on PyTorch's packed CPU kernels, with the float reference beside them.

    int8: per-output-channel symmetric codes, w = q·s              -> torch._weight_int8pack_mm
    int4: asymmetric groups along the input, w = q·s + m, q ∈ [0, 15] -> aten._weight_int4pack_mm_for_cpu

The int4 kernel computes w = (q − 8)·scale + zero, so an asymmetric group (s, m) is handed
over as scale = s, zero = m + 8·s. Both kernels read the integer codes and multiply in the
activations' dtype; `reference=True` (or a torch without the kernels) computes the same
product as `x @ dequantize(W)ᵀ` in float32, which is what the lab teaches and what the
tests compare the kernels against.

With bfloat16 activations the kernels beat a float32 matmul at every number of tokens; with
float32 activations they fall to scalar code, slower than it even for one token and many times
slower for a prompt than dequantizing and multiplying in float32 (`labkit bench --only quant`
times both on this machine). So a float32-activation layer
uses the kernel for one token and the dequantized float product for more: prefill and
calibration stay fast, and both paths give the float32 numbers, though not the same bits.

`invariant` (set by `Transformer.batch_invariant`) gives each row of a pass of up to 16 rows
the bits a one-row call gives it, through `labkit.quant.rows.row_invariant`: the call a
one-token step makes (the packed kernel for either activation dtype, or the dequantized float32
product for `reference`), once for the pass where this process checked that it is row-invariant
at this shape, else once per row. Longer passes (a prompt) take the usual path.

    >>> layer = QuantLinear.from_float(torch.randn(64, 128), bits=8)
    >>> layer(torch.randn(1, 3, 128)).shape
    torch.Size([1, 3, 64])
"""
from __future__ import annotations

import torch
from torch import nn

from labkit import checks
from labkit.quant.rows import INVARIANT_MAX_ROWS, invariant_now, row_invariant
from labkit.quant.rtn import BITS, QuantizedTensor, dequantize, quantize

__all__ = ["QuantLinear", "has_kernel", "ACT_DTYPES", "layout", "packed_layout_problem", "float_product"]

ACT_DTYPES = (torch.float32, torch.bfloat16)


def float_product(x: torch.Tensor, w: torch.Tensor, invariant: bool = False) -> torch.Tensor:
    """x [N, in] @ w [out, in]ᵀ in float32; `invariant`: each row with the bits it gets alone (`row_invariant`)."""
    if not invariant:
        return x.float() @ w.t()
    return row_invariant(lambda a: a.float() @ w.t(), x, ("float-mm", tuple(w.shape), w.stride()))


def has_kernel(bits: int) -> bool:
    """Whether this torch build has the packed kernel for `bits` (8 or 4)."""
    if bits == 8:
        return hasattr(torch, "_weight_int8pack_mm")
    if bits == 4:
        return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
    return False


def layout(bits: int, group_size) -> tuple[int | str, bool]:
    """(granularity, symmetric) of a quantized layer: int8 per channel and symmetric (the int8 kernel's
    layout), fewer bits asymmetric in groups of `group_size` (or per channel)."""
    return ("channel", True) if bits == 8 else (group_size, False)


def packed_layout_problem(qt: QuantizedTensor) -> str | None:
    """Why the packed kernels cannot take these codes, or None when they can."""
    out_f, in_f = qt.shape
    if qt.bits == 8:
        if not qt.symmetric or qt.group_size != in_f or qt.per_tensor:
            return "the int8 kernel takes per-channel symmetric codes (group_size='channel', symmetric=True)"
        return None
    if qt.bits == 4:
        if qt.symmetric or qt.per_tensor or qt.group_size not in (32, 64, 128, 256):
            return (f"the int4 kernel takes asymmetric codes in groups of 32, 64, 128 or 256, got "
                    f"group_size={qt.group_size}, symmetric={qt.symmetric}")
        if in_f % 2 or out_f % 8:
            return f"the int4 kernel needs out_features % 8 == 0 and even in_features, got [{out_f}, {in_f}]"
        return None
    return f"no packed kernel holds {qt.bits}-bit codes (only 8 and 4)"


class QuantLinear(nn.Module):
    """y = x Wᵀ with W stored as int8 (per channel) or int4 (groups of `group_size`) codes."""

    def __init__(self, qt: QuantizedTensor, act_dtype: torch.dtype = torch.float32, reference: bool = False):
        super().__init__()
        why = packed_layout_problem(qt)
        if why and not reference:
            raise ValueError(f"{why}; pass reference=True to compute x @ dequantize(W)ᵀ in float32 instead")
        if act_dtype not in ACT_DTYPES:
            raise ValueError(f"act_dtype must be one of {ACT_DTYPES}, got {act_dtype}")
        self.out_features, self.in_features = qt.shape
        self.bits, self.group_size, self.act_dtype = qt.bits, qt.group_size, act_dtype
        self.qt = qt
        self.invariant = False  # rows independent of the row count (see the module docstring)
        self.reference = reference or not has_kernel(qt.bits)
        if self.reference:
            return
        if qt.bits == 8:
            self.register_buffer("codes", qt.codes.contiguous())
            self.register_buffer("scales", qt.scale[:, 0].to(act_dtype).contiguous())
        else:
            self.register_buffer("codes", torch.ops.aten._convert_weight_to_int4pack_for_cpu(qt.codes.to(torch.int32), 1))
            zero = qt.minimum + 8 * qt.scale  # the kernel's (q − 8)·scale + zero == q·s + m
            sz = torch.stack([qt.scale.t(), zero.t()], dim=-1).contiguous()  # [in / group, out, 2]
            self.register_buffer("scales", sz.to(act_dtype))

    @classmethod
    def from_float(cls, weight: torch.Tensor, bits: int = 8, group_size: int = 32, act_dtype=torch.float32,
                   reference: bool = False) -> "QuantLinear":
        """RTN-quantize a float weight [out, in]: int8 symmetric per channel, fewer bits asymmetric in groups
        of `group_size` (an int, or "channel"); layouts the packed kernels do not take need `reference`."""
        checks.one_of("bits", bits, BITS)
        granularity, symmetric = layout(bits, group_size)
        return cls(quantize(weight, bits, granularity, symmetric=symmetric), act_dtype=act_dtype, reference=reference)

    @property
    def weight(self) -> torch.Tensor:
        """The float32 matrix the codes stand for (for inspection; the forward never builds it)."""
        return dequantize(self.qt)

    def nbytes(self) -> int:
        """Bytes of the format: `bits` per code plus a 16-bit scale (and minimum) per group, as GGUF stores them.

        The packed layers with bfloat16 activations hold exactly that; float32-activation layers
        keep their scales in float32 (a few percent more for int4 in groups of 32).
        """
        per_group = 1 if self.qt.symmetric else 2
        return self.out_features * self.in_features * self.bits // 8 + self.qt.scale.numel() * 2 * per_group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)  # [N, in]
        rows, invariant = x2.shape[0], invariant_now(self.invariant)
        if self.reference or (self.act_dtype == torch.float32 and rows > (INVARIANT_MAX_ROWS if invariant else 1)):
            w = dequantize(self.qt)
            y = float_product(x2, w, invariant)
        elif invariant:
            y = row_invariant(self.kernel, x2, ("int-pack", self.bits, self.group_size, self.act_dtype,
                                                   self.out_features, self.in_features))
        else:
            y = self.kernel(x2)
        y = y if y.dtype == x.dtype else y.to(x.dtype)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def kernel(self, x2: torch.Tensor) -> torch.Tensor:
        """The packed kernel on activations [N, in] in the layer's activation dtype."""
        a = x2 if x2.dtype == self.act_dtype else x2.to(self.act_dtype)
        if self.bits == 8:
            return torch._weight_int8pack_mm(a.contiguous(), self.codes, self.scales)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(a.contiguous(), self.codes, self.group_size, self.scales)

    def extra_repr(self) -> str:
        kind = "reference" if self.reference else "packed kernel"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
                f"group_size={self.group_size}, act_dtype={self.act_dtype}, {kind}")
