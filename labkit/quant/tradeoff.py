"""One layer, one choice of (bits, group size, method): what it costs in error, memory and decode speed.

The numbers behind chapter 06's explorer. For a weight W [out, in] and calibration inputs
X [n, in] of that layer:

- weight error: ‖Ŵ − W‖² / ‖W‖² (what RTN minimises, element by element);
- output error: ‖X Ŵᵀ − X Wᵀ‖² / ‖X Wᵀ‖² (what GPTQ and AWQ minimise; what the next layer sees);
- bits per weight with the group's fp16 scale (and minimum), and from it the memory of a
  model of `n_weights` weights and the decode speed a bandwidth of `bandwidth_gb_s` allows
  (every weight read once per token).

    >>> layer_tradeoff(w, x, bits=4, group_size=32, method="gptq")          # doctest: +SKIP
"""
from __future__ import annotations

import torch

from labkit.quant.awq import awq_search
from labkit.quant.gptq import gptq_quantize, hessian
from labkit.quant.rtn import bits_per_weight, dequantize, quantize

__all__ = ["layer_tradeoff", "TRADEOFF_METHODS"]

TRADEOFF_METHODS = ("rtn", "gptq", "awq")


def _layout(bits: int, group_size, n_in: int):
    symmetric = bits == 8
    return symmetric, n_in if group_size == "channel" else group_size


def layer_tradeoff(w: torch.Tensor, x: torch.Tensor, bits: int, group_size, method: str = "rtn",
                   n_weights: float | None = None, bandwidth_gb_s: float | None = None) -> dict:
    """Errors, bits per weight and (with `n_weights`, `bandwidth_gb_s`) memory and predicted tokens/s.

    8 bits are symmetric, fewer asymmetric (the layouts `quantize_model` uses); `group_size` is
    an int dividing the input features or "channel".
    """
    if method not in TRADEOFF_METHODS:
        raise ValueError(f"method must be one of {TRADEOFF_METHODS}, got {method!r}")
    w = w.detach().float()
    x = x.reshape(-1, x.shape[-1]).float()
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"x must hold inputs [..., {w.shape[1]}] of this layer, got {tuple(x.shape)}")
    symmetric, per = _layout(bits, group_size, w.shape[1])
    if method == "rtn":
        w_hat = dequantize(quantize(w, bits, group_size, symmetric))
    elif method == "gptq":
        w_hat = dequantize(gptq_quantize(w, hessian(x), bits, group_size, symmetric))
    else:
        s, _, _ = awq_search(w, x, bits, group_size, symmetric)
        w_hat = dequantize(quantize(w * s[None, :], bits, group_size, symmetric)) / s[None, :]
    ref = x @ w.t()
    row = {"method": method, "bits": bits, "group_size": group_size,
           "weight_error": float((w_hat - w).pow(2).sum() / w.pow(2).sum()),
           "output_error": float((x @ w_hat.t() - ref).pow(2).sum() / ref.pow(2).sum()),
           "bits_per_weight": bits_per_weight(bits, per, symmetric)}
    if n_weights is not None:
        row["memory_bytes"] = n_weights * row["bits_per_weight"] / 8
        if bandwidth_gb_s is not None:
            row["predicted_tokens_per_s"] = bandwidth_gb_s * 1e9 / row["memory_bytes"]
    return row
