"""The cache of a compressed-attention model: a window, one entry per finished block, the block being filled.

A compressed-attention layer (`labkit.model.compressed`, in the spirit of DeepSeek-V4's CSA)
does its own attention; this cache only keeps, per layer and batch row, what the next passes
need, in buffers sized once for `max_len` tokens:

  * the window: the last `csa_window - 1` keys (rotated) and values, `[B, n_kv_heads, w-1, head_dim]`;
  * the entries: one shared key/value vector `[n_kv_heads·head_dim]` and one index key
    `[csa_index_dim]` per finished block of `csa_block` tokens, up to max_len // m of them;
  * the pending rows: candidates, logits and index keys of the fewer than m tokens of the
    block being filled.

Which of them are filled follows from `seq_len` alone (window min(seq_len, w − 1), entries
seq_len // m, pending seq_len % m). `bytes_allocated()` counts all three: it is what the
comparison with a dense cache at equal context uses. The layer hands its new state to
`store`; it is written when the pass ends (`end`), so a pass that fails changes nothing.
Nothing can be dropped or reordered (no truncate, reorder, compact or save), and every pass
must run every layer (no early exit).

    >>> from labkit.model import ModelConfig
    >>> cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=10, ffn_dim=8,
    ...                   csa_block=4, csa_topk=2, csa_window=8, csa_index_heads=2, csa_index_dim=8)
    >>> cache = CompressedCache(cfg, max_len=64)
    >>> cache.capacities()        # window tokens, entries, pending rows
    (7, 16, 3)
"""
from __future__ import annotations

import torch

from labkit import checks
from labkit.kvcache.base import KVCache

__all__ = ["CompressedCache"]


class CompressedCache(KVCache):
    """Window + block entries + pending rows for a compressed-attention model (see the module docstring)."""

    kind = "compressed"

    def __init__(self, config, **opts):
        super().__init__(config, **opts)
        if not getattr(config, "compressed_attention", False):
            raise ValueError("the 'compressed' cache is for compressed-attention models (a config with csa_block > 0); "
                             "this model's attention is dense: use another kind, e.g. 'contiguous'")
        c, B = config, self.batch_size
        self.m = c.csa_block
        self.kv_out = c.n_kv_heads * c.head_dim
        self.row_width = 2 * self.kv_out + c.csa_index_dim  # candidate | logits | index key
        n_win, n_entries, n_pending = self.capacities()
        make = lambda *shape: torch.zeros(c.n_layers, B, *shape, dtype=self.dtype, device=self.device)  # noqa: E731
        self.win_k = make(c.n_kv_heads, n_win, c.head_dim)
        self.win_v = make(c.n_kv_heads, n_win, c.head_dim)
        self.entries = make(n_entries, self.kv_out)
        self.index_keys = make(n_entries, c.csa_index_dim)
        self.pending = make(n_pending, self.row_width)
        self._len = 0
        self._staged: dict[int, tuple] = {}

    def capacities(self) -> tuple[int, int, int]:
        """(window tokens, block entries, pending rows) the buffers hold."""
        return self.config.csa_window - 1, self.max_len // self.m, self.m - 1

    @property
    def seq_len(self) -> int:
        return self._len

    def _filled(self, n: int) -> tuple[int, int, int]:
        n_win, _, _ = self.capacities()
        return min(n, n_win), n // self.m, n % self.m

    def begin(self, n_new: int) -> torch.Tensor:
        self.check_new(n_new)
        self._n_new = n_new
        self._staged = {}
        return self.new_positions(self._len, n_new)

    def layer_state(self, layer: int):
        """(window keys, window values, pending rows, entries, index keys) of `layer`, as filled now."""
        if self._n_new is None:
            raise RuntimeError("layer_state() called outside a forward pass (begin() first)")
        w, n, p = self._filled(self._len)
        return (self.win_k[layer, :, :, :w], self.win_v[layer, :, :, :w], self.pending[layer, :, :p],
                self.entries[layer, :, :n], self.index_keys[layer, :, :n])

    def store(self, layer: int, win_k, win_v, pending, new_entries, new_index_keys) -> None:
        """The layer's new state after this pass (written at `end`): the whole window and pending rows, the new entries."""
        self._staged[layer] = (win_k, win_v, pending, new_entries, new_index_keys)

    def update(self, layer, k, v, rope):
        raise ValueError("the 'compressed' cache serves compressed-attention layers, which attend on their own; "
                         "a dense attention layer cannot use it")

    def attend(self, layer, q, k, v, rope):
        return self.update(layer, k, v, rope)

    def end(self) -> None:
        if self._n_new is None:
            raise RuntimeError("end() called without begin()")
        missing = [i for i in range(self.config.n_layers) if i not in self._staged]
        if missing:
            self.abort()
            raise ValueError(f"a pass must run every layer of a compressed-attention model (layers {missing[:4]} "
                             f"did not run: no early exit with this cache)")
        n_entries = self._len // self.m
        for layer, (win_k, win_v, pending, new_entries, new_index_keys) in self._staged.items():
            w, p, n = win_k.shape[2], pending.shape[1], new_entries.shape[1]
            self.win_k[layer, :, :, :w] = win_k
            self.win_v[layer, :, :, :w] = win_v
            self.pending[layer, :, :p] = pending
            self.entries[layer, :, n_entries:n_entries + n] = new_entries
            self.index_keys[layer, :, n_entries:n_entries + n] = new_index_keys
        self._len += self._n_new
        self._n_new, self._staged = None, {}

    def abort(self) -> None:
        self._n_new, self._staged = None, {}

    def reset(self) -> None:
        self._len, self._n_new, self._staged = 0, None, {}

    def options(self) -> dict:
        return {"max_len": self.max_len, "batch_size": self.batch_size}

    def _bytes(self, n_win: int, n_entries: int, n_pending: int) -> int:
        c = self.config
        values = n_win * 2 * self.kv_out + n_entries * (self.kv_out + c.csa_index_dim) + n_pending * self.row_width
        return c.n_layers * self.batch_size * values * self.win_k.element_size()

    def bytes_at(self, n_tokens: int) -> int:
        """Bytes the filled parts of the buffers take once `n_tokens` tokens have been seen (what `bytes_used` reports)."""
        checks.integer("n_tokens", n_tokens, 0, self.max_len)
        return self._bytes(*self._filled(n_tokens))

    def bytes_allocated(self) -> int:
        return self._bytes(*self.capacities())

    def bytes_used(self) -> int:
        return self.bytes_at(self._len)
