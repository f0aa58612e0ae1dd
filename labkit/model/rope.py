"""Rotary position embedding (RoPE), in both dimension layouts, and the GGUF permutation.

Follows Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding".
Each pair of dimensions i = 0..d/2-1 of a query or key at position m is rotated by the
angle m·θ_i with θ_i = base^(-2i/d). Which dimensions form a pair is a convention:

- "interleaved": (x0, x1), (x2, x3), ... - Meta's original Llama code, llama.cpp's
  LLAMA_ROPE_TYPE_NORM, and therefore the Q/K weights inside a Llama GGUF file;
- "half": (x_i, x_{i+d/2}) - GPT-NeoX and Hugging Face's `rotate_half`.

Both are the same rotation after a fixed permutation of the head dimensions, which
is why a checkpoint must be used with the layout its Q/K rows were written in:
`permute_qk_rows` converts a GGUF (interleaved) projection to the half layout,
exactly as Hugging Face's `convert_llama_weights_to_hf.py` does.

    >>> rope = Rotary(head_dim=4, base=10000.0, max_len=8, layout="interleaved")
    >>> x = torch.ones(1, 1, 2, 4)                  # [B, heads, T, head_dim]
    >>> rope(x, torch.tensor([0, 1]))[0, 0, 0]      # position 0: no rotation
    tensor([1., 1., 1., 1.])
"""
from __future__ import annotations

import torch

LAYOUTS = ("interleaved", "half")


def inv_frequencies(head_dim: int, base: float) -> torch.Tensor:
    """θ_i = base^(-2i/head_dim) for i = 0..head_dim/2-1, float64 [head_dim/2]."""
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def angles(positions: torch.Tensor, head_dim: int, base: float) -> torch.Tensor:
    """m·θ_i for every position m: float64 [len(positions), head_dim/2]."""
    return positions.to(torch.float64)[:, None] * inv_frequencies(head_dim, base)[None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Rotate `x` [..., T, head_dim] by per-position `cos`, `sin` [T, head_dim/2].

    The textbook form, written out pair by pair; `Rotary` is the fast one used by the model.
    """
    if layout == "interleaved":
        x0, x1 = x[..., 0::2], x[..., 1::2]  # [..., T, head_dim/2] each
        out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)  # [..., T, head_dim/2, 2]
        return out.flatten(-2)
    if layout == "half":
        half = x.shape[-1] // 2
        x0, x1 = x[..., :half], x[..., half:]
        return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


class Rotary:
    """RoPE with precomputed tables: `rope(x, positions)` rotates x [B, H, T, head_dim].

    `positions` is a LongTensor [T] of absolute positions (what a KV cache's `begin`
    returns). Tables are computed in float64 and stored in `dtype`.
    """

    def __init__(self, head_dim: int, base: float, max_len: int, layout: str = "half",
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.head_dim, self.base, self.max_len, self.layout = head_dim, base, max_len, layout
        self.device = torch.device(device)
        theta = angles(torch.arange(max_len), head_dim, base).to(self.device)  # float64 [max_len, head_dim/2]
        # interleaved: one complex multiply per pair, (x0 + i·x1)·(cos + i·sin) = e^{i·m·θ}
        # half: the rotate_half form, x·[cos, cos] + [-x1, x0]·[sin, sin]
        self._tables64 = (torch.polar(torch.ones_like(theta), theta) if layout == "interleaved"
                          else (torch.cat([theta.cos()] * 2, -1), torch.cat([theta.sin()] * 2, -1)))
        self._tables: dict[torch.dtype, object] = {}
        self._parts: dict[torch.dtype, tuple] = {}  # interleaved: the complex tables' (cos, sin), for compilers
        self._gathered = (None, None, None)  # (positions, (dtype, token_major), tables at those positions)
        self.tables(dtype)

    def tables(self, dtype: torch.dtype):
        """The tables for inputs of `dtype` (the interleaved form always multiplies in complex64/128)."""
        if dtype not in self._tables:
            if self.layout == "interleaved":
                self._tables[dtype] = self._tables64.to(torch.complex128 if dtype == torch.float64 else torch.complex64)
                self._parts[dtype] = (self._tables[dtype].real.contiguous(), self._tables[dtype].imag.contiguous())
            else:
                self._tables[dtype] = tuple(t.to(dtype) for t in self._tables64)
        return self._tables[dtype]

    def at(self, positions: torch.Tensor, dtype: torch.dtype, token_major: bool = False):
        """The tables gathered at `positions` (complex [T, head_dim/2], or (cos, sin) [T, head_dim]).

        `token_major`: shaped [T, 1, ...] to broadcast over [B, T, heads, head_dim] inputs. A
        forward pass rotates the queries and keys of every layer at the same positions tensor,
        so the gather is done once and reused while the same tensor object comes back
        (positions tensors are never modified in place).
        """
        key = (dtype, token_major)
        if torch.compiler.is_compiling():  # a traced pass: gather, keep nothing, and no complex numbers
            return self._gather(positions, dtype, token_major, real=True)
        last_positions, last_key, gathered = self._gathered
        if positions is not last_positions or key != last_key:
            gathered = self._gather(positions, dtype, token_major)
            self._gathered = (positions, key, gathered)
        return gathered

    def _gather(self, positions: torch.Tensor, dtype: torch.dtype, token_major: bool, real: bool = False):
        """The tables at `positions`; `real`: the interleaved layout's as (cos, sin) [T, head_dim/2], for a compiler
        (inductor writes no code for complex numbers). They are the complex table's two parts, bit for bit."""
        tables = self.tables(dtype)
        if real and self.layout == "interleaved":
            tables = self._parts[dtype]
        gathered = tables[positions] if not isinstance(tables, tuple) else tuple(t[positions] for t in tables)
        if token_major:
            gathered = gathered[:, None] if not isinstance(gathered, tuple) else tuple(t[:, None] for t in gathered)
        return gathered

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [B, H, T, head_dim] rotated to `positions` [T]."""
        return self._rotate(x, self.at(positions, x.dtype))

    def rotate_tokens(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [B, T, heads, head_dim] (token-major, as a projection makes them) rotated to `positions` [T]."""
        return self._rotate(x, self.at(positions, x.dtype, token_major=True))

    def _rotate(self, x: torch.Tensor, tables) -> torch.Tensor:
        if self.layout == "interleaved" and isinstance(tables, tuple):  # (cos, sin): the pairs in real arithmetic
            work = x if x.dtype in (torch.float32, torch.float64) else x.float()
            return apply_rope(work, *tables, "interleaved").to(x.dtype)
        if self.layout == "interleaved":
            work = x if x.dtype in (torch.float32, torch.float64) else x.float()
            pairs = work.unflatten(-1, (-1, 2))  # [..., head_dim/2, 2]
            rotated = torch.view_as_real(torch.view_as_complex(pairs) * tables).flatten(-2)  # [..., head_dim]
            return rotated if rotated.dtype == x.dtype else rotated.to(x.dtype)
        cos, sin = tables  # [.., head_dim] each
        half = self.head_dim // 2
        rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated_half * sin


def permute_qk_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the rows of a Q or K projection from the interleaved to the half layout.

    Within each head, row 2i+j (interleaved) moves to row j·head_dim/2 + i (half), as in
    Hugging Face's `convert_llama_weights_to_hf.py`. Use `n_kv_heads` for K. The inverse
    is llama.cpp's `LlamaModel.permute`.
    """
    out_features, in_features = w.shape
    head_dim = out_features // n_heads
    # [heads, head_dim/2, 2, in] -> [heads, 2, head_dim/2, in]
    return w.reshape(n_heads, head_dim // 2, 2, in_features).transpose(1, 2).reshape(out_features, in_features)


def unpermute_qk_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of `permute_qk_rows`: half layout back to interleaved (llama.cpp's permute)."""
    out_features, in_features = w.shape
    head_dim = out_features // n_heads
    # [heads, 2, head_dim/2, in] -> [heads, head_dim/2, 2, in]
    return w.reshape(n_heads, 2, head_dim // 2, in_features).transpose(1, 2).reshape(out_features, in_features)
