"""Gemma 3 270M from its Q4_K_M file with the blocks labkit's int8 × int8 kernel takes kept as they are stored.

The file mixes formats per tensor (`labkit bench --only gemma3` prints the mix): the tied embedding and LM head
(262,144 × 640, most of a step's bytes) is Q8_0; the query, key, value, gate and up projections are Q5_0 (a
few value projections Q8_0); the attention output and the down projection are Q4_K (half the down projections
Q6_K). A Q5_0 block is d·(q − 16) with one float16 step per 32 weights: the Q8_0 layout with codes in −16..15,
so both run on the `labkit::q8q8_mm` kernel (`labkit.quant.q4q8.Q8Q8Linear`) with the file's codes and steps,
the activations quantized to int8 per block of 32 as llama.cpp quantizes them. A Q4_K sub-block of 32 is
(d·sc)·q − dmin·m, codes 0..15: Q4_1's form with float32 step and minimum (exact there, not in float16), so it
runs on the int4 kernel `labkit::q4q8_mm` with float32 steps (`Q4Q8Linear.from_q4_k`). Q6_K products stay
dequantized to float32 (no kernel for 6-bit codes yet), and `model.weights` says how many. The embedding is still
looked up from a float32 copy of the table.

The logits differ from the float32 model's (`labkit.load("gemma3-270m")`) only by the activations' int8
rounding in the products on the kernel (tests/test_gemma3.py bounds it, beside llama.cpp's own).
"""
from __future__ import annotations

import torch

from labkit.model.gguf import load_gguf, open_gguf
from labkit.model.transformer import Transformer
from labkit.quant import ggml

__all__ = ["load_gemma3_native", "ON_KERNEL"]

ON_KERNEL = ("Q8_0", "Q5_0")  # stored formats the int8 × int8 kernel runs as they are (Q4_K: the int4 kernel)
PRODUCTS = {("attn", "wqkv"): ("attn_q", "attn_k", "attn_v"), ("attn", "wo"): ("attn_output",),
            ("mlp", "w_gate_up"): ("ffn_gate", "ffn_up"), ("mlp", "w_down"): ("ffn_down",)}


def _int8_parts(tensors: dict, names: list[str]):
    """(codes int8 [rows, cols], d [rows, cols / 32]) of the named tensors stacked by rows, or None where one of
    them is in a format the kernel does not take."""
    if any(tensors[n].tensor_type.name not in ON_KERNEL for n in names):
        return None
    codes, steps = [], []
    for n in names:
        t = tensors[n]
        c, d, _ = ggml.block_parts(t.data, t.tensor_type.name, tuple(int(x) for x in reversed(t.shape)))
        codes.append(torch.from_numpy(c.copy()))
        steps.append(torch.from_numpy(d))
    return torch.cat(codes), torch.cat(steps)


def load_gemma3_native(path) -> Transformer:
    """A Gemma 3 `Transformer` whose Q8_0 and Q5_0 products and tied LM head run the file's blocks on labkit's
    int8 × int8 kernel and its Q4_K products on the int4 kernel (the module docstring); `KernelUnavailable` where
    the kernel cannot be built here."""
    from labkit.quant import native
    from labkit.quant.q4q8 import Q4Q8Linear, Q8Q8Linear

    built, line = native.status()
    if not built:
        raise native.KernelUnavailable(f"weights='gguf' runs Gemma's blocks on labkit's kernel: {line}")
    reader = open_gguf(path) if not hasattr(path, "tensors") else path
    model = load_gguf(reader)
    if model.config.layer_windows is None:
        raise ValueError(f"{getattr(reader.data, 'filename', path)} is not a Gemma 3 file: use load_gguf_native")
    tensors = {t.name: t for t in reader.tensors}
    on, total = 0, 0
    for i, block in enumerate(model.layers):
        for (part, attr), names in PRODUCTS.items():
            total += 1
            full = [f"blk.{i}.{n}.weight" for n in names]
            parts = _int8_parts(tensors, full)
            if parts is not None:
                setattr(getattr(block, part), attr, Q8Q8Linear(*parts))
                on += 1
            elif len(full) == 1 and tensors[full[0]].tensor_type.name == "Q4_K":
                t = tensors[full[0]]
                setattr(getattr(block, part), attr,
                        Q4Q8Linear.from_q4_k(t.data, tuple(int(x) for x in reversed(t.shape))))
                on += 1
    head = _int8_parts(tensors, ["token_embd.weight"])
    model.lm_head = Q8Q8Linear(*head)
    model.weights = (f"gguf-native (the LM head and {on} of {total} block products on labkit's kernels: Q8_0 and "
                     f"Q5_0 on the int8 × int8 one, Q4_K on the int4 one with float32 steps; the rest, Q6_K, "
                     "dequantized to float32; activations int8 per block of 32, quantized from float32)")
    return model
