"""K-quants, the GGUF formats of the files people download (Q4_K_M is most people's default): Q4_K, Q5_K, Q6_K.

A K-quant cuts a row into **super-blocks of 256 weights** and gives each its float16 scale(s); inside,
small sub-blocks carry their own scale as a few-bit integer *of the super-block's scale*, so a sub-block
scale costs 6 or 8 bits instead of 16 (llama.cpp PR #1684, Kawrakow 2023):

    type  bytes/256  super-block                     sub-blocks                         x           bits/weight
    Q4_K  144        fp16 d, fp16 dmin               8 × 32: 6-bit scale, 6-bit min      d·sc·q − dmin·m   4.5
    Q5_K  176        fp16 d, fp16 dmin               8 × 32: 6-bit scale, 6-bit min      d·sc·q − dmin·m   5.5
    Q6_K  210        fp16 d                          16 × 16: int8 scale                 d·sc·(q − 32)     6.5625

Codes: Q4_K 4 bits (0..15), Q5_K 5 bits (0..31: the fifth bit in 32 bytes of high bits), Q6_K 6 bits
(4 low bits + 2 high bits). The layouts, byte for byte, are what `gguf-py` (`gguf.quants`) decodes and
the tests compare against on random blocks and on every tensor of a real file:

- Q4_K / Q5_K, 12 bytes of scales and mins: bytes 0–3 hold scales 0–3 (low 6 bits) and the top 2 bits
  of scales 4–7; bytes 4–7 the same for the mins; bytes 8–11 the low 4 bits of scale j+4 (low nibble)
  and of min j+4 (high nibble). Codes: byte 32c + l holds weight 64c + l (low nibble) and 64c + 32 + l
  (high nibble); Q5_K's high bit of weight 32i + l is bit i of byte l of its 32 high-bit bytes.
- Q6_K: 128 bytes of low nibbles (byte 64h + p: weight 128h + p low, 128h + 64 + p high, p < 64), 64 bytes
  of high 2-bit pairs (bits 2t of byte 32h + l: weight 128h + 32t + l), 16 int8 scales, fp16 d last.

The quantizer here is **not llama.cpp's**: `gguf-py` has no K-quant quantizer to compare with, and
llama.cpp's reference (`quantize_row_q4_K_ref`: `make_qkx2_quants`, a weighted search over candidate
scales) is not reproduced. It is the plain min–max rule, with the sub-block scales quantized and the codes
then recomputed with the scales as stored: a sub-block's range [min(0, lo), hi] in 2^bits − 1 steps (Q4_K,
Q5_K), or its largest magnitude over 32 steps (Q6_K). The tests check that `gguf` decodes its blocks to
the floats labkit decodes and that the error stays within the bound its steps give.
"""
from __future__ import annotations

import numpy as np

QK = 256  # weights per super-block
LAYOUT = {"Q4_K": (QK, 144), "Q5_K": (QK, 176), "Q6_K": (QK, 210)}  # name: (weights, bytes) per super-block

__all__ = ["QK", "LAYOUT", "quantize", "dequantize"]


def _f16(raw: np.ndarray) -> np.ndarray:
    """fp16 bytes [n, 2] -> float32 [n, 1]."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _scales_mins(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 packed bytes of Q4_K / Q5_K -> (scales, mins), each uint8 [n, 8] in 0..63."""
    b = raw.reshape(-1, 3, 4)
    lo, mid, hi = b[:, 0], b[:, 1], b[:, 2]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], axis=1)
    mn = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], axis=1)
    return sc, mn


def _pack_scales_mins(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """(scales, mins) uint8 [n, 8] in 0..63 -> the 12 packed bytes [n, 12]."""
    lo = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    mid = (mn[:, :4] & 0x3F) | ((mn[:, 4:] >> 4) << 6)
    hi = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return np.concatenate([lo, mid, hi], axis=1).astype(np.uint8)


def _low_nibbles(qs: np.ndarray) -> np.ndarray:
    """128 code bytes [n, 128] -> the low 4 bits of the 256 weights [n, 8, 32] (sub-block, position)."""
    q = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(-1, 8, 32)


def _pack_low_nibbles(q: np.ndarray) -> np.ndarray:
    q = q.reshape(-1, 4, 2, 32) & 0x0F
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128).astype(np.uint8)


def dequantize_blocks(blocks: np.ndarray, qtype: str) -> np.ndarray:
    """Super-blocks uint8 [n, bytes] -> float32 [n, 256], in the order of operations `gguf` uses (byte-exact)."""
    n = blocks.shape[0]
    if qtype == "Q6_K":
        ql, qh, scales, d = np.split(blocks, [128, 192, 208], axis=1)
        d = _f16(d) * np.ascontiguousarray(scales).view(np.int8).astype(np.float32)  # [n, 16]
        low = (ql.reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F
        high = (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
        q = (low.reshape(n, 8, 32) | (high.reshape(n, 8, 32) << 4)).astype(np.int8) - np.int8(32)
        return (d.reshape(n, 16, 1) * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK)
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, mn = _scales_mins(blocks[:, 4:16])
    scale = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    offset = (dmin * mn.astype(np.float32)).reshape(n, 8, 1)
    if qtype == "Q4_K":
        q = _low_nibbles(blocks[:, 16:144])
    else:  # Q5_K: 32 bytes of fifth bits, then the low nibbles
        bits = (blocks[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
        q = _low_nibbles(blocks[:, 48:176]) | (bits << 4)
    return (scale * q.astype(np.float32) - offset).reshape(n, QK)


def _nearest(x: np.ndarray) -> np.ndarray:
    """C's `nearest_int` (round half away from zero) as integers."""
    return (np.sign(x) * np.floor(np.abs(x) + 0.5)).astype(np.int32)


def quantize_blocks(x: np.ndarray, qtype: str) -> np.ndarray:
    """float32 [n, 256] -> super-blocks uint8 [n, bytes] by the min–max rule of the module docstring."""
    n = x.shape[0]
    if qtype == "Q6_K":
        sub = x.reshape(n, 16, 16)
        imax = np.abs(sub).argmax(axis=2)[..., None]
        scale = np.take_along_axis(sub, imax, axis=2)[..., 0] / np.float32(-32)  # the signed extreme -> code -32
        big = np.abs(scale).argmax(axis=1)[:, None]
        top = np.take_along_axis(scale, big, axis=1)  # [n, 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(top == 0, np.float32(0), np.float32(-128) / top)
        sc = np.clip(_nearest(scale * inv), -128, 127).astype(np.int8)
        d = np.where(top == 0, np.float32(0), np.float32(1) / np.where(inv == 0, 1, inv)).astype(np.float16)
        step = d.astype(np.float32) * sc.astype(np.float32)  # what the decoder multiplies by, [n, 16]
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(step[..., None] == 0, 0, _nearest(sub / step[..., None]))
        q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(n, 2, 4, 32)  # half, quarter, position
        low = q & 0x0F
        ql = (low[:, :, :2] | (low[:, :, 2:] << 4)).reshape(n, 128)
        qh = ((q >> 4) << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)).sum(axis=2, dtype=np.uint8)
        return np.concatenate([ql, qh.reshape(n, 64), sc.view(np.uint8), d.view(np.uint8)], axis=1)
    nmax = 15 if qtype == "Q4_K" else 31
    sub = x.reshape(n, 8, 32)
    lo = np.minimum(sub.min(axis=2), 0)  # the min is stored as a non-negative offset: x = d·sc·q − dmin·m
    scale = (sub.max(axis=2) - lo) / np.float32(nmax)
    d = (scale.max(axis=1, keepdims=True) / np.float32(63)).astype(np.float16)
    dmin = ((-lo).max(axis=1, keepdims=True) / np.float32(63)).astype(np.float16)
    df, mf = d.astype(np.float32), dmin.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.where(df == 0, 0, _nearest(scale / df)), 0, 63).astype(np.uint8)
        mn = np.clip(np.where(mf == 0, 0, _nearest(-lo / mf)), 0, 63).astype(np.uint8)
        step = (df * sc.astype(np.float32))[..., None]
        offset = (mf * mn.astype(np.float32))[..., None]
        q = np.where(step == 0, 0, _nearest((sub + offset) / step))
    q = np.clip(q, 0, nmax).astype(np.uint8)
    head = [d.view(np.uint8), dmin.view(np.uint8), _pack_scales_mins(sc, mn)]
    if qtype == "Q5_K":
        bits = ((q >> 4) & 1) << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
        head.append(bits.sum(axis=1, dtype=np.uint8))
    return np.concatenate(head + [_pack_low_nibbles(q)], axis=1)


def quantize(x: np.ndarray, qtype: str) -> np.ndarray:
    """Float rows (last dim a multiple of 256) -> uint8 [..., row_bytes] in `qtype` (Q4_K, Q5_K or Q6_K)."""
    if qtype not in LAYOUT:
        raise ValueError(f"qtype must be one of {tuple(LAYOUT)}, got {qtype!r}")
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % QK:
        raise ValueError(f"{qtype} needs rows whose length is a multiple of {QK}; got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{qtype}: x contains NaN or inf; the block formats encode finite weights only")
    out = quantize_blocks(x.reshape(-1, QK), qtype)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK * LAYOUT[qtype][1])


def dequantize(data: np.ndarray, qtype: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """uint8 super-blocks of `qtype` -> float32 weights of `shape` (default: the rows of the bytes)."""
    if qtype not in LAYOUT:
        raise ValueError(f"qtype must be one of {tuple(LAYOUT)}, got {qtype!r}")
    raw = np.asarray(data).view(np.uint8)
    size = LAYOUT[qtype][1]
    if raw.size % size:
        raise ValueError(f"{qtype} super-blocks are {size} bytes; got {raw.size} bytes, not a whole number of them")
    out = dequantize_blocks(raw.reshape(-1, size), qtype)
    if shape is None:
        shape = (*raw.shape[:-1], raw.shape[-1] // size * QK) if raw.ndim > 1 else (out.size,)
    return out.reshape(shape)
