"""GPTQ: quantize a weight matrix one column at a time, pushing each column's error onto the columns not yet done.

Frantar, Ashkboos, Hoefler, Alistarh 2022, "GPTQ: Accurate Post-Training Quantization for
Generative Pre-trained Transformers" (Algorithm 1). A linear layer's output error on
calibration inputs X [n, in] is ‖(Ŵ − W) Xᵀ‖², a quadratic form in each row with the Hessian
H = 2/n · XᵀX. Quantizing column i to q leaves an error (w_i − q) that the remaining columns
can absorb: the optimal update (Optimal Brain Surgeon) is

    δ = −(w_i − q) / [H⁻¹]_ii · [H⁻¹]_{i, i+1:}

which, with the upper Cholesky factor U of H⁻¹, is one row of U. The steps, as in the paper:

1. H += λ·mean(diag H)·I (dampening, λ = `damp`); a dead input (H_ii = 0) gets H_ii = 1, w = 0;
2. optionally visit columns in order of decreasing H_ii (`act_order`: the ones that matter most
   first, while many columns are left to absorb their error);
3. U = chol(H⁻¹)ᵀ (upper); for each column: quantize, scale the error by 1/U_ii, update the
   rest of the block now and the columns after the block once per block (lazy batch updates,
   the same arithmetic in fewer, larger products).

Group parameters (scale, minimum) come from a group's weights as they are when its first
column is reached, which already include the errors pushed onto them; with `act_order`
they are fixed from the original weights ("static groups") so the groups stay contiguous
in the original order, as the packed kernels need.

    >>> H = hessian(x)                                      # doctest: +SKIP
    >>> qt = gptq_quantize(w, H, bits=4, group_size=32)     # doctest: +SKIP
"""
from __future__ import annotations

import torch

from labkit.quant.rtn import QuantizedTensor, check_weight, decode_codes, encode, group_params, resolve_group_size

__all__ = ["hessian", "gptq_quantize", "layer_error"]


def hessian(x: torch.Tensor) -> torch.Tensor:
    """H = 2/n · XᵀX for calibration inputs x [..., in] (all leading dimensions are samples), float64."""
    x = x.reshape(-1, x.shape[-1]).double()
    if x.shape[0] == 0:
        raise ValueError("calibration inputs are empty: need at least one sample")
    return 2.0 / x.shape[0] * x.t() @ x


def layer_error(w: torch.Tensor, w_hat: torch.Tensor, H: torch.Tensor) -> float:
    """The layer-output error GPTQ minimises: trace((Ŵ − W) H (Ŵ − W)ᵀ) / 2 = mean over samples of ‖(Ŵ − W)x‖²."""
    d = (w_hat.double() - w.double())
    return float((d @ H.double() * d).sum() / 2)


def _params(groups: torch.Tensor, bits: int, symmetric: bool):
    """Group parameters rounded to float32, the precision they are stored in, so codes and storage agree."""
    s, m = group_params(groups.float(), bits, symmetric)
    return s.double(), None if m is None else m.double()


def gptq_quantize(w: torch.Tensor, H: torch.Tensor, bits: int = 4, group_size: int | str = "channel",
                  symmetric: bool = False, damp: float = 0.01, block_size: int = 128,
                  act_order: bool = False) -> QuantizedTensor:
    """Quantize w [out, in] with GPTQ for the Hessian H [in, in] of its calibration inputs."""
    W = check_weight(w, bits).double().clone()
    out, n_in = W.shape
    if not isinstance(H, torch.Tensor) or H.shape != (n_in, n_in):
        raise ValueError(f"H must be the [{n_in}, {n_in}] Hessian of this layer's inputs, got "
                         f"{tuple(H.shape) if isinstance(H, torch.Tensor) else type(H).__name__}")
    if not torch.isfinite(H).all():
        raise ValueError("H contains NaN or inf: check the calibration inputs")
    if not 0 <= damp < 1:
        raise ValueError(f"damp must be in [0, 1), got {damp}")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    g, per_tensor = resolve_group_size(group_size, W)
    if per_tensor:
        raise ValueError("GPTQ quantizes per channel or per group; group_size='tensor' is not supported")
    H = H.double().clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    n_groups = n_in // g
    scale = torch.zeros(out, n_groups, dtype=torch.float64)
    minimum = None if symmetric else torch.zeros(out, n_groups, dtype=torch.float64)
    perm = torch.argsort(torch.diag(H), descending=True) if act_order else torch.arange(n_in)
    if act_order:  # static groups: parameters from the original weights, groups contiguous in the original order
        s, m = _params(W.reshape(out, n_groups, g), bits, symmetric)
        scale[:] = s
        if minimum is not None:
            minimum[:] = m
    W, H = W[:, perm], H[perm][:, perm]
    H += damp * torch.diag(H).mean() * torch.eye(n_in, dtype=H.dtype)
    try:
        U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    except torch.linalg.LinAlgError:
        raise ValueError(f"the Hessian is not positive definite even with damp={damp}: use more damping "
                         "(e.g. damp=0.1) or more calibration samples") from None
    codes = torch.zeros(out, n_in, dtype=torch.int8 if symmetric else torch.uint8)
    if not act_order:  # blocks aligned to whole groups, so a group's parameters are set from its current weights
        block_size = max(g, (block_size // g) * g) if g < n_in else n_in
    for i1 in range(0, n_in, block_size):
        i2 = min(i1 + block_size, n_in)
        W1, U1 = W[:, i1:i2].clone(), U[i1:i2, i1:i2]
        Err = torch.zeros_like(W1)
        for i in range(i2 - i1):
            col = int(perm[i1 + i])  # this column's index in the original order
            grp = col // g
            if not act_order and col % g == 0:
                s, m = _params(W1[:, i:i + g], bits, symmetric)  # the group's weights, errors included
                scale[:, grp] = s
                if minimum is not None:
                    minimum[:, grp] = m
            s = scale[:, grp]
            m = None if minimum is None else minimum[:, grp]
            q = encode(W1[:, i], s, m, bits)
            codes[:, col] = q
            err = (W1[:, i] - decode_codes(q, s, m)) / U1[i, i]
            W1[:, i:] -= err[:, None] * U1[i, i:][None, :]
            Err[:, i] = err
        W[:, i2:] -= Err @ U[i1:i2, i2:]
    return QuantizedTensor(codes, scale.float(), None if minimum is None else minimum.float(), bits, g, False)
