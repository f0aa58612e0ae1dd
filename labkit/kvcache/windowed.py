"""The windowed KV cache: each layer holds what its own attention can still see (Gemma 3's local and global layers).

A model with sliding layers (`ModelConfig.layer_windows`: Gemma 3 has a window of 512 on five layers of every
six) reads, on a local layer, only the keys of the last `window` positions. The contiguous cache keeps every
token in every layer anyway. This kind keeps, per layer:

- a global layer (window 0): every token, as the contiguous cache does (`max_len` slots);
- a local layer of window W: at most W − 1 + `chunk` slots, the W − 1 keys before a pass (what its first query
  can still see) and the pass's own, at most `chunk` tokens. When a pass would not fit, the keys no query can
  see any more are dropped and the rest move to the front of the buffer.

Keys are rotated at their text position when they arrive, as in the contiguous cache (this is not
StreamingLLM's slot-position cache, `labkit.kvcache.sliding`): attention over what a local layer keeps is
exactly what the contiguous cache gives it, and logits agree bit for bit (a test checks it). The memory of a
local layer is capped by its window, so the cache's bytes grow with the sequence only in the global layers.

    >>> from labkit.model import ModelConfig
    >>> cfg = ModelConfig(d_model=8, n_layers=2, n_heads=2, vocab_size=10, ffn_dim=8, layer_windows=(4, 0))
    >>> cache = WindowedCache(cfg, max_len=32, chunk=4)
    >>> cache.capacities()                         # layer 0: 4 − 1 + 4 slots; layer 1 (global): 32
    [7, 32]
"""
from __future__ import annotations

import torch

from labkit import checks
from labkit.kvcache.base import KVCache, causal_mask
from labkit.kvcache.contiguous import ContiguousCache

__all__ = ["WindowedCache", "layer_capacities"]


def layer_capacities(config, max_len: int, chunk: int | None = None) -> list[int]:
    """Slots per layer of a windowed cache: `max_len` on a global layer (window 0), min(max_len, window − 1 +
    chunk) on a local one; `chunk` (the most tokens a pass adds) defaults to the smallest window."""
    windows = list(config.layer_windows) or [0] * config.n_layers
    local = [w for w in windows if w]
    chunk = (min(local) if local else max_len) if chunk is None else chunk
    checks.positive_int("chunk", chunk, why="the most tokens one pass adds")
    return [max_len if not w else min(max_len, w - 1 + chunk) for w in windows]


class WindowedCache(KVCache):
    """Per-layer buffers: every token on a global layer, the last window − 1 + `chunk` on a local one."""

    kind = "windowed"

    def __init__(self, config, *, chunk: int | None = None, **opts):
        super().__init__(config, **opts)
        self.windows = list(config.layer_windows) or [0] * config.n_layers
        self._capacities = layer_capacities(config, self.max_len, chunk)
        local = [w for w in self.windows if w]
        self.chunk = (min(local) if local else self.max_len) if chunk is None else chunk
        shape = (self.batch_size, config.n_kv_heads)
        self.keys = [torch.zeros(*shape, c, config.head_dim, dtype=self.dtype, device=self.device)
                     for c in self.capacities()]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.start = [0] * config.n_layers  # text position of slot 0, per layer
        self._len = 0
        self._mask = None

    def capacities(self) -> list[int]:
        """Slots per layer: `max_len` on a global layer, min(max_len, window − 1 + chunk) on a local one."""
        return list(self._capacities)

    @property
    def seq_len(self) -> int:
        return self._len

    @property
    def max_chunk(self) -> int:
        """The most tokens one pass may add: `chunk` (a local layer holds no more), or any while all fit."""
        return self.chunk

    def plan_chunks(self, n: int) -> list[int]:
        """One pass while every layer has room, else passes of `chunk` tokens (what `labkit.prefill` uses)."""
        if all(self._len - s + n <= c for s, c in zip(self.start, self.capacities())):
            return [n]
        return [self.chunk] * (n // self.chunk) + ([n % self.chunk] if n % self.chunk else [])

    def begin(self, n_new: int) -> torch.Tensor:
        self.check_new(n_new)
        for layer, (w, cap) in enumerate(zip(self.windows, self.capacities())):
            held = self._len - self.start[layer]
            if held + n_new <= cap:
                continue
            if n_new > self.chunk:
                raise ValueError(f"a windowed cache (chunk={self.chunk}) takes at most {self.chunk} new tokens per "
                                 f"forward pass once a local layer is full, got {n_new}; feed a long prompt in chunks "
                                 f"(labkit.prefill does this for you)")
            keep = min(held, w - 1)  # the keys the pass's first query still sees
            src = slice(held - keep, held)
            for buf in (self.keys[layer], self.values[layer]):
                buf[:, :, :keep] = buf[:, :, src].clone()
            self.start[layer] = self._len - keep
        self._n_new = n_new
        self._mask = causal_mask(n_new, self._len + n_new, self.device)  # a layer holding every token (start 0)
        return self.new_positions(self._len, n_new)

    def update(self, layer, k, v, rope):
        if layer == 0:
            self.check_kv(layer, k, v)
        slot = self._len - self.start[layer]
        end = slot + self._n_new
        self.keys[layer][:, :, slot:end] = k  # arrives rotated at its text position
        self.values[layer][:, :, slot:end] = v
        mask = self._mask if self.start[layer] == 0 else causal_mask(self._n_new, end, self.device)
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end], mask

    end = ContiguousCache.end  # the same bookkeeping: the pass's tokens committed, its mask dropped

    def reset(self) -> None:
        self._len, self.start = 0, [0] * len(self.windows)
        self._n_new = None
        self._mask = None

    def truncate(self, n: int) -> None:
        """Keep only the first `n` tokens, while every layer still holds them (a local layer dropped its oldest)."""
        if not max(self.start) <= n <= self._len:
            raise ValueError(f"n must be in [{max(self.start)}, {self._len}] (a local layer no longer holds the "
                             f"tokens before position {max(self.start)}), got {n}")
        self._len = n

    def bytes_allocated(self) -> int:
        return sum(2 * k.numel() * k.element_size() for k in self.keys)

    def bytes_used(self) -> int:
        per_token = 2 * self.batch_size * self.config.n_kv_heads * self.config.head_dim * self.keys[0].element_size()
        return per_token * sum(self._len - s for s in self.start)

    def options(self) -> dict:
        return {"max_len": self.max_len, "batch_size": self.batch_size, "chunk": self.chunk}

    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict]:
        tensors = {}
        for layer, s in enumerate(self.start):
            tensors[f"keys.{layer}"] = self.keys[layer][:, :, :self._len - s]
            tensors[f"values.{layer}"] = self.values[layer][:, :, :self._len - s]
        return tensors, {"seq_len": self._len, "start": list(self.start)}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        n, start = int(meta["seq_len"]), [int(s) for s in meta["start"]]
        if len(start) != len(self.windows) or any(n - s > c for s, c in zip(start, self.capacities())):
            raise ValueError(f"the saved state (seq_len {n}, layer starts {start}) does not fit this cache's "
                             f"capacities {self.capacities()}")
        for layer, s in enumerate(start):
            self.keys[layer][:, :, :n - s] = tensors[f"keys.{layer}"]
            self.values[layer][:, :, :n - s] = tensors[f"values.{layer}"]
        self._len, self.start = n, start
