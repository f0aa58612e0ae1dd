"""The GGML block formats that GGUF files store weights in: Q8_0, Q4_0, Q4_1, Q5_0, the K-quants, MXFP4, NVFP4.

Follows the reference (`*_ref`) quantizers of llama.cpp `ggml/src/ggml-quants.c` and
the numpy port in `gguf-py/gguf/quants.py`; the tests check that labkit's bytes and
floats are identical to the `gguf` package's, on random data and on the real file.

Every format cuts a row into blocks of 32 consecutive weights and stores, per block,
one or two float16 numbers plus 32 small integers:

    type  bytes/block  layout                        dequantize          bits/weight
    Q8_0  34           fp16 d, int8 q[32]            x = q·d             8.5
    Q4_0  18           fp16 d, 16 bytes of nibbles   x = (q − 8)·d       4.5
    Q4_1  20           fp16 d, fp16 m, 16 bytes      x = q·d + m         5.0
    Q5_0  22           fp16 d, 4 bytes of 5th bits,  x = (q − 16)·d      5.5
                       16 bytes of nibbles
    MXFP4 17           E8M0 2^e, 16 bytes            x = E2M1(q)·2^e     4.25
    NVFP4 36 per 64    4 UE4M3 d, 32 bytes           x = E2M1(q)·d       4.5

MXFP4 and NVFP4 (microscaling, OCP / NVIDIA) are implemented in `labkit.quant.mx`, and the K-quants
(Q4_K, Q5_K, Q6_K: super-blocks of 256) in `labkit.quant.kquants`; this module hands them over. The GGML NVFP4 layout has no per-tensor scale, so here it is 1.0 and the UE4M3
block scales carry the whole scale (|x| above 6·448 = 2688 saturates); `mx.quantize` keeps one.

Nibble order (Q4_0, Q4_1, Q5_0): byte j holds weight j in its low 4 bits and weight j+16
in its high 4 bits, not two neighbours. Q5_0's fifth bit of weight j is bit j of its little-endian
32-bit word.

    >>> q = quantize(np.arange(32, dtype=np.float32), "Q8_0")
    >>> q.shape, q.dtype                       # one block of 34 bytes
    ((34,), dtype('uint8'))
    >>> dequantize(q, "Q8_0", (32,))[[1, 31]].tolist()    # d = fp16(31/127): close, not exact
    [0.9765625, 31.005859375]
"""
from __future__ import annotations

import numpy as np

from labkit import checks
from labkit.quant import kquants, mx

BLOCK = 32  # weights per block, for every format here

TYPES: dict[str, tuple[int, int, int]] = {
    # name: (ggml type id, weights per block, bytes per block)
    "F32": (0, 1, 4),
    "F16": (1, 1, 2),
    "Q4_0": (2, BLOCK, 18),
    "Q4_1": (3, BLOCK, 20),
    "Q5_0": (6, BLOCK, 22),
    "Q8_0": (8, BLOCK, 34),
    "Q4_K": (12, *kquants.LAYOUT["Q4_K"]),  # super-blocks of 256 weights
    "Q5_K": (13, *kquants.LAYOUT["Q5_K"]),
    "Q6_K": (14, *kquants.LAYOUT["Q6_K"]),
    "MXFP4": (39, *mx.LAYOUT["MXFP4"][:2]),  # the sizes are mx's: one table of block layouts
    "NVFP4": (40, *mx.LAYOUT["NVFP4"][:2]),  # super-blocks of 64 = 4 blocks of 16, each with its own scale
}
SUPPORTED = tuple(TYPES)


def _check_type(qtype: str) -> str:
    qtype = getattr(qtype, "name", qtype)  # accept gguf.GGMLQuantizationType too
    if qtype not in TYPES:
        raise ValueError(f"tensor type {qtype!r} is not supported; supported types: {', '.join(SUPPORTED)}")
    return qtype


def bits_per_weight(qtype: str) -> float:
    """Storage cost of one weight, scales included: `bits_per_weight("Q4_1") -> 5.0`."""
    _, per_block, nbytes = TYPES[_check_type(qtype)]
    return 8 * nbytes / per_block


def nbytes(qtype: str, n_weights: int) -> int:
    """Bytes that `n_weights` weights take in this format (a multiple of 32 for the block types, 64 for NVFP4)."""
    _, per_block, size = TYPES[_check_type(qtype)]
    checks.integer("n_weights", int(n_weights) if isinstance(n_weights, np.integer) else n_weights, 0)
    if n_weights % per_block:
        raise ValueError(f"{qtype} stores weights in blocks of {per_block}; got {n_weights} weights")
    return n_weights // per_block * size


def _round_away(x: np.ndarray) -> np.ndarray:
    """C `roundf`: halves round away from zero (numpy's `round` goes to even).

    Not `floor(|x| + 0.5)`: for the float just below 0.5 that sum rounds up to 1.0.
    """
    a = np.abs(x)
    whole = np.floor(a)
    return np.sign(x) * (whole + np.floor(2 * (a - whole)))


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    q = q.reshape(-1, 2, BLOCK // 2)  # [n_blocks, low/high half, 16]
    return q[:, 0] | (q[:, 1] << np.uint8(4))


def _unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    # [n_blocks, 16] bytes -> [n_blocks, 32] codes: low nibbles are weights 0..15, high ones 16..31
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)


def _fp16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(-1, 2)


def quantize(x: np.ndarray, qtype: str) -> np.ndarray:
    """Quantize float weights (last dim a multiple of 32) to GGML blocks.

    Returns uint8 bytes shaped `[..., row_bytes]`, as `gguf.GGUFReader` presents quantized
    tensors (F32/F16 come back as float arrays). The block formats refuse NaN and inf (F32/F16
    store them as they are).
    """
    qtype = _check_type(qtype)
    x = np.asarray(x, dtype=np.float32)
    if qtype == "F32":
        return x.copy()
    if qtype == "F16":
        return x.astype(np.float16)
    if qtype in mx.LAYOUT:  # MXFP4, NVFP4: no tensor scale in the GGML layout
        return mx.quantize_blocks(x, qtype, tensor_scale=None if qtype == "MXFP4" else 1.0)[0]
    if qtype in kquants.LAYOUT:
        return kquants.quantize(x, qtype)
    if x.ndim == 0 or x.shape[-1] % BLOCK:
        raise ValueError(f"{qtype} needs rows whose length is a multiple of {BLOCK}; got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{qtype}: x contains NaN or inf; the block formats encode finite weights only")
    blocks = x.reshape(-1, BLOCK)  # [n_blocks, 32]
    if qtype == "Q8_0":
        d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
        with np.errstate(divide="ignore"):
            inv_d = np.where(d == 0, np.float32(0), np.float32(1) / d)
        q = _round_away(blocks * inv_d).astype(np.int8).view(np.uint8)
        out = np.concatenate([_fp16_bytes(d), q], axis=1)
    elif qtype in ("Q4_0", "Q5_0"):
        # the signed value of largest magnitude maps exactly to code 0: d = max / -8 (Q5_0: / -16)
        half = 8 if qtype == "Q4_0" else 16
        imax = np.abs(blocks).argmax(axis=1)[:, None]
        d = np.take_along_axis(blocks, imax, axis=1) / np.float32(-half)
        with np.errstate(divide="ignore"):
            inv_d = np.where(d == 0, np.float32(0), np.float32(1) / d)
        q = np.trunc(blocks * inv_d + np.float32(half + 0.5)).astype(np.uint8).clip(0, 2 * half - 1)
        fifth = [] if qtype == "Q4_0" else [np.packbits(q >> 4, axis=1, bitorder="little")]
        out = np.concatenate([_fp16_bytes(d), *fifth, _pack_nibbles(q & np.uint8(0x0F))], axis=1)
    else:  # Q4_1: 16 levels from the block's min to its max
        lo = blocks.min(axis=1, keepdims=True)
        hi = blocks.max(axis=1, keepdims=True)
        d = (hi - lo) / np.float32(15)
        with np.errstate(divide="ignore"):
            inv_d = np.where(d == 0, np.float32(0), np.float32(1) / d)
        q = np.trunc((blocks - lo) * inv_d + np.float32(0.5)).astype(np.uint8).clip(0, 15)
        out = np.concatenate([_fp16_bytes(d), _fp16_bytes(lo), _pack_nibbles(q)], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // BLOCK * TYPES[qtype][2])


def dequantize(data: np.ndarray, qtype: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Turn GGML bytes (or F16/F32 arrays) back into float32 weights of `shape`.

    `shape` defaults to the bytes' leading dims plus the number of weights per row.
    """
    qtype = _check_type(qtype)
    data = np.asarray(data)
    if qtype in ("F32", "F16"):
        out = data.view(np.float32 if qtype == "F32" else np.float16).astype(np.float32)
        return out.reshape(shape) if shape is not None else out
    if qtype in mx.LAYOUT:
        out = mx.dequantize_blocks(data, qtype)
        return out.reshape(shape) if shape is not None else out
    if qtype in kquants.LAYOUT:
        return kquants.dequantize(data, qtype, shape)
    _, _, size = TYPES[qtype]
    raw = data.view(np.uint8)
    if raw.size % size:
        raise ValueError(f"{qtype} blocks are {size} bytes; got {raw.size} bytes, not a whole number of blocks")
    blocks = raw.reshape(-1, size)  # [n_blocks, bytes per block]
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # [n_blocks, 1]
    if qtype == "Q8_0":
        out = blocks[:, 2:].view(np.int8).astype(np.float32) * d
    elif qtype == "Q4_0":
        q = _unpack_nibbles(blocks[:, 2:]).astype(np.int8) - np.int8(8)
        out = d * q.astype(np.float32)
    elif qtype == "Q5_0":
        fifth = np.unpackbits(blocks[:, 2:6], axis=1, bitorder="little")  # [n_blocks, 32]: bit j of the word
        q = (_unpack_nibbles(blocks[:, 6:]) | (fifth << 4)).astype(np.int8) - np.int8(16)
        out = d * q.astype(np.float32)
    else:  # Q4_1
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        out = d * _unpack_nibbles(blocks[:, 4:]).astype(np.float32) + m
    if shape is None:
        shape = (*raw.shape[:-1], raw.shape[-1] // size * BLOCK) if raw.ndim > 1 else (out.size,)
    return out.reshape(shape)


def block_parts(data: np.ndarray, qtype: str, shape: tuple[int, int]):
    """The blocks of a Q4_1 / Q8_0 matrix as they are stored, for integer kernels (no dequantization).

    Returns (codes [rows, cols], d [rows, cols / 32], m [rows, cols / 32] or None), so that
    Q4_1 weights are d·q + m (codes 0..15) and Q8_0 weights are d·q (codes −127..127).
    """
    qtype = _check_type(qtype)
    if qtype not in ("Q4_1", "Q8_0"):
        raise ValueError(f"block_parts reads Q4_1 or Q8_0 blocks, got {qtype}")
    rows, cols = shape
    _, _, size = TYPES[qtype]
    blocks = np.asarray(data).view(np.uint8).reshape(-1, size)
    if blocks.shape[0] != rows * cols // BLOCK or cols % BLOCK:
        raise ValueError(f"{qtype} data holds {blocks.shape[0]} blocks; a [{rows}, {cols}] matrix needs {rows * cols // BLOCK}")
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32).reshape(rows, cols // BLOCK)
    if qtype == "Q8_0":
        return blocks[:, 2:].view(np.int8).reshape(rows, cols), d, None
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32).reshape(rows, cols // BLOCK)
    return _unpack_nibbles(blocks[:, 4:]).reshape(rows, cols), d, m


def agrees_with_gguf(x: np.ndarray, qtype: str) -> bool | None:
    """Whether labkit's bytes for x in `qtype` equal the `gguf` package's, and so do the floats they decode to.

    The gguf package (llama.cpp's numpy port) quantizes every type here but NVFP4 and the K-quants, for
    which only the decoding is compared (on labkit's bytes). None when gguf is not installed.
    """
    try:
        from gguf import GGMLQuantizationType, quants
    except ImportError:
        return None
    qtype = _check_type(qtype)
    x = np.asarray(x, dtype=np.float32)
    mine = quantize(x, qtype)
    kind = GGMLQuantizationType[qtype]
    decode_only = qtype == "NVFP4" or qtype in kquants.LAYOUT  # gguf has no quantizer for these
    same_bytes = decode_only or np.array_equal(mine, quants.quantize(x, kind))
    theirs = quants.dequantize(mine, kind).reshape(x.shape)
    return bool(same_bytes and np.array_equal(dequantize(mine, qtype, x.shape), theirs))
