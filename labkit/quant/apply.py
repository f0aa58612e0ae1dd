"""Quantize a whole model: every linear layer (and the LM head) becomes a `QuantLinear`.

    >>> qmodel = quantize_model(model, method="rtn", bits=4, group_size=32)   # doctest: +SKIP

Works on any module tree (this layer knows nothing of labkit's `Transformer`): every
`nn.Linear` is replaced in place of a deep copy; a model with a tied LM head (an
`lm_head` attribute that is None and a `tok_embeddings` embedding) gets its own quantized
head, since the head is the largest single matrix of a small model (21 % of SmolLM2's
bytes). The embedding itself is only looked up, one row per token, and stays float.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from labkit.quant.calibrate import awq_blocks, gptq_blocks
from labkit.quant.linear import QuantLinear

__all__ = ["quantize_model", "METHODS", "model_nbytes"]

METHODS = ("rtn", "gptq", "awq")


def _check_calib(model, calib, method):
    if method == "rtn":
        if calib is not None:
            raise ValueError("method='rtn' needs no calibration data; calib must be None")
        return None
    if calib is None:
        raise ValueError(f"method={method!r} needs calibration token ids: calib=LongTensor [batch, tokens]")
    if not isinstance(calib, torch.Tensor):
        calib = torch.tensor(calib, dtype=torch.long)
    if calib.dim() == 1:
        calib = calib[None]
    if calib.dim() != 2 or calib.shape[1] < 2 or calib.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"calib must be integer token ids of shape [batch, tokens >= 2], got "
                         f"{calib.dtype} {tuple(calib.shape)}")
    vocab = model.tok_embeddings.weight.shape[0]
    if int(calib.min()) < 0 or int(calib.max()) >= vocab:
        raise ValueError(f"calib holds token ids outside the vocabulary [0, {vocab})")
    return calib.long()


def quantize_model(model: nn.Module, method: str = "rtn", bits: int = 8, group_size: int = 32, calib=None,
                   include_head: bool = True, act_dtype: torch.dtype = torch.float32, reference: bool = False,
                   inplace: bool = False, damp: float = 0.01, act_order: bool = False) -> nn.Module:
    """A copy of `model` (or `model` itself with `inplace`) whose linear layers hold `bits`-bit codes.

    `method`: "rtn" (no data), "gptq" or "awq" (both need `calib`, token ids [batch, tokens]).
    8-bit layers are per channel and symmetric, 4-bit ones asymmetric in groups of `group_size`
    (the layouts of the packed kernels). The LM head is quantized too (`include_head`).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if bits not in (8, 4):
        raise ValueError(f"bits must be 8 or 4 for the packed layers, got {bits!r}")
    calib = _check_calib(model, calib, method)
    out = model if inplace else copy.deepcopy(model)
    out.requires_grad_(False)
    granularity, symmetric = ("channel", True) if bits == 8 else (group_size, False)
    make = lambda w: QuantLinear.from_float(w.detach().float(), bits=bits, group_size=group_size,  # noqa: E731
                                            act_dtype=act_dtype, reference=reference)
    alphas = None
    if method == "gptq":
        gptq_blocks(out, calib, lambda qt: QuantLinear(qt, act_dtype=act_dtype, reference=reference), bits,
                    granularity, symmetric, damp, act_order, include_head)
    elif method == "awq":
        alphas = awq_blocks(out, calib, bits, granularity, symmetric, include_head)
    for name, module in [(n, m) for n, m in out.named_modules() if isinstance(m, nn.Linear)]:
        parent_name, _, child = name.rpartition(".")
        setattr(out.get_submodule(parent_name) if parent_name else out, child, make(module.weight))
    if include_head and _tied(out):
        out.lm_head = make(out.tok_embeddings.weight)
    out.quantization = {"method": method, "bits": bits, "group_size": granularity,
                        "act_dtype": str(act_dtype).replace("torch.", ""), "head": include_head, "awq_alpha": alphas}
    return out


def _tied(model) -> bool:
    return getattr(model, "lm_head", 1) is None and isinstance(getattr(model, "tok_embeddings", None), nn.Embedding)


def model_nbytes(model: nn.Module) -> int:
    """Bytes of weights one decode step reads: quantized layers' codes and scales, float linears, the head."""
    total = 0
    for m in model.modules():
        if isinstance(m, QuantLinear):
            total += m.nbytes()
        elif isinstance(m, nn.Linear):
            total += m.weight.numel() * m.weight.element_size()
    if _tied(model):
        w = model.tok_embeddings.weight
        total += w.numel() * w.element_size()
    return total
