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

Two encoders choose the scales (`quantize(..., method=)`). **"search"**, the default, is llama.cpp's reference
quantizer written from its algorithm (`labkit.quant.kquant_search`: a weighted search over stretched grids,
`make_qkx2_quants` for Q4_K / Q5_K, `make_qx_quants` for Q6_K): re-rounding a downloaded file's own K-quant
tensors gives back nearly its floats (`tests/test_kquants.py`). **"minmax"** is the plain rule: a sub-block's
range [min(0, lo), hi] in 2^bits − 1 steps (Q4_K, Q5_K), or its signed largest magnitude as code −32 (Q6_K).
Either way the sub-block scales are then quantized and the codes recomputed with the scales as stored. `gguf-py`
has no K-quant quantizer to compare with; the tests check that `gguf` decodes labkit's blocks to the floats
labkit decodes, that the error stays within the bound the steps give, and that the search's error is no larger.
"""
from __future__ import annotations

import numpy as np

QK = 256  # weights per super-block
LAYOUT = {"Q4_K": (QK, 144), "Q5_K": (QK, 176), "Q6_K": (QK, 210)}  # name: (weights, bytes) per super-block

__all__ = ["QK", "LAYOUT", "METHODS", "quantize", "dequantize", "block_parts"]


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


METHODS = ("search", "minmax")  # llama.cpp's weighted search (`labkit.quant.kquant_search`), or min–max


def _q6_params(sub: np.ndarray, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Q6_K sub-blocks [n, 16, 16] -> (int8 scales [n, 16], float16 d [n, 1])."""
    from labkit.quant import kquant_search  # on first use: a model that only reads K-quants never loads the encoder

    n = sub.shape[0]
    if method == "search":
        scale = kquant_search.qx_scales(sub.reshape(n * 16, 16)).reshape(n, 16)
    else:  # the signed extreme -> code −32
        imax = np.abs(sub).argmax(axis=2)[..., None]
        scale = np.take_along_axis(sub, imax, axis=2)[..., 0] / np.float32(-32)
    big = np.abs(scale).argmax(axis=1)[:, None]
    top = np.take_along_axis(scale, big, axis=1)  # [n, 1], the signed largest
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(np.abs(top) < kquant_search.GROUP_MAX_EPS, np.float32(0), np.float32(-128) / top)
    sc = np.clip(_round(scale * inv, method), -128, 127).astype(np.int8)
    d = np.where(inv == 0, np.float32(0), np.float32(1) / np.where(inv == 0, 1, inv)).astype(np.float16)
    return sc, d


def _k_params(sub: np.ndarray, qtype: str, method: str) -> tuple[np.ndarray, ...]:
    """Q4_K / Q5_K sub-blocks [n, 8, 32] -> (d, dmin float16 [n, 1], 6-bit scales, mins uint8 [n, 8])."""
    from labkit.quant import kquant_search

    n, nmax = sub.shape[0], 15 if qtype == "Q4_K" else 31
    if method == "search":
        scale, low = (v.reshape(n, 8) for v in kquant_search.qkx2_scales(sub.reshape(n * 8, 32), qtype))
    else:  # the range [min(0, lo), hi] in nmax steps; the min is stored as a non-negative offset
        low = -np.minimum(sub.min(axis=2), 0)
        scale = (sub.max(axis=2) + low) / np.float32(nmax)
    top_s, top_m = scale.max(axis=1, keepdims=True), low.max(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.where(top_s > 0, _round(scale * (np.float32(63) / top_s), method), 0), 0, 63).astype(np.uint8)
        mn = np.clip(np.where(top_m > 0, _round(low * (np.float32(63) / top_m), method), 0), 0, 63).astype(np.uint8)
    return (top_s / np.float32(63)).astype(np.float16), (top_m / np.float32(63)).astype(np.float16), sc, mn


def _round(v: np.ndarray, method: str) -> np.ndarray:
    """llama.cpp's `nearest_int` (ties to even) for the search; half away from zero for min–max, as before."""
    return np.rint(v).astype(np.int32) if method == "search" else _nearest(v)


def quantize_blocks(x: np.ndarray, qtype: str, method: str = "search") -> np.ndarray:
    """float32 [n, 256] -> super-blocks uint8 [n, bytes]: scales by `method` (`METHODS`: llama.cpp's weighted
    search, `labkit.quant.kquant_search`, or the min–max rule of the module docstring), then the codes rounded
    against the scales as stored."""
    n = x.shape[0]
    if qtype == "Q6_K":
        sub = x.reshape(n, 16, 16)
        sc, d = _q6_params(sub, method)
        step = d.astype(np.float32) * sc.astype(np.float32)  # what the decoder multiplies by, [n, 16]
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(step[..., None] == 0, 0, _round(sub / step[..., None], method))
        q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(n, 2, 4, 32)  # half, quarter, position
        low = q & 0x0F
        ql = (low[:, :, :2] | (low[:, :, 2:] << 4)).reshape(n, 128)
        qh = ((q >> 4) << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)).sum(axis=2, dtype=np.uint8)
        return np.concatenate([ql, qh.reshape(n, 64), sc.view(np.uint8), d.view(np.uint8)], axis=1)
    nmax = 15 if qtype == "Q4_K" else 31
    sub = x.reshape(n, 8, 32)
    d, dmin, sc, mn = _k_params(sub, qtype, method)
    step = (d.astype(np.float32) * sc.astype(np.float32))[..., None]
    offset = (dmin.astype(np.float32) * mn.astype(np.float32))[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step == 0, 0, _round((sub + offset) / step, method))
    q = np.clip(q, 0, nmax).astype(np.uint8)
    head = [d.view(np.uint8), dmin.view(np.uint8), _pack_scales_mins(sc, mn)]
    if qtype == "Q5_K":
        bits = ((q >> 4) & 1) << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
        head.append(bits.sum(axis=1, dtype=np.uint8))
    return np.concatenate(head + [_pack_low_nibbles(q)], axis=1)


def quantize(x: np.ndarray, qtype: str, method: str = "search") -> np.ndarray:
    """Float rows (last dim a multiple of 256) -> uint8 [..., row_bytes] in `qtype` (Q4_K, Q5_K or Q6_K), the
    scales chosen by `method`: "search" (llama.cpp's, the default) or "minmax"."""
    if qtype not in LAYOUT:
        raise ValueError(f"qtype must be one of {tuple(LAYOUT)}, got {qtype!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % QK:
        raise ValueError(f"{qtype} needs rows whose length is a multiple of {QK}; got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{qtype}: x contains NaN or inf; the block formats encode finite weights only")
    out = quantize_blocks(x.reshape(-1, QK), qtype, method)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK * LAYOUT[qtype][1])


def block_parts(data: np.ndarray, qtype: str, shape: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """A Q4_K matrix's blocks as an integer kernel takes them: (codes uint8 [rows, cols] in 0..15, step and minimum
    float32 [rows, cols / 32]) with x = step·q + minimum, step = d·sc and minimum = −dmin·m per sub-block of 32 (each
    exact in float32: a float16 times a 6-bit integer), the same floats `dequantize` gives."""
    if qtype != "Q4_K":
        raise ValueError(f"block_parts reads Q4_K blocks, got {qtype!r}")
    rows, cols = shape
    raw = np.asarray(data).view(np.uint8).reshape(-1, LAYOUT[qtype][1])
    if cols % QK or raw.shape[0] != rows * cols // QK:
        raise ValueError(f"Q4_K data holds {raw.shape[0]} super-blocks; a [{rows}, {cols}] matrix needs {rows * cols // QK}")
    d, dmin = _f16(raw[:, 0:2]), _f16(raw[:, 2:4])
    sc, mn = _scales_mins(raw[:, 4:16])
    step = (d * sc.astype(np.float32)).reshape(rows, cols // 32)
    minimum = -(dmin * mn.astype(np.float32)).reshape(rows, cols // 32)
    return _low_nibbles(raw[:, 16:144]).reshape(rows, cols), step, minimum


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
