"""llama.cpp's K-quant encoder: a weighted search for each sub-block's scale (and min), written from the algorithm.

`labkit.quant.kquants` stores the blocks; this module chooses what goes in them the way llama.cpp's reference
quantizer does (ggml-quants.c, `quantize_row_q4_K_ref`, `_q5_K_ref`, `_q6_K_ref`; no importance matrix):

* **Q4_K, Q5_K** (`make_qkx2_quants`): each sub-block of 32 weights x gets weights w = rms(x) + |x| (big
  weights count more) and a fit x ≈ scale·l + min, l in 0..nmax, min ≤ 0. The start is min–max; then for
  `nstep + 1` stretched grids (nmax + rmin + rdelta·s steps over the range, s = 0..nstep: Q4_K −1 + 0.1·s
  with 21 grids, Q5_K −0.5 + 0.1·s with 16) it rounds x onto the grid and solves the weighted least squares
  for (scale, min) given those codes (min clamped to 0 from above), keeping the pair with the smallest weighted
  squared error; the next grid starts from the min kept so far.
* **Q6_K** (`make_qx_quants`, rmse_type 1): each sub-block of 16 gets a signed scale from 19 grids
  −(32 + 0.1·s)/x_max, s = −9..9, weights w = x², codes in −32..31, the scale by least squares
  (Σw·x·l / Σw·l²) and kept where it explains more of x (a larger (Σw·x·l)² / Σw·l²).

The super-block then stores the sub-block scales as 6-bit (Q4_K, Q5_K) or 8-bit (Q6_K) integers of one float16
step (the largest over 63, or −128 over the signed largest), and the codes are rounded again against the scales
as stored. Rounding is `nearest_int`'s: ties to even (a float magic-number trick), `np.rint` here. Sums run in
float32 as llama.cpp's do, but in numpy's order (pairwise), so a near-tie between two grids may be decided the
other way: the encoder is llama.cpp's algorithm, not its bits (the tests re-round the Gemma file's own tensors).
"""
from __future__ import annotations

import numpy as np

__all__ = ["qkx2_scales", "qx_scales", "PARAMS"]

# K-quant -> (nmax, rmin, rdelta, nstep) of `make_qkx2_quants`, as llama.cpp's reference quantizers call it
PARAMS = {"Q4_K": (15, -1.0, 0.1, 20), "Q5_K": (31, -0.5, 0.1, 15)}
GROUP_MAX_EPS = np.float32(1e-15)  # llama.cpp: a sub-block whose largest magnitude is below this is all zero


def _rint(v: np.ndarray) -> np.ndarray:
    return np.rint(v).astype(np.float32)


def qkx2_scales(x: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Sub-blocks float32 [m, 32] -> (scale, min) float32 [m] each, min ≥ 0 stored as x ≈ scale·l − min."""
    nmax, rmin, rdelta, nstep = PARAMS[qtype]
    x = x.astype(np.float32)
    w = np.sqrt((x * x).sum(axis=1, keepdims=True) / np.float32(x.shape[1])) + np.abs(x)
    lo, hi = np.minimum(x.min(axis=1), 0), x.max(axis=1)
    flat = hi == lo
    sum_w, sum_x = w.sum(axis=1), (w * x).sum(axis=1)
    cur_min = lo.copy()
    span = np.where(flat, np.float32(1), hi - lo)
    iscale = np.float32(nmax) / span
    scale = np.float32(1) / iscale
    codes = np.clip(_rint(iscale[:, None] * (x - lo[:, None])), 0, nmax)
    best = (w * (scale[:, None] * codes + lo[:, None] - x) ** 2).sum(axis=1)
    for s in range(nstep + 1):
        span = np.where(flat, np.float32(1), hi - cur_min)
        isc = np.float32(rmin + rdelta * s + nmax) / span
        codes = np.clip(_rint(isc[:, None] * (x - cur_min[:, None])), 0, nmax)
        sum_l, sum_l2, sum_xl = (w * codes).sum(axis=1), (w * codes * codes).sum(axis=1), (w * codes * x).sum(axis=1)
        det = sum_w * sum_l2 - sum_l * sum_l
        with np.errstate(divide="ignore", invalid="ignore"):
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            positive = this_min > 0
            this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
        this_min = np.where(positive, np.float32(0), this_min)
        err = (w * (this_scale[:, None] * codes + this_min[:, None] - x) ** 2).sum(axis=1)
        better = (det > 0) & (err < best) & ~flat
        best = np.where(better, err, best)
        scale = np.where(better, this_scale, scale)
        cur_min = np.where(better, this_min, cur_min)
    return np.where(flat, np.float32(0), scale).astype(np.float32), (-cur_min).astype(np.float32)


def qx_scales(x: np.ndarray, nmax: int = 32) -> np.ndarray:
    """Sub-blocks float32 [m, 16] -> signed scale float32 [m]: x ≈ scale·l, l in −nmax..nmax−1 (Q6_K)."""
    x = x.astype(np.float32)
    idx = np.abs(x).argmax(axis=1)[:, None]
    top = np.take_along_axis(x, idx, axis=1)[:, 0]  # the signed extreme
    tiny = np.abs(top) < GROUP_MAX_EPS
    top = np.where(tiny, np.float32(1), top)
    w = x * x

    def fit(iscale):
        codes = np.clip(_rint(iscale[:, None] * x), -nmax, nmax - 1)
        return (w * x * codes).sum(axis=1), (w * codes * codes).sum(axis=1)

    sum_lx, sum_l2 = fit(np.float32(-nmax) / top)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(sum_l2 > 0, sum_lx / sum_l2, np.float32(0))
    best = scale * sum_lx
    for s in (*range(-9, 0), *range(1, 10)):
        sum_lx, sum_l2 = fit(-np.float32(nmax + 0.1 * s) / top)
        better = (sum_l2 > 0) & (sum_lx * sum_lx > best * sum_l2)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(better, sum_lx / sum_l2, scale)
        best = np.where(better, scale * sum_lx, best)
    return np.where(tiny, np.float32(0), scale).astype(np.float32)
