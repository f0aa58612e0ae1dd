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

from labkit.quant.linear import QuantLinear

__all__ = ["quantize_model", "METHODS", "model_nbytes"]

METHODS = ("rtn",)


def quantize_model(model: nn.Module, method: str = "rtn", bits: int = 8, group_size: int = 32, calib=None,
                   include_head: bool = True, act_dtype: torch.dtype = torch.float32, reference: bool = False,
                   inplace: bool = False) -> nn.Module:
    """A copy of `model` (or `model` itself with `inplace`) whose linear layers hold `bits`-bit codes."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if bits not in (8, 4):
        raise ValueError(f"bits must be 8 or 4 for the packed layers, got {bits!r}")
    if calib is not None:
        raise ValueError("method='rtn' needs no calibration data; calib must be None")
    out = model if inplace else copy.deepcopy(model)
    make = lambda w: QuantLinear.from_float(w.detach().float(), bits=bits, group_size=group_size,  # noqa: E731
                                            act_dtype=act_dtype, reference=reference)
    targets = [(name, m) for name, m in out.named_modules() if isinstance(m, nn.Linear)]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = out.get_submodule(parent_name) if parent_name else out
        setattr(parent, child, make(module.weight))
    if include_head and getattr(out, "lm_head", 1) is None and isinstance(getattr(out, "tok_embeddings", None), nn.Embedding):
        out.lm_head = make(out.tok_embeddings.weight)
    out.quantization = {"method": method, "bits": bits, "group_size": group_size if bits == 4 else "channel",
                        "act_dtype": str(act_dtype).replace("torch.", ""), "head": include_head}
    return out


def model_nbytes(model: nn.Module) -> int:
    """Bytes of weights one decode step reads: quantized layers' codes and scales, float linears, the head."""
    total = 0
    for m in model.modules():
        if isinstance(m, QuantLinear):
            total += m.nbytes()
        elif isinstance(m, nn.Linear):
            total += m.weight.numel() * m.weight.element_size()
    if getattr(model, "lm_head", 1) is None and isinstance(getattr(model, "tok_embeddings", None), nn.Embedding):
        w = model.tok_embeddings.weight
        total += w.numel() * w.element_size()
    return total
