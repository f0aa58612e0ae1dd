"""Exercises of chapter 02: RoPE in the half layout, grouped-query causal attention (debugged, then with a
sliding window), the parameter count."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from labkit.model.config import ModelConfig
from labkit.exercises._core import check
from labkit.model.rope import angles, apply_rope

__all__ = ["check_rope_half", "check_gqa_attention", "check_window_attention",
           "check_param_count"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rope(x: torch.Tensor, positions: torch.Tensor, base: float, layout: str) -> torch.Tensor:
    theta = angles(positions, x.shape[-1], base)
    return apply_rope(x, theta.cos().to(x.dtype), theta.sin().to(x.dtype), layout)


def _reference_rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    return _rope(x, positions, base, "interleaved")


def _reference_rope_half(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    return _rope(x, positions, base, "half")


def check_rope_half(fn) -> bool:
    """Check `fn(x [T, d], positions [T], base) -> [T, d]`, half layout (Hugging Face checkpoints, Gemma 3's file):
    pair (x[i], x[i + d/2]) at position m is rotated by m · base^(-2i/d)."""
    g = _gen(3)
    cases = [
        (torch.tensor([[1.0, 0.0]], dtype=torch.float64), torch.tensor([1]), 10000.0),
        (torch.randn(3, 4, generator=g, dtype=torch.float64), torch.tensor([0, 1, 2]), 10000.0),
        (torch.randn(5, 8, generator=g, dtype=torch.float64), torch.tensor([7, 3, 100, 0, 42]), 100000.0),
        (torch.randn(2, 16, generator=g, dtype=torch.float64), torch.tensor([5, 1000]), 1e6),
    ]
    return check("rope_half", fn, _reference_rope_half, cases,
                 hint="the angles are the interleaved layout's (theta_i = base ** (-2 i / d), angle = m * theta_i); "
                      "only the pairs change: (x[i], x[i + d/2]) for i < d/2, and the result keeps that order")


def _reference_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return _reference_window(q, k, v, q.shape[1])  # a window as long as the sequence: plain causal attention


def check_gqa_attention(fn) -> bool:
    """Check `fn(q [n_heads, T, d], k [n_kv_heads, T, d], v [n_kv_heads, T, d]) -> [n_heads, T, d]`:
    causal softmax(q·kᵀ/√d)·v where query head h reads KV head h // (n_heads / n_kv_heads)."""
    g = _gen(2)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    cases = [(r(1, 3, 4), r(1, 3, 4), r(1, 3, 4)), (r(4, 5, 8), r(4, 5, 8), r(4, 5, 8)),
             (r(6, 4, 8), r(2, 4, 8), r(2, 4, 8)), (r(9, 6, 16), r(3, 6, 16), r(3, 6, 16))]
    return check("gqa_attention", fn, _reference_gqa, cases,
                 hint="test one property at a time: with one KV head for every query head, does your output match? "
                      "does query t ever see a key after t? which KV head does query head h read, and does the "
                      "scores' scale follow the statement?")


def _reference_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    g = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
    T = q.shape[1]
    pos = torch.arange(T)
    seen = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < window)  # [query, key]
    scores = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~seen, float("-inf"))
    return scores.softmax(-1) @ v


def check_window_attention(fn) -> bool:
    """Check `fn(q [n_heads, T, d], k [n_kv_heads, T, d], v [n_kv_heads, T, d], window) -> [n_heads, T, d]`:
    grouped-query causal attention in which query t reads only keys t - window + 1 ... t (the last `window`
    positions, itself included), as a sliding layer of Gemma 3 does."""
    g = _gen(4)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    cases = [(r(1, 5, 4), r(1, 5, 4), r(1, 5, 4), 2), (r(4, 6, 8), r(2, 6, 8), r(2, 6, 8), 3),
             (r(6, 7, 8), r(2, 7, 8), r(2, 7, 8), 1), (r(2, 4, 8), r(1, 4, 8), r(1, 4, 8), 10),
             (r(3, 9, 16), r(3, 9, 16), r(3, 9, 16), 4)]
    return check("window_attention", fn, _reference_window, cases,
                 hint="start from the causal mask and also hide every key more than window - 1 positions before the "
                      "query (window 1: each query sees only itself); group the KV heads and scale the scores as the statement says")


PARAM_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                "tie_embeddings")


_PARAM_MODELS = ("smollm2-135m", "llama-2-7b", "llama-3-8b", "llama-3.2-1b")


def _fields(name: str) -> SimpleNamespace:
    """A Llama-family config's fields only, no methods: `n_params()` is what the exercise derives."""
    config = ModelConfig.from_name(name)
    return SimpleNamespace(**{f: getattr(config, f) for f in PARAM_FIELDS})


def _reference_param_count(c) -> int:
    # the config whose fields these are, counted by `ModelConfig.n_params` (one parameter count in labkit)
    return next(ModelConfig.from_name(n) for n in _PARAM_MODELS if _fields(n) == c).n_params()


def check_param_count(fn) -> bool:
    """Check `fn(config) -> int`: the model's distinct parameters (a tied LM head counts once), from a config that
    carries the fields `PARAM_FIELDS` only."""
    cases = [(_fields(n),) for n in _PARAM_MODELS]
    return check("param_count", fn, _reference_param_count, cases,
                 hint="list every weight tensor of the model and its shape from the fields; which of them does a "
                      "tied LM head not add, and which vectors are not matrices?")
