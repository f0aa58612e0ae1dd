"""Gemma 3's rules as a GGUF file's loader needs them: the config fields in which it differs from Llama.

Sandwich norms, QK-norm, GeGLU (GELU, tanh form), embeddings × √d_model (in float32, as llama.cpp), and five
sliding layers (RoPE base 10,000, the window from the file) to every global one (the file's base). The sliding
pattern and the local base are not in the file; llama.cpp sets them for the architecture, and so does labkit.
What a file asks that labkit does not implement is refused by name (`gemma3_unsupported`): RoPE scaling (Gemma 3
4B, 12B and 27B stretch their global layers' positions, "linear", factor 8), the 27B's query scale (llama.cpp
picks 1/√(d_model / n_heads) for that size, not 1/√head_dim), and another sliding pattern.
"""
from __future__ import annotations

import numpy as np

__all__ = ["gemma3_fields", "gemma3_unsupported", "GEMMA3_GLOBAL_EVERY", "GEMMA3_LOCAL_ROPE_BASE"]

GEMMA3_GLOBAL_EVERY = 6  # layers 5, 11, 17, ... attend globally, the rest through the sliding window
GEMMA3_LOCAL_ROPE_BASE = 10_000.0


def gemma3_unsupported(reader) -> list[str]:
    """What a Gemma 3 file asks that this loader does not implement (the module docstring), one phrase each."""
    n_layers = int(reader.fields["gemma3.block_count"].contents())
    kind = reader.fields.get("gemma3.rope.scaling.type")
    kind = str(kind.contents()) if kind is not None else "none"
    factor = reader.fields.get("gemma3.rope.scaling.factor")
    factor = float(factor.contents()) if factor is not None else 1.0
    out = []
    if kind != "none" or factor not in (0.0, 1.0):
        out.append(f"RoPE scaling ({kind}, factor {factor:g})")
    if n_layers == 62:  # llama.cpp: LLM_TYPE_27B -> f_attention_scale = 1 / sqrt(n_embd / n_head)
        out.append("the 27B's query scale (1/sqrt(d_model / n_heads))")
    pattern = reader.fields.get("gemma3.attention.sliding_window_pattern")
    if pattern is not None:
        got = pattern.contents()
        ours = [(i + 1) % GEMMA3_GLOBAL_EVERY != 0 for i in range(n_layers)]  # True: a sliding layer
        if not (got == GEMMA3_GLOBAL_EVERY if isinstance(got, (int, float)) else [bool(x) for x in got] == ours):
            out.append(f"the sliding pattern {got!r} (this loader: one global layer in {GEMMA3_GLOBAL_EVERY})")
    return out


def gemma3_fields(reader, field) -> dict:
    """The config fields in which Gemma 3 differs from Llama (see the module docstring), read with `field(reader,
    key)` (`labkit.model.gguf`'s); ValueError naming what the file asks that the loader does not implement
    (`gemma3_unsupported`)."""
    missing = gemma3_unsupported(reader)
    if missing:
        raise ValueError(f"{reader.data.filename}: this Gemma 3 file needs what labkit's loader does not implement: "
                         f"{'; '.join(missing)}. labkit runs Gemma 3 270M (and sizes without these: 1B)")
    n_layers, d_model = int(field(reader, "gemma3.block_count")), int(field(reader, "gemma3.embedding_length"))
    window = int(field(reader, "gemma3.attention.sliding_window"))
    return dict(norm_placement="sandwich", qk_norm=True, activation="gelu_tanh",
                embed_scale=float(np.sqrt(np.float32(d_model))),
                layer_windows=tuple(0 if (i + 1) % GEMMA3_GLOBAL_EVERY == 0 else window for i in range(n_layers)),
                rope_local_base=GEMMA3_LOCAL_ROPE_BASE)
