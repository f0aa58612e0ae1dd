"""Quantize a whole model: every linear layer (and the LM head) becomes a `QuantLinear`.

    >>> qmodel = quantize_model(model, method="rtn", bits=4, group_size=32)   # doctest: +SKIP

Works on any module tree (this layer knows nothing of labkit's `Transformer`): every
`nn.Linear` is replaced in place of a deep copy; a model with a tied LM head (an
`lm_head` attribute that is None and a `tok_embeddings` embedding) gets its own quantized
head, since the head is the largest single matrix of a small model (21 % of SmolLM2's
bytes). The embedding itself is only looked up, one row per token, and stays float.

What each choice costs (SmolLM2, one decode step: `labkit bench --only quant` measures it on this
machine, chapter 06 prints it): the packed int8/int4 kernels with **bfloat16 activations** (the
default) are the fast path, faster than float32; the same kernels with float32 activations
(`act_dtype=torch.float32`) decode slower than float32 and exist for exact comparisons; `reference=True` multiplies the dequantized float32
weights (float speed, the format's numbers). `fmt=` stores the weights in a block format instead
(Q8_0, Q4_1, MXFP4, MXFP8, NVFP4: `BlockLinear`), with float32 activations or, for Q8_0 and Q4_1,
`activations="int8"`: inputs quantized per block and integer dot products, as llama.cpp does.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from tqdm.auto import tqdm

from labkit import checks
from labkit.quant import intdot
from labkit.quant.blocklinear import BlockLinear, check_options, fits
from labkit.quant.calibrate import awq_blocks, gptq_blocks
from labkit.quant.linear import QuantLinear, layout, packed_layout_problem
from labkit.quant.q4q8 import Q4Q8Linear, Q8Q8Linear
from labkit.quant.rtn import quantize

__all__ = ["quantize_model", "METHODS", "MODEL_BITS", "model_nbytes", "read_nbytes"]

METHODS = ("rtn", "gptq", "awq")
MODEL_BITS = (8, 4, 3)


def _check_calib(model, calib, method):
    if isinstance(calib, str):
        raise TypeError("calib must be token ids [batch, tokens], got a str: encode the text with the model's "
                        "tokenizer first (tok.encode(text))")
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


def quantize_model(model: nn.Module, method: str = "rtn", bits: int | None = None, group_size: int | str | None = None,
                   calib=None, include_head: bool = True, act_dtype: torch.dtype = torch.bfloat16,
                   reference: bool = False, inplace: bool = False, damp: float = 0.01, act_order: bool = False,
                   progress: bool = False, fmt: str | None = None, activations: str = "float",
                   sums: str = "auto", fallback: str | None = None) -> nn.Module:
    """A copy of `model` (or `model` itself with `inplace`) whose linear layers hold `bits`-bit codes.

    `method`: "rtn" (no data), "gptq" or "awq" (both need `calib`, token ids [batch, tokens]).
    8-bit layers are per channel and symmetric; 4- and 3-bit ones asymmetric in groups of
    `group_size` (or one group per row: "channel"). Layouts the packed kernels take (int8 per
    channel, int4 in groups of 32…256) run on them; the others (3 bits, per-channel int4)
    compute x @ dequantize(W)ᵀ in float32: the same numbers, float speed, for measuring quality.
    The LM head is quantized too (`include_head`). `progress` shows a bar over the blocks.
    `bits` defaults to 8 and `group_size` to 32. Activations are bfloat16 by default: the fast path
    (see the module docstring for what float32 activations cost).

    `fmt` (one of `BLOCK_FORMATS`) stores every matrix in that block format by round to nearest
    instead (bits and group_size come with the format); `activations="int8"` with fmt Q8_0 or
    Q4_1 multiplies integer codes, `sums` "auto" (= "float"), "float", "int_mm" or "reference" (`labkit.quant.intdot`).
    `fallback`: the format of matrices whose rows do not cut into whole blocks of `fmt` (a K-quant's 256 on rows
    of 640), as llama.cpp's quantizer falls back; without it such a matrix is an error.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch module (labkit.load(...)[0]), got {type(model).__name__} {model!r:.40}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method != "rtn" and getattr(getattr(model, "config", None), "compressed_attention", False):
        raise ValueError(f"method={method!r} calibrates dense attention layers (AWQ folds scales into the projections "
                         f"an RMSNorm feeds); a compressed-attention model takes method='rtn' only")
    if fmt is not None:
        return _quantize_blocks(model, method, bits, group_size, calib, include_head, inplace, fmt, activations, sums,
                                fallback)
    if fallback is not None:
        raise ValueError(f"fallback={fallback!r} is the block format for rows fmt does not fit: it needs fmt")
    if activations != "float":
        raise ValueError(f"activations={activations!r} needs a block format (fmt='Q8_0' or 'Q4_1'); "
                         "the packed kernels take float activations")
    bits = 8 if bits is None else bits
    group_size = 32 if group_size is None else group_size
    checks.one_of("bits", bits, MODEL_BITS)
    calib = _check_calib(model, calib, method)
    out = model if inplace else copy.deepcopy(model)
    out.requires_grad_(False)
    granularity, symmetric = layout(bits, group_size)

    def layer(qt):
        return QuantLinear(qt, act_dtype=act_dtype, reference=reference or packed_layout_problem(qt) is not None)

    def make(w):
        w = w.detach().float()
        return layer(quantize(w, bits, granularity, symmetric=symmetric))

    bar = tqdm(total=len(out.layers), desc=f"{method} {bits}-bit", unit="block", disable=not progress) \
        if method != "rtn" else None
    tick = (lambda i: bar.update(1)) if bar is not None else None
    alphas = None
    if method == "gptq":
        gptq_blocks(out, calib, layer, bits, granularity, symmetric, damp, act_order, include_head, progress=tick)
    elif method == "awq":
        alphas = awq_blocks(out, calib, bits, granularity, symmetric, include_head, progress=tick)
    if bar is not None:
        bar.close()
    _replace_linears(out, make, include_head)
    kernels = {"reference" if m.reference else "packed" for m in out.modules() if isinstance(m, QuantLinear)}
    out.quantization = {"method": method, "bits": bits, "group_size": granularity,
                        "act_dtype": str(act_dtype).replace("torch.", ""), "head": include_head, "awq_alpha": alphas,
                        "kernel": "+".join(sorted(kernels))}
    return out


def _replace_linears(out: nn.Module, make, include_head: bool) -> None:
    """Every nn.Linear becomes make(weight); a tied head gets its own copy when `include_head`."""
    for name, module in [(n, m) for n, m in out.named_modules() if isinstance(m, nn.Linear)]:
        parent_name, _, child = name.rpartition(".")
        setattr(out.get_submodule(parent_name) if parent_name else out, child, make(module.weight))
    if include_head and _tied(out):
        out.lm_head = make(out.tok_embeddings.weight)
    if getattr(out, "compiled", None) is not None:  # a compiled step was traced on the float layers
        out.compiled.reset()


def _quantize_blocks(model, method, bits, group_size, calib, include_head, inplace, fmt, activations, sums, fallback):
    if method != "rtn" or calib is not None:
        raise ValueError(f"fmt={fmt!r} rounds to nearest: method must be 'rtn' and calib None, "
                         f"got method={method!r}")
    if bits is not None or group_size is not None:
        raise ValueError(f"fmt={fmt!r} fixes the bits and the block; pass fmt or bits/group_size, not both "
                         f"(got bits={bits!r}, group_size={group_size!r})")
    check_options(fmt, activations, sums)  # before the copy: a bad choice fails at once, naming itself
    if fallback is not None:
        check_options(fallback, activations, sums)
    out = model if inplace else copy.deepcopy(model)
    out.requires_grad_(False)
    fell_back = []

    def make(w):
        if fallback is None or fits(fmt, w.shape[1]):
            return BlockLinear(w, fmt, activations, sums)
        fell_back.append(tuple(w.shape))
        return BlockLinear(w, fallback, activations, sums)

    _replace_linears(out, make, include_head)
    out.quantization = {"method": "rtn", "fmt": fmt, "activations": activations, "head": include_head,
                        "kernel": "reference" if activations == "float" else intdot.resolve_sums(sums),
                        "fallback": fallback, "fell_back": len(fell_back)}
    return out


def _tied(model) -> bool:
    return getattr(model, "lm_head", 1) is None and isinstance(getattr(model, "tok_embeddings", None), nn.Embedding)


def read_nbytes(layer: nn.Module) -> int:
    """Bytes of weights one product of `layer` reads in labkit, as it is built here (not what the format stores).

    A packed `QuantLinear`: its packed codes and scales, as they sit in its buffers. A reference
    `QuantLinear` (3 bits, per-channel int4): its codes (one int8 per weight), its scales and minimums,
    and the float32 matrix it builds from them on every call. A `BlockLinear` with float activations: its
    float32 copy (`dense`), the only weights its product touches; with int8 activations: its int8 codes
    (one byte per weight, Q4_1 too) and its float32 d (and m). A `Q4Q8Linear` or `Q8Q8Linear`: its packed codes and
    float16 steps (and minimums) (exactly what the file stores). An `nn.Linear`: its weight.
    """
    if isinstance(layer, QuantLinear):
        if layer.reference:
            qt = layer.qt
            stored = sum(t.numel() * t.element_size() for t in (qt.codes, qt.scale, qt.minimum) if t is not None)
            return stored + layer.out_features * layer.in_features * 4
        return sum(b.numel() * b.element_size() for b in (layer.codes, layer.scales))
    if isinstance(layer, BlockLinear):
        parts = (layer.dense,) if layer.dense is not None else (layer.codes, layer.d, layer.m)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)
    if isinstance(layer, (Q4Q8Linear, Q8Q8Linear)):
        return sum(b.numel() * b.element_size() for b in layer.buffers())
    if isinstance(layer, nn.Linear):
        return layer.weight.numel() * layer.weight.element_size()
    raise TypeError(f"layer must be a QuantLinear, BlockLinear, Q4Q8Linear, Q8Q8Linear or nn.Linear, got {type(layer).__name__}")


def model_nbytes(model: nn.Module, read: bool = False) -> int:
    """Bytes of weights of one decode step: every linear layer once, the LM head included.

    By default what the formats store (codes and scales: `nbytes()` of each quantized layer); with
    `read=True` what labkit's layers read as they are built (`read_nbytes`: float copies included).
    """
    total = 0
    for m in model.modules():
        if isinstance(m, (QuantLinear, BlockLinear, Q4Q8Linear, Q8Q8Linear)):
            total += read_nbytes(m) if read else m.nbytes()
        elif isinstance(m, nn.Linear):
            total += m.weight.numel() * m.weight.element_size()
    if _tied(model):
        w = model.tok_embeddings.weight
        total += w.numel() * w.element_size()
    return total
