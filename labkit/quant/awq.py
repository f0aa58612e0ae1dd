"""AWQ: scale up the input channels that carry large activations before rounding, and fold the scale away.

Lin, Tang, Tang, Yang, Dang, Gan, Han 2023, "AWQ: Activation-aware Weight Quantization for
LLM Compression and Acceleration" (§3.2). For a linear layer y = x Wᵀ, multiply column j of W
by s_j and divide input channel j by s_j: the float product is unchanged, but the rounding
error of the salient columns (large |x_j|) shrinks relative to their weights. The scales
are s = s_x^α with s_x the mean |x_j| over calibration tokens, normalised so that
√(max s · min s) = 1; α is searched over a grid in [0, 1] for the smallest output error

    err(α) = mean ‖(x / s) Q(W·diag s)ᵀ − x Wᵀ‖²,

and α = 0 (s = 1, plain RTN) is in the grid, so AWQ is never worse than RTN on the
calibration data. The division by s is folded into the operator that produces x (an
RMSNorm's gain, or the rows of the matrix before), so the float model computes exactly
what it did before; only then are the weights rounded.

    >>> scales, alpha, errors = awq_search(w, x, bits=4, group_size=32)   # doctest: +SKIP
"""
from __future__ import annotations

import torch

from labkit.quant.rtn import check_weight, dequantize, quantize

__all__ = ["awq_search", "output_error", "GRID"]

GRID = tuple(i / 20 for i in range(21))  # α = 0, 0.05, ..., 1
MAX_TOKENS = 1024  # calibration rows the error of each α is measured on


def output_error(w: torch.Tensor, x: torch.Tensor, scales: torch.Tensor, bits: int, group_size, symmetric: bool,
                 ref: torch.Tensor | None = None) -> float:
    """Mean squared output error of RTN on W·diag(s) with inputs x / s, against the float layer (`ref` = x Wᵀ)."""
    ref = x @ w.t() if ref is None else ref
    w_hat = dequantize(quantize(w * scales[None, :], bits, group_size, symmetric))
    return float(((x / scales[None, :]) @ w_hat.t() - ref).pow(2).mean())


def awq_search(w: torch.Tensor, x: torch.Tensor, bits: int = 4, group_size: int | str = 32, symmetric: bool = False,
               grid=GRID, max_tokens: int = MAX_TOKENS) -> tuple[torch.Tensor, float, dict[float, float]]:
    """(scales [in], best α, {α: error}) for weight w [out, in] and calibration inputs x [..., in].

    The mean |x_j| comes from all of x; the error of each α is measured on at most `max_tokens`
    rows of x, evenly spaced (an LM head's output over every calibration token would be
    tokens × vocabulary floats per α).
    """
    w = check_weight(w, bits)
    x = x.reshape(-1, x.shape[-1]).float() if isinstance(x, torch.Tensor) else x
    if not isinstance(x, torch.Tensor) or x.shape[-1] != w.shape[1] or x.shape[0] == 0:
        raise ValueError(f"x must hold calibration inputs [..., {w.shape[1]}] for this layer, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    grid = sorted(set(float(a) for a in grid) | {0.0})
    if any(not 0 <= a <= 1 for a in grid):
        raise ValueError(f"grid values of alpha must lie in [0, 1], got {grid}")
    s_x = x.abs().mean(0).clamp(min=1e-8)
    if x.shape[0] > max_tokens:
        x = x[torch.linspace(0, x.shape[0] - 1, max_tokens).long()]
    ref = x @ w.t()
    errors, best = {}, None
    for a in grid:
        s = s_x.pow(a)
        s = s / (s.max() * s.min()).sqrt()
        errors[a] = output_error(w, x, s, bits, group_size, symmetric, ref)
        if best is None or errors[a] < errors[best[0]]:
            best = (a, s)
    return best[1], best[0], errors
