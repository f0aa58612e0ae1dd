"""SmolLM2 as its GGUF file stores it: the Q4_1 blocks kept as int4 codes, for the packed int4 kernel.

Q4_1 stores each group of 32 weights as codes q ∈ 0..15 with a float16 step d and minimum m,
w = d·q + m: exactly the asymmetric group-32 format of `labkit.quant.QuantLinear`, so the
codes go to the kernel as they are; the kernel holds each group's step and offset in the
activations' dtype: float32 activations keep the file's float16 steps exactly, bfloat16 ones
round many of them once more (chapter 06 counts how many). The
tied embedding is Q8_0 (int8 codes, one step per 32 weights); its rows are looked up in
float32 (one row per token), and as the LM head (the largest matrix, 21 % of the bytes)
it is either kept in float32 (`head="float32"`: the file's values exactly) or re-expressed
per channel for the int8 kernel (`head="int8"`: one more rounding, within half a
per-channel step, for speed).

With `act_dtype=torch.float32` and `head="float32"` the logits equal those of the float32
model built from the same file (`labkit.load("smollm2-135m")`) up to the order of
additions; with bfloat16 activations they differ by the activations' rounding.
"""
from __future__ import annotations

import torch

from labkit.model.gguf import load_gguf, open_gguf
from labkit.model.transformer import Transformer
from labkit.quant import ggml
from labkit.quant.linear import QuantLinear
from labkit.quant.rtn import QuantizedTensor

__all__ = ["load_gguf_native", "HEADS", "KERNELS", "pick_kernel"]

HEADS = ("auto", "q8_0", "int8", "float32")  # auto: q8_0 on labkit's kernel, else int8
KERNELS = ("auto", "q4q8", "torch-int4")  # auto: labkit's int4 × int8 kernel where it is built, else torch's int4


def pick_kernel(kernel: str, act_dtype: torch.dtype) -> tuple[str, str]:
    """(the kernel the blocks run on, why): "q4q8" for float32 activations where labkit's kernel builds."""
    from labkit.quant import native

    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "torch-int4":
        return kernel, "asked for"
    if act_dtype != torch.float32:
        if kernel == "q4q8":
            raise ValueError(f"kernel='q4q8' quantizes float32 activations to int8; act_dtype must be float32, got {act_dtype}")
        return "torch-int4", f"{str(act_dtype).replace('torch.', '')} activations"
    built, line = native.status()
    if not built:
        if kernel == "q4q8":
            raise native.KernelUnavailable(line)
        return "torch-int4", line
    return "q4q8", line


def _parts(reader, name: str) -> QuantizedTensor:
    t = {x.name: x for x in reader.tensors}[name]
    if t.tensor_type.name != "Q4_1":
        raise ValueError(f"{name} is {t.tensor_type.name}; the native int4 path reads Q4_1 tensors")
    shape = tuple(int(n) for n in reversed(t.shape))
    codes, d, m = ggml.block_parts(t.data, "Q4_1", shape)
    return QuantizedTensor(torch.from_numpy(codes.copy()), torch.from_numpy(d), torch.from_numpy(m), 4, 32)


def _cat(parts: list[QuantizedTensor]) -> QuantizedTensor:
    """Stack matrices row-wise (their groups run along each row, so they stay whole)."""
    return QuantizedTensor(torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts]),
                           torch.cat([p.minimum for p in parts]), 4, 32)


def load_gguf_native(path, act_dtype: torch.dtype = torch.bfloat16, head: str = "auto",
                     kernel: str = "auto") -> Transformer:
    """A `Transformer` whose linear layers run the file's Q4_1 codes on an int4 kernel.

    `kernel`: "q4q8" (labkit's int4 × int8 kernel, `labkit.quant.q4q8`: float32 activations quantized
    to int8 per block, exact and row-invariant), "torch-int4" (torch's packed int4 kernel, activations
    in `act_dtype`), or "auto": q4q8 for float32 activations where it is built, else torch's, with the
    reason in `model.weights`. `head`: "q8_0" (the file's Q8_0 embedding blocks as the LM head, on labkit's
    int8 × int8 kernel; needs kernel q4q8), "int8" (re-rounded per channel for torch's int8 kernel),
    "float32" (the file's values, in float32), or "auto": q8_0 with labkit's kernel, else int8.
    """
    if head not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, got {head!r}")
    kernel, why = pick_kernel(kernel, act_dtype)
    if head == "auto":
        head = "q8_0" if kernel == "q4q8" else "int8"
    if head == "q8_0" and kernel != "q4q8":
        raise ValueError(f"head='q8_0' runs on labkit's int8 × int8 kernel, which this load does not use ({why})")
    reader = open_gguf(path) if not hasattr(path, "tensors") else path
    model = load_gguf(reader)  # norms, embedding and config; its float linear weights are replaced below
    if model.config.rope_layout != "interleaved":
        raise ValueError("the native path keeps the file's Q/K rows, which need rope_layout='interleaved'")
    if kernel == "q4q8":
        from labkit.quant.q4q8 import Q4Q8Linear

        make = Q4Q8Linear.from_quantized
    else:
        make = lambda qt: QuantLinear(qt, act_dtype=act_dtype)  # noqa: E731
    for i, block in enumerate(model.layers):
        blk = f"blk.{i}."
        layer = lambda names: make(_cat([_parts(reader, blk + n + ".weight") for n in names]))  # noqa: E731
        block.attn.wqkv = layer(["attn_q", "attn_k", "attn_v"])
        block.attn.wo = layer(["attn_output"])
        block.mlp.w_gate_up = layer(["ffn_gate", "ffn_up"])
        block.mlp.w_down = layer(["ffn_down"])
    if model.lm_head is None and head == "q8_0":
        from labkit.quant.q4q8 import Q8Q8Linear

        t = {x.name: x for x in reader.tensors}["token_embd.weight"]
        codes, d, _ = ggml.block_parts(t.data, "Q8_0", tuple(int(n) for n in reversed(t.shape)))
        model.lm_head = Q8Q8Linear(torch.from_numpy(codes.copy()), torch.from_numpy(d))
    if model.lm_head is None and head == "int8":
        model.lm_head = QuantLinear.from_float(model.tok_embeddings.weight, bits=8, act_dtype=act_dtype)
    on = "labkit's int4 × int8 kernel" if kernel == "q4q8" else f"torch's int4 kernel ({why})"
    acts = "int8 per block of 32, quantized from float32" if kernel == "q4q8" else str(act_dtype).replace("torch.", "")
    model.weights = f"gguf-native (Q4_1 codes on {on}, head {head}, activations {acts})"
    return model
