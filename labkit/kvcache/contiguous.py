"""The contiguous KV cache: one preallocated buffer per layer, written in place.

As in gpt-fast's `KVCache`: keys and values live in `[B, n_kv_heads, max_len, head_dim]`
buffers allocated once; token t is written at slot t. Keys are rotated once, at their
absolute position, when they arrive, and never touched again, so a decode step costs
one small copy per layer and returns views (no allocation, no re-rotation). The model
hands over keys already rotated (`rotate_new_keys`), so a step's update is two
`index_copy_` calls and two slices.

    >>> from labkit.model import ModelConfig
    >>> cfg = ModelConfig(d_model=8, n_layers=1, n_heads=2, vocab_size=10, ffn_dim=8)
    >>> cache = ContiguousCache(cfg, max_len=4)
    >>> cache.begin(3)
    tensor([0, 1, 2])
"""
from __future__ import annotations

import torch

from labkit.kvcache.base import KVCache, causal_mask


class ContiguousCache(KVCache):
    """Preallocated `[n_layers, B, n_kv_heads, max_len, head_dim]` key and value buffers."""

    kind = "contiguous"

    def __init__(self, config, **opts):
        super().__init__(config, **opts)
        shape = (config.n_layers, self.batch_size, config.n_kv_heads, self.max_len, config.head_dim)
        self.keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.values = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._views()
        self._len = 0
        self._mask = None

    def _views(self) -> None:
        """One [B, n_kv_heads, max_len, head_dim] view per layer (indexing the 5-D buffers costs a call per step)."""
        self._layers = [(self.keys[i], self.values[i]) for i in range(self.config.n_layers)]

    def layer_buffers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values), views [B, n_kv_heads, max_len, head_dim] written in place (a compiled step's input)."""
        return self._layers

    @property
    def seq_len(self) -> int:
        return self._len

    def begin(self, n_new: int) -> torch.Tensor:
        self.check_new(n_new)
        self._n_new = n_new
        end = self._len + n_new
        self._mask = causal_mask(n_new, end, self.device)  # None for a single decode token
        return self.new_positions(self._len, n_new)

    def update(self, layer, k, v, rope):
        if layer == 0:
            self.check_kv(layer, k, v)
        # [B, n_kv_heads, max_len, head_dim] each: views kept from the start, or fresh ones when autograd records
        keys, values = (self.keys[layer], self.values[layer]) if torch.is_grad_enabled() else self._layers[layer]
        keys.index_copy_(2, self.positions_in_pass, k)  # slots = positions; keys arrive rotated, stored rotated
        values.index_copy_(2, self.positions_in_pass, v)
        end = self.pass_end
        return keys[:, :, :end], values[:, :, :end], self._mask

    def end(self) -> None:
        if self._n_new is None:
            raise RuntimeError("end() called without begin()")
        self._len += self._n_new
        self._n_new = None
        self._mask = None

    def reset(self) -> None:
        self._len = 0
        self._n_new = None
        self._mask = None

    def reorder(self, rows) -> None:
        rows = self.check_rows(rows)
        self.keys = self.keys.index_select(1, rows)
        self.values = self.values.index_select(1, rows)
        self._views()
        self.batch_size = rows.numel()

    def truncate(self, n: int) -> None:
        """Keep only the first `n` tokens (e.g. to roll back rejected speculative tokens)."""
        if not 0 <= n <= self._len:
            raise ValueError(f"n must be in [0, {self._len}], got {n}")
        self._len = n

    def compact(self, n: int, slots) -> None:
        """Keep tokens 0..n-1 and those at `slots` (increasing, in [n, seq_len)), moved to n, n+1, ..."""
        slots = [int(s) for s in slots]
        if self._n_new is not None:
            raise RuntimeError("compact() called during a forward pass (between begin() and end())")
        if not 0 <= n <= self._len:
            raise ValueError(f"n must be in [0, {self._len}], got {n}")
        if any(not n <= s < self._len for s in slots) or any(a >= b for a, b in zip(slots, slots[1:])):
            raise ValueError(f"slots must increase and lie in [{n}, {self._len}), got {slots}")
        if slots != list(range(n, n + len(slots))):  # index_select copies, so no slot is overwritten before it is read
            src = torch.tensor(slots, device=self.device)
            dst = torch.arange(n, n + len(slots), device=self.device)
            for buf in (self.keys, self.values):
                buf.index_copy_(3, dst, buf.index_select(3, src))
        self._len = n + len(slots)

    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict]:
        n = self._len  # rotated keys and values at slots 0..n-1
        return {"keys": self.keys[:, :, :, :n], "values": self.values[:, :, :, :n]}, {"seq_len": n}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        n = int(meta["seq_len"])
        if n > self.max_len:
            raise ValueError(f"the saved state holds {n} tokens, more than this cache's max_len={self.max_len}")
        self.keys[:, :, :, :n] = tensors["keys"]
        self.values[:, :, :, :n] = tensors["values"]
        self._len = n

    def options(self) -> dict:
        return {"max_len": self.max_len, "batch_size": self.batch_size}

    def bytes_allocated(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()

    def bytes_used(self) -> int:
        per_token = 2 * self.config.n_layers * self.batch_size * self.config.n_kv_heads * self.config.head_dim
        return per_token * self._len * self.keys.element_size()
