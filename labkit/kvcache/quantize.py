"""Integer quantization of keys and values the KIVI way: keys per channel, values per token.

Follows Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache"
(jy-yuan/KIVI). Asymmetric: a group of numbers x is stored as integer codes
q = round((x − min) / scale), scale = (max − min) / (2^bits − 1), plus `scale` and `min`
in float16. Keys have a few outlier *channels* (dimensions that are large for every
token), so their groups run along tokens, one (scale, min) per channel per `group_size`
tokens; values have no such channels and are grouped along the head dimension, one
(scale, min) per token per `group_size` channels. Every element comes back within half
a step: |x − x̂| ≤ scale / 2. 4-bit codes are packed two to a byte.

    >>> x = torch.tensor([[0.0, -1.0], [255.0, 254.0], [10.0, 3.5]])   # 3 tokens, 2 channels
    >>> codes, scale, minimum = quantize_keys(x[:2], bits=8, group_size=2)
    >>> codes.tolist(), scale.tolist(), minimum.tolist()          # one (scale, min) per channel
    ([[0, 0], [255, 255]], [[1.0, 1.0]], [[0.0, -1.0]])
    >>> fake_quantize(x, bits=4, group_size=2, per="token").round(decimals=2).tolist()  # values: per token
    [[0.0, -1.0], [255.0, 254.0], [10.0, 3.5]]
"""
from __future__ import annotations

import torch

__all__ = ["quantize_keys", "dequantize_keys", "quantize_values", "dequantize_values", "pack4", "unpack4",
           "fake_quantize", "kv_bits_per_value", "BITS"]

BITS = (4, 8)
SCALE_DTYPE = torch.float16


def check_bits(bits) -> None:
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")


def pack4(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dim: uint8 [..., D] -> [..., D/2] (low nibble first)."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack4`: uint8 [..., D/2] -> [..., D]."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def _quantize(xg: torch.Tensor, bits: int, dim: int):
    """Codes, scale, min for groups along `dim` of xg; scale and min are float16, rounded so
    that [min, min + levels·scale] still covers every value (the half-step bound holds)."""
    levels = 2 ** bits - 1
    xg = xg.float()
    lo, hi = xg.amin(dim, keepdim=True), xg.amax(dim, keepdim=True)
    lo16 = lo.to(SCALE_DTYPE)
    lo16 = torch.where(lo16.float() > lo, torch.nextafter(lo16, torch.full_like(lo16, -float("inf"))), lo16)
    s16 = ((hi - lo16.float()) / levels).to(SCALE_DTYPE)
    s16 = torch.where(lo16.float() + s16.float() * levels < hi, torch.nextafter(s16, torch.full_like(s16, float("inf"))), s16)
    s = s16.float()
    codes = ((xg - lo16.float()) / torch.where(s > 0, s, 1.0)).round_().clamp_(0, levels).to(torch.uint8)
    return codes, s16, lo16


def quantize_keys(x: torch.Tensor, bits: int, group_size: int):
    """Per-channel quantization of keys x [..., T, D], T a multiple of group_size.

    Returns codes uint8 [..., T, D] (8 bits) or [..., T, D/2] (4 bits, packed) and
    scale, min float16 [..., T/group_size, D].
    """
    check_bits(bits)
    *lead, T, D = x.shape
    if T % group_size:
        raise ValueError(f"the number of tokens ({T}) must be a multiple of group_size ({group_size})")
    codes, scale, lo = _quantize(x.reshape(*lead, T // group_size, group_size, D), bits, dim=-2)  # groups of tokens
    codes = codes.reshape(*lead, T, D)
    return (pack4(codes) if bits == 4 else codes), scale.squeeze(-2), lo.squeeze(-2)


def dequantize_keys(codes, scale, minimum, bits: int, group_size: int, dtype=torch.float32) -> torch.Tensor:
    """Keys [..., T, D] back from `quantize_keys`' output."""
    codes = unpack4(codes) if bits == 4 else codes
    *lead, T, D = codes.shape
    grouped = codes.reshape(*lead, T // group_size, group_size, D).float()  # [..., T/G, G, D]
    return (grouped * scale.float().unsqueeze(-2) + minimum.float().unsqueeze(-2)).reshape(*lead, T, D).to(dtype)


def quantize_values(x: torch.Tensor, bits: int, group_size: int):
    """Per-token quantization of values x [..., T, D], D a multiple of group_size.

    Returns codes (as `quantize_keys`) and scale, min float16 [..., T, D/group_size].
    """
    check_bits(bits)
    *lead, T, D = x.shape
    if D % group_size:
        raise ValueError(f"head_dim ({D}) must be a multiple of group_size ({group_size})")
    codes, scale, lo = _quantize(x.reshape(*lead, T, D // group_size, group_size), bits, dim=-1)  # groups of channels
    codes = codes.reshape(*lead, T, D)
    return (pack4(codes) if bits == 4 else codes), scale.squeeze(-1), lo.squeeze(-1)


def dequantize_values(codes, scale, minimum, bits: int, group_size: int, dtype=torch.float32) -> torch.Tensor:
    """Values [..., T, D] back from `quantize_values`' output."""
    codes = unpack4(codes) if bits == 4 else codes
    *lead, T, D = codes.shape
    grouped = codes.reshape(*lead, T, D // group_size, group_size).float()  # [..., T, D/G, G]
    return (grouped * scale.float().unsqueeze(-1) + minimum.float().unsqueeze(-1)).reshape(*lead, T, D).to(dtype)


def fake_quantize(x: torch.Tensor, bits: int, group_size: int, per: str = "channel") -> torch.Tensor:
    """Quantize and dequantize x [..., T, D]: per="channel" (KIVI keys) or "token" (values; also
    the naive choice for keys that the outlier channels punish)."""
    if per == "channel":
        return dequantize_keys(*quantize_keys(x, bits, group_size), bits, group_size, x.dtype)
    if per == "token":
        return dequantize_values(*quantize_values(x, bits, group_size), bits, group_size, x.dtype)
    raise ValueError(f"per must be 'channel' or 'token', got {per!r}")


def kv_bits_per_value(bits: int, group_size: int) -> float:
    """Stored bits per cached number: the code plus a float16 scale and min shared by a group.

    >>> kv_bits_per_value(8, 32), kv_bits_per_value(4, 32)
    (9.0, 5.0)
    """
    check_bits(bits)
    return bits + 2 * 16 / group_size
