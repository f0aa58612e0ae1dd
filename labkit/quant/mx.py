"""Microscaling formats: MXFP4 and MXFP8 (OCP MX v1.0) and NVIDIA's NVFP4.

A block of consecutive weights shares one scale; each weight keeps a tiny float of its own:

    format  element        block  block scale            tensor scale  bytes/block  bits/weight
    MXFP4   E2M1 (4 bits)  32     E8M0: 2^e              -             1 + 16       4.25
    MXFP8   E4M3 (8 bits)  32     E8M0: 2^e              -             1 + 32       8.25
    NVFP4   E2M1 (4 bits)  16     UE4M3 (an FP8 number)  float32       (4 + 32)/64  4.5 (+32 per tensor)

The element codecs:

    E2M1   sign bit 3 + magnitude index 0..7 for 0, 0.5, 1, 1.5, 2, 3, 4, 6
    E8M0   byte b means 2^(b − 127): 2^-127 .. 2^127; 0xFF is NaN (never written)
    E4M3   sign, 4 exponent bits (bias 7), 3 mantissa bits; max 448, subnormals m·2^-9,
           0x7F / 0xFF are NaN (never written); UE4M3 is the unsigned half (NVFP4 scales)

MX (OCP): shared exponent e = floor(log2(amax)) − emax (emax 2 for E2M1, 8 for E4M3), clamped
to −127..127; each element is x / 2^e rounded to the element grid, saturating at its max.
E2M1 rounds a tie to the value of smaller magnitude (0.75 -> 0.5, 5 -> 4), as ggml does; half-to-even
(to the code whose mantissa bit is 0) would agree at 5 -> 4 (4 is even, 6 odd) and differ at 0.75 -> 1
(0.5 is odd, 1 even), and likewise at 0.25 -> 0 (not 0.5) and 2.5 -> 2. E4M3 rounds ties to even. NVFP4 (two levels): s_t = amax(tensor) / (6·448), block scale =
UE4M3(amax(block) / 6 / s_t), element = E2M1(x / (block scale · s_t)).
The MX exponent leaves amax / 2^e anywhere in [2^emax, 2^(emax+1)), above the element's max:
E2M1 saturates [6, 8)·2^e to 6·2^e, E4M3 [448, 512)·2^e to 448·2^e. That clipping is the spec's.

GGML layouts (`ggml.quantize(x, "MXFP4" | "NVFP4")` comes here): an MXFP4 block is the E8M0
byte then 16 bytes of nibbles, byte j holding element j (low) and j+16 (high), as Q4_0. An NVFP4
super-block of 64 is 4 UE4M3 bytes then, per 16-weight sub-block, 8 bytes whose low nibbles are
elements 0..7 and high nibbles 8..15. GGML stores no tensor scale: through `ggml` it is 1.0 and
the block scales carry everything, so |x| above 6·448 = 2688 saturates and blocks whose amax/6
is below 2^-6 fall into E4M3's subnormals (fewer bits). MXFP8 is labkit's: E8M0 then 32 E4M3 bytes.

Where labkit differs from the `gguf` package (llama.cpp's numpy port), on purpose:
  * gguf takes floor(np.log2(amax)) in float32, which rounds up to k for amax within a few
    float32 ulps below 2^k (up to ~20 ulps for large |k|; e.g. 1023.99994 or the largest
    float32), so its exponent is one higher than the spec's. labkit takes the exact floor
    (np.frexp): other bytes there, decoding to values the spec prescribes (for amax just
    under 2^k the spec's choice clips amax to 6·2^e; gguf's happens to lose less).
  * for blocks with amax < 2^-125 gguf's exponent goes negative and wraps around as uint8
    (amax = 2^-126 writes 0xFF, the NaN byte, and decodes to 0); labkit clamps to 2^-127 (0x00).
  * decoding, E8M0 0xFF is NaN here (gguf: 2^127) and UE4M3 0x7F is NaN here (gguf: 0); NVFP4
    scale bytes with the sign bit set raise ValueError (gguf ignores that bit). labkit never writes them.

    >>> x = np.zeros((1, 32), dtype=np.float32); x[0, :5] = [6, 5, 0.75, -0.3, 2.9]
    >>> t = quantize(x, "MXFP4")
    >>> t.data.shape, t.nbytes(), bits_per_weight("MXFP4")     # one block: 1 scale + 16 bytes
    ((1, 17), 17, 4.25)
    >>> t.dequantize()[0, :5].tolist()     # e = floor(log2 6) − 2 = 0; ties: 5 -> 4, 0.75 -> 0.5
    [6.0, 4.0, 0.5, -0.5, 3.0]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FORMATS = ("MXFP4", "MXFP8", "NVFP4")
# fmt: (weights per block, bytes per block, bytes per tensor) in the layouts above
LAYOUT = {"MXFP4": (32, 17, 0), "MXFP8": (32, 33, 0), "NVFP4": (64, 36, 4)}

E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)
E2M1_VALUES = np.concatenate([E2M1_VALUES, -E2M1_VALUES]) + np.float32(0)  # code -> value; code 8 (−0) reads
# as +0.0, as in ggml's tables, so decoded bits match gguf's; the encoder never writes code 8
_E2M1_MIDPOINTS = (E2M1_VALUES[1:8] + E2M1_VALUES[:7]) / 2  # 0.25, 0.75, ..., 5
E2M1_MAX, E4M3_MAX = 6.0, 448.0


def _e4m3_table() -> np.ndarray:
    b = np.arange(256)
    exp, man = (b >> 3) & 0xF, b & 7
    mag = np.where(exp == 0, man, 8 + man) * np.exp2(np.maximum(exp, 1) - 10.0)
    val = np.where(b & 0x80, -mag, mag).astype(np.float32)
    val[(b & 0x7F) == 0x7F] = np.nan
    return val


E4M3_VALUES = _e4m3_table()  # byte -> value


def e2m1_encode(v: np.ndarray) -> np.ndarray:
    """Nearest E2M1 code (uint8 0..15) of each value; |v| > 6 saturates; ties go to the smaller magnitude."""
    v = np.asarray(v)
    idx = np.searchsorted(_E2M1_MIDPOINTS, np.abs(v), side="left").astype(np.uint8)  # midpoints < |v|
    return idx | np.where((v < 0) & (idx > 0), np.uint8(8), np.uint8(0))


def e2m1_decode(codes: np.ndarray) -> np.ndarray:
    return E2M1_VALUES[np.asarray(codes) & 0x0F]


def e8m0_encode(exponent: np.ndarray) -> np.ndarray:
    """Byte of 2^exponent, the exponent clamped to the E8M0 range −127..127 (0xFF, NaN, is never written)."""
    return (np.clip(np.asarray(exponent), -127, 127) + 127).astype(np.uint8)


def e8m0_decode(b: np.ndarray) -> np.ndarray:
    b = np.asarray(b).astype(np.int32)
    return np.where(b == 0xFF, np.float32(np.nan), np.ldexp(np.float32(1), np.minimum(b, 254) - 127)).astype(np.float32)


def e4m3_encode(v: np.ndarray, unsigned: bool = False) -> np.ndarray:
    """E4M3 byte of each value: saturates at ±448, rounds to nearest, ties to even (as torch.float8_e4m3fn does).

    `unsigned=True` is the UE4M3 of NVFP4's block scales: the values must not be negative.
    """
    v = np.asarray(v, dtype=np.float64)
    if unsigned and (v < 0).any():
        raise ValueError(f"UE4M3 holds no negative values; got min {v.min()}")
    a = np.minimum(np.abs(v), E4M3_MAX)
    _, ex = np.frexp(a)  # a = m·2^ex with m in [0.5, 1): floor(log2 a) = ex − 1
    e = np.where(a < 2.0**-6, -6, ex - 1)  # subnormals share the smallest normal's exponent
    n = np.round(np.ldexp(a, 3 - e)).astype(np.int64)  # 8..16 (normal) or 0..8: exact, half to even
    code = ((e + 6) * 8 + n).astype(np.uint8)  # n = 16 carries into the next exponent by itself
    return code | np.where(np.signbit(v) & (not unsigned), np.uint8(0x80), np.uint8(0))  # −0 stays −0, as torch


def e4m3_decode(b: np.ndarray) -> np.ndarray:
    return E4M3_VALUES[np.asarray(b, dtype=np.uint8)]


def _floor_log2(a: np.ndarray) -> np.ndarray:
    """Exact floor(log2(a)) for a > 0 (np.log2 in float32 rounds up just below powers of two)."""
    return np.frexp(a)[1].astype(np.int64) - 1


def _pack(codes: np.ndarray, half: int) -> np.ndarray:
    """[n, k·2·half] codes -> [n, k·half] bytes: in each group of 2·half, element j low, j+half high."""
    g = codes.reshape(codes.shape[0], -1, 2, half)
    return (g[:, :, 0] | (g[:, :, 1] << np.uint8(4))).reshape(codes.shape[0], -1)


def _unpack(qs: np.ndarray, half: int) -> np.ndarray:
    g = qs.reshape(qs.shape[0], -1, 1, half)
    return np.concatenate([g & np.uint8(0x0F), g >> np.uint8(4)], axis=2).reshape(qs.shape[0], -1)


def _check_fmt(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    return fmt


def _blocks(x: np.ndarray, fmt: str) -> np.ndarray:
    per_block = LAYOUT[fmt][0]
    if x.ndim == 0 or x.shape[-1] % per_block:
        unit = "64 (NVFP4's GGML super-block: 4 blocks of 16)" if fmt == "NVFP4" else str(per_block)
        raise ValueError(f"{fmt} needs rows (last dim of x) whose length is a multiple of {unit}; "
                         f"got shape {tuple(x.shape)}")
    if not np.isfinite(x).all():
        raise ValueError(f"{fmt}: x contains NaN or inf; these formats encode finite numbers only")
    return x.reshape(-1, per_block).astype(np.float64)  # float64: x / 2^e and x / scale stay exact


def _shared_exponent(blocks: np.ndarray, emax: int) -> np.ndarray:
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    return np.where(amax > 0, np.clip(_floor_log2(np.where(amax > 0, amax, 1)) - emax, -127, 127), -127)


def quantize_blocks(x: np.ndarray, fmt: str, tensor_scale: float | None = None) -> tuple[np.ndarray, float]:
    """Float weights [..., cols] -> (uint8 bytes [..., cols / block · bytes per block], tensor scale).

    The tensor scale is 1.0 for MXFP4 / MXFP8; for NVFP4 it is amax / (6·448) unless given
    (`ggml` passes 1.0: the GGML file keeps no tensor scale).
    """
    fmt = _check_fmt(fmt)
    x = np.asarray(x, dtype=np.float32)
    blocks = _blocks(x, fmt)
    per_block, size, _ = LAYOUT[fmt]
    if fmt == "MXFP4":
        e = _shared_exponent(blocks, 2)
        codes = e2m1_encode(np.ldexp(blocks, -e))
        out, s_t = np.concatenate([e8m0_encode(e), _pack(codes, 16)], axis=1), 1.0
    elif fmt == "MXFP8":
        e = _shared_exponent(blocks, 8)
        out, s_t = np.concatenate([e8m0_encode(e), e4m3_encode(np.ldexp(blocks, -e))], axis=1), 1.0
    else:
        s_t = _nvfp4_tensor_scale(blocks) if tensor_scale is None else float(np.float32(tensor_scale))
        if not (np.isfinite(s_t) and s_t > 0):
            raise ValueError(f"tensor_scale must be a positive finite number, got {tensor_scale!r}")
        sub = blocks.reshape(-1, 16)  # [n sub-blocks, 16]
        want = np.abs(sub).max(axis=1, keepdims=True) / E2M1_MAX / s_t
        d = e4m3_encode(want, unsigned=True)
        d = np.where((d == 0) & (want > 0), np.uint8(1), d)  # a non-zero block never gets scale 0
        scale = e4m3_decode(d).astype(np.float64) * s_t
        codes = e2m1_encode(sub / np.where(scale > 0, scale, 1.0))  # all-zero sub-blocks: codes 0
        out = np.concatenate([d.reshape(-1, 4), _pack(codes, 8).reshape(-1, 32)], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // per_block * size), s_t


def _nvfp4_tensor_scale(blocks: np.ndarray) -> float:
    """float32 amax / (6·448), rounded down so no block scale needs more than 448 (1.0 for all zeros)."""
    amax = float(np.abs(blocks).max()) if blocks.size else 0.0
    if amax == 0:
        return 1.0
    exact = amax / (E2M1_MAX * E4M3_MAX)
    s = np.float32(exact)
    if float(s) > exact:
        s = np.nextafter(s, np.float32(0))
    return float(max(s, np.float32(2.0**-149)))  # amax below ~1.9e-42 would underflow to 0


def dequantize_blocks(data: np.ndarray, fmt: str, tensor_scale: float = 1.0) -> np.ndarray:
    """uint8 bytes [..., row_bytes] -> float32 weights [..., cols] (NVFP4: times `tensor_scale`)."""
    fmt = _check_fmt(fmt)
    raw = np.asarray(data).view(np.uint8)
    per_block, size, _ = LAYOUT[fmt]
    if raw.ndim == 0 or raw.shape[-1] % size:
        raise ValueError(f"{fmt} blocks are {size} bytes; got data of shape {raw.shape}, "
                         f"whose rows are not a whole number of blocks")
    blocks = raw.reshape(-1, size)
    if fmt == "MXFP4":
        out = e2m1_decode(_unpack(blocks[:, 1:], 16)) * e8m0_decode(blocks[:, :1])
    elif fmt == "MXFP8":
        out = e4m3_decode(blocks[:, 1:]) * e8m0_decode(blocks[:, :1])
    else:
        if (blocks[:, :4] & 0x80).any():
            raise ValueError("NVFP4 block scales are unsigned E4M3: data holds a scale byte with the sign bit set")
        d = e4m3_decode(blocks[:, :4]).reshape(-1, 1)  # [n sub-blocks, 1]
        out = e2m1_decode(_unpack(blocks[:, 4:].reshape(-1, 8), 8)) * d
        if tensor_scale != 1.0:
            out = out * np.float32(tensor_scale)
    return out.astype(np.float32).reshape(*raw.shape[:-1], raw.shape[-1] // size * per_block)


def nbytes(fmt: str, n_weights: int) -> int:
    """Bytes `n_weights` weights take in `fmt`: codes, block scales and (NVFP4) the float32 tensor scale."""
    per_block, size, per_tensor = LAYOUT[_check_fmt(fmt)]
    # not labkit.checks: this module imports nothing from labkit (tests/test_quant_mx.py), so a bool is refused here
    if type(n_weights) is bool or not isinstance(n_weights, (int, np.integer)) or n_weights < 0:
        raise ValueError(f"n_weights must be a non-negative integer, got {n_weights!r}")
    if n_weights % per_block:
        raise ValueError(f"{fmt} stores weights in blocks of {per_block}; got n_weights={n_weights}")
    return int(n_weights) // per_block * size + per_tensor


def bits_per_weight(fmt: str, n_weights: int | None = None) -> float:
    """Storage cost of one weight, scales included: MXFP4 4.25, MXFP8 8.25, NVFP4 4.5.

    With `n_weights`, NVFP4's 32-bit tensor scale is shared out too (4.5 + 32 / n_weights).
    """
    if n_weights is None:
        per_block, size, _ = LAYOUT[_check_fmt(fmt)]
        return 8 * size / per_block
    if not n_weights:
        raise ValueError(f"n_weights must be positive to share out the scales, got {n_weights!r}")
    return 8 * nbytes(fmt, n_weights) / n_weights


@dataclass
class MXTensor:
    """A matrix in a microscaling format: `data` uint8 [rows, row_bytes] in the GGML-style layout above."""

    fmt: str
    data: np.ndarray
    shape: tuple[int, ...]
    tensor_scale: float = 1.0  # NVFP4's float32 second-level scale; 1.0 for MXFP4 / MXFP8

    def dequantize(self):
        """The float32 torch tensor of `shape` that the bytes stand for."""
        import torch

        values = dequantize_blocks(self.data, self.fmt, self.tensor_scale)
        return torch.from_numpy(np.ascontiguousarray(values.reshape(self.shape)))

    def nbytes(self) -> int:
        """Bytes the format stores: codes, block scales, and NVFP4's 4-byte tensor scale."""
        return nbytes(self.fmt, int(np.prod(self.shape)))


def quantize(x, fmt: str) -> MXTensor:
    """Quantize a float torch tensor or numpy array [rows, cols] (cols a multiple of the block) to `fmt`."""
    fmt = _check_fmt(fmt)
    if hasattr(x, "detach"):  # a torch tensor
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
        x = x.detach().cpu().float().numpy()
    elif not isinstance(x, np.ndarray) or not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"x must be a floating-point torch tensor or numpy array, got "
                        f"{type(x).__name__} {getattr(x, 'dtype', '')}".rstrip())
    if x.ndim == 0:
        raise ValueError(f"x must have at least one dimension (rows, cols); got shape {x.shape}")
    data, s_t = quantize_blocks(x, fmt)
    return MXTensor(fmt, data.reshape(-1, data.shape[-1]), tuple(x.shape), s_t)


def dequantize(t: MXTensor):
    """`t.dequantize()`: float32 torch tensor of `t.shape`."""
    return t.dequantize()
