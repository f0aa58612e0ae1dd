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

__all__ = ["load_gguf_native", "HEADS"]

HEADS = ("int8", "float32")


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


def load_gguf_native(path, act_dtype: torch.dtype = torch.bfloat16, head: str = "int8") -> Transformer:
    """A `Transformer` whose linear layers run the file's Q4_1 codes on the int4 kernel."""
    if head not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, got {head!r}")
    reader = open_gguf(path) if not hasattr(path, "tensors") else path
    model = load_gguf(reader)  # norms, embedding and config; its float linear weights are replaced below
    if model.config.rope_layout != "interleaved":
        raise ValueError("the native path keeps the file's Q/K rows, which need rope_layout='interleaved'")
    for i, block in enumerate(model.layers):
        blk = f"blk.{i}."
        layer = lambda names: QuantLinear(_cat([_parts(reader, blk + n + ".weight") for n in names]),  # noqa: E731
                                          act_dtype=act_dtype)
        block.attn.wqkv = layer(["attn_q", "attn_k", "attn_v"])
        block.attn.wo = layer(["attn_output"])
        block.mlp.w_gate_up = layer(["ffn_gate", "ffn_up"])
        block.mlp.w_down = layer(["ffn_down"])
    if model.lm_head is None and head == "int8":
        model.lm_head = QuantLinear.from_float(model.tok_embeddings.weight, bits=8, act_dtype=act_dtype)
    model.weights = f"gguf-native (Q4_1 codes, head {head}, activations {str(act_dtype).replace('torch.', '')})"
    return model
