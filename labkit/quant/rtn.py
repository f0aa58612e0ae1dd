"""Round-to-nearest (RTN) integer quantization of a weight matrix: per tensor, per channel, or in groups.

The baseline every weight quantizer is measured against (GPTQ, Frantar et al. 2022, §2
calls it RTN; so does AWQ, Lin et al. 2023). A group of numbers x shares one scale:

    symmetric   q = round(x / s),        s = max|x| / (2^(b−1) − 1),  q ∈ [−(2^(b−1) − 1), 2^(b−1) − 1],  x̂ = q·s
    asymmetric  q = round((x − m) / s),  s = (max x − min x) / (2^b − 1), m = min x,  q ∈ [0, 2^b − 1],  x̂ = q·s + m

Rounding to the nearest step leaves every element within half a step: |x − x̂| ≤ s / 2.
The asymmetric form with a float minimum is exactly GGUF's Q4_1 (`d·q + m`, groups of 32).
A group is `group_size` consecutive weights of one output row (one row of W [out, in]);
"channel" makes the whole row one group, "tensor" the whole matrix.

    >>> w = torch.tensor([[0.0, 0.5, -1.0, 0.25]])
    >>> qt = quantize(w, bits=8, group_size="channel")
    >>> qt.codes.tolist(), round(float(qt.scale[0, 0]), 5)
    ([[0, 64, -127, 32]], 0.00787)
    >>> bool((dequantize(qt) - w).abs().max() <= qt.scale.max() / 2)
    True
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from labkit import checks

__all__ = ["QuantizedTensor", "quantize", "dequantize", "BITS", "bits_per_weight", "group_params", "encode",
           "decode_codes", "check_weight", "resolve_group_size"]

BITS = (2, 3, 4, 5, 6, 7, 8)


@dataclass
class QuantizedTensor:
    """Integer codes [out, in] and one scale (and minimum, if asymmetric) per group [out, in / group_size]."""

    codes: torch.Tensor  # int8 (symmetric) or uint8 (asymmetric), one code per weight
    scale: torch.Tensor  # float32 [out, n_groups] (per tensor: [1, 1])
    minimum: torch.Tensor | None  # float32, like scale; None when symmetric
    bits: int
    group_size: int  # weights per group along the input dimension (the full row for "channel")
    per_tensor: bool = False

    @property
    def symmetric(self) -> bool:
        return self.minimum is None

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def step(self) -> torch.Tensor:
        """The quantization step of every element [out, in]: the error bound is half of it."""
        return _expand(self.scale, self)


def bits_per_weight(bits: int, group_size: int, symmetric: bool = True, scale_bits: int = 16) -> float:
    """Storage cost: the code plus each group's scale (and minimum) shared by its weights.

    >>> bits_per_weight(4, 32, symmetric=False)       # Q4_1: 4 + (16 + 16) / 32
    5.0
    """
    checks.one_of("bits", bits, BITS)
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    return bits + scale_bits * (1 if symmetric else 2) / group_size


def check_weight(w, bits: int) -> torch.Tensor:
    """The weight as a float32 matrix [out, in], or ValueError/TypeError saying what is wrong."""
    checks.one_of("bits", bits, BITS)
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise TypeError(f"w must be a floating-point torch.Tensor, got {type(w).__name__} {getattr(w, 'dtype', '')}")
    w = w.detach().float()
    if w.dim() == 1:
        w = w.unsqueeze(0)
    if w.dim() != 2 or w.numel() == 0:
        raise ValueError(f"w must be a non-empty matrix [out, in], got shape {tuple(w.shape)}")
    if not torch.isfinite(w).all():
        raise ValueError("w contains NaN or inf; quantization needs finite weights")
    return w


def resolve_group_size(group_size, w: torch.Tensor) -> tuple[int, bool]:
    n_in = w.shape[1]
    if group_size == "tensor":
        return n_in, True
    if group_size == "channel" or group_size is None:
        return n_in, False
    if not checks.is_int(group_size) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, 'channel' or 'tensor', got {group_size!r}")
    if n_in % group_size:
        divisors = [g for g in (16, 32, 64, 128, 256) if n_in % g == 0]
        raise ValueError(f"group_size={group_size} does not divide the {n_in} input features; "
                         f"ones that do: {divisors or [n_in]}")
    return group_size, False


def _expand(per_group: torch.Tensor, qt: QuantizedTensor) -> torch.Tensor:
    out, n_in = qt.codes.shape
    if qt.per_tensor:
        return per_group.expand(out, n_in)
    return per_group.repeat_interleave(qt.group_size, dim=1)


def quantize(w: torch.Tensor, bits: int = 8, group_size: int | str = "channel", symmetric: bool = True) -> QuantizedTensor:
    """RTN-quantize a weight matrix [out, in] (a 1-D tensor counts as one row)."""
    w = check_weight(w, bits)
    g, per_tensor = resolve_group_size(group_size, w)
    out, n_in = w.shape
    groups = w.reshape(1, 1, -1) if per_tensor else w.reshape(out, n_in // g, g)  # [rows, n_groups, g]
    scale, minimum = group_params(groups, bits, symmetric)
    codes = encode(groups, scale.unsqueeze(-1), None if minimum is None else minimum.unsqueeze(-1), bits)
    return QuantizedTensor(codes.reshape(out, n_in), scale, minimum, bits, g, per_tensor)


def group_params(groups: torch.Tensor, bits: int, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(scale, minimum) of each group along the last dimension: [..., g] -> [...] (minimum None if symmetric)."""
    if symmetric:
        scale = groups.abs().amax(-1) / (2 ** (bits - 1) - 1)
        return torch.where(scale > 0, scale, torch.ones_like(scale)), None  # an all-zero group: any scale is exact
    lo, hi = groups.amin(-1), groups.amax(-1)
    scale = (hi - lo) / (2 ** bits - 1)
    return torch.where(scale > 0, scale, torch.ones_like(scale)), lo  # a constant group: x = 0·s + m exactly


def encode(x: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None, bits: int) -> torch.Tensor:
    """Codes of x for (broadcastable) scale and minimum: round to the nearest step, clamp to the range."""
    if minimum is None:
        qmax = 2 ** (bits - 1) - 1
        return torch.round(x / scale).clamp_(-qmax, qmax).to(torch.int8)
    return torch.round((x - minimum) / scale).clamp_(0, 2 ** bits - 1).to(torch.uint8)


def decode_codes(codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None) -> torch.Tensor:
    """The float values of codes: q·s (+ m)."""
    x = codes.float() * scale
    return x if minimum is None else x + minimum


def dequantize(qt: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float matrix the codes stand for: q·s (+ m)."""
    if not isinstance(qt, QuantizedTensor):
        raise TypeError(f"qt must be a QuantizedTensor (from quantize(w, ...)), got {type(qt).__name__}; "
                        "quantize a float matrix first")
    minimum = None if qt.minimum is None else _expand(qt.minimum, qt)
    return decode_codes(qt.codes, _expand(qt.scale, qt), minimum).to(dtype)
