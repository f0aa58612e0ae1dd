"""The sliding-window KV cache with attention sinks (StreamingLLM).

Follows Xiao et al. 2024, "Efficient Streaming Language Models with Attention Sinks"
(mit-han-lab/streaming-llm, `kv_cache.py` and `pos_shift/modify_llama.py`): the cache
keeps the first `sinks` tokens (the "attention sinks" that soak up attention mass) and
the most recent `window - sinks` tokens, and evicts the middle before appending
(`evict_for_space(num_coming)`).

Positions are *cache slots*, not positions in the text: keys are stored before RoPE
and rotated by their slot (0 .. n_cached − 1) every time they are read; a new query gets
the slot it lands in. So the model never sees a position larger than the window, and
attention depends only on slot offsets. While nothing has been evicted, slots equal
positions and the cache is exactly the contiguous one.

    >>> from labkit.model import ModelConfig
    >>> cfg = ModelConfig(d_model=8, n_layers=1, n_heads=2, vocab_size=10, ffn_dim=8)
    >>> cache = SlidingCache(cfg, window=6, sinks=2)
    >>> cache.begin(5); cache.end()                     # 5 tokens: slots 0..4
    tensor([0, 1, 2, 3, 4])
    >>> cache.begin(3)                                  # evict 2 from the middle, 3 new go to slots 3..5
    tensor([3, 4, 5])
    >>> cache.end(); cache.kept_positions().tolist()    # sinks 0, 1; recent 4; new 5, 6, 7
    [0, 1, 4, 5, 6, 7]
"""
from __future__ import annotations

import torch

from labkit import checks
from labkit.kvcache.base import KVCache, causal_mask

__all__ = ["SlidingCache"]


class SlidingCache(KVCache):
    """`sinks` first tokens + the latest `window - sinks` tokens, keys stored before RoPE.

    `window` is the capacity in tokens (default `max_len`); `sinks=0` is plain window
    attention. `seq_len` counts every token seen; `n_cached` those still held.
    """

    kind = "sliding"
    rotate_new_keys = False  # keys are stored raw and rotated by their slot at every read

    def __init__(self, config, *, window: int | None = None, sinks: int = 4, **opts):
        super().__init__(config, **opts)
        window = self.max_len if window is None else window
        checks.positive_int("window", window)
        checks.integer("sinks", sinks, 0)
        if window <= sinks:
            raise ValueError(f"window must be larger than sinks (room for recent tokens), got window={window} and sinks={sinks}")
        if window > config.max_seq_len:
            raise ValueError(f"window must be at most the context window {config.max_seq_len}, got {window}")
        self.window, self.sinks = window, sinks
        shape = (config.n_layers, self.batch_size, config.n_kv_heads, window, config.head_dim)
        self.keys = torch.zeros(shape, dtype=self.dtype, device=self.device)  # NOT rotated
        self.values = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._slots = torch.arange(window, device=self.device)
        self._kept = torch.zeros(window, dtype=torch.long)  # text position of the token in each slot
        self._len = 0  # slots filled
        self._seen = 0  # tokens processed, evicted ones included
        self._mask = None

    @property
    def seq_len(self) -> int:
        return self._seen

    @property
    def n_cached(self) -> int:
        return self._len

    @property
    def max_chunk(self) -> int:
        """The most tokens one forward pass may add once the cache is full: window − sinks."""
        return self.window - self.sinks

    def plan_chunks(self, n: int, chunk: int | None = None) -> list[int]:
        """Sizes of the forward passes that feed `n` more tokens (what `labkit.prefill` uses).

        One pass while everything fits; after that, passes of `chunk` tokens (default a
        quarter of the recent window), so every token sees at least window − sinks − chunk
        earlier recent tokens besides the sinks.
        """
        if self._len + n <= self.window:
            return [n]
        chunk = chunk or max(1, self.max_chunk // 4)
        if not 1 <= chunk <= self.max_chunk:
            raise ValueError(f"chunk must be in [1, window - sinks = {self.max_chunk}], got {chunk}")
        first = min(n, self.window - self._len)  # fill the window without evicting
        sizes = [first] if first else []
        rest = n - first
        return sizes + [chunk] * (rest // chunk) + ([rest % chunk] if rest % chunk else [])

    def kept_positions(self) -> torch.Tensor:
        """Text positions of the cached tokens, in slot order: LongTensor [n_cached]."""
        return self._kept[: self._len].clone()

    def begin(self, n_new: int) -> torch.Tensor:
        if self._n_new is not None:
            raise RuntimeError("begin() called twice without end(): a forward pass is already in progress")
        checks.positive_int("n_new", n_new)
        if self._len + n_new > self.window:
            if n_new > self.max_chunk:
                raise ValueError(
                    f"a sliding cache (window={self.window}, sinks={self.sinks}) takes at most window - sinks = "
                    f"{self.max_chunk} new tokens per forward pass once full, got {n_new}; feed a long prompt in "
                    f"chunks (labkit.prefill does this for you)")
            self._evict(self.window - self.sinks - n_new)
        self._n_new = n_new
        end = self._len + n_new
        self._kept[self._len:end] = torch.arange(self._seen, self._seen + n_new)
        self._mask = causal_mask(n_new, end, self.device)
        self.pass_end = end
        return self._slots[self._len:end]

    def _evict(self, keep_recent: int) -> None:
        """Keep the sinks and the last `keep_recent` of the other cached tokens; shift them left."""
        src = slice(self._len - keep_recent, self._len)
        dst = slice(self.sinks, self.sinks + keep_recent)
        if keep_recent:
            self.keys[:, :, :, dst] = self.keys[:, :, :, src].clone()  # [L, B, H, keep_recent, D]
            self.values[:, :, :, dst] = self.values[:, :, :, src].clone()
            self._kept[dst] = self._kept[src].clone()
        self._len = self.sinks + keep_recent

    def update(self, layer, k, v, rope):
        if layer == 0:
            self.check_kv(layer, k, v)
        start, end = self._len, self._len + self._n_new
        self.keys[layer, :, :, start:end] = k
        self.values[layer, :, :, start:end] = v
        keys = rope(self.keys[layer, :, :, :end], self._slots[:end])  # every key rotated by its slot
        return keys, self.values[layer, :, :, :end], self._mask

    def end(self) -> None:
        if self._n_new is None:
            raise RuntimeError("end() called without begin()")
        self._len += self._n_new
        self._seen += self._n_new
        self._n_new = None
        self._mask = None

    def reset(self) -> None:
        self._len = self._seen = 0
        self._n_new = None
        self._mask = None

    def layer_kv(self, layer: int, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """What `layer` attends over now: rotated keys and values [B, n_kv_heads, n_cached, head_dim]."""
        return rope(self.keys[layer, :, :, : self._len], self._slots[: self._len]), self.values[layer, :, :, : self._len]

    def bytes_allocated(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()

    def bytes_used(self) -> int:
        c = self.config
        return 2 * c.n_layers * self.batch_size * c.n_kv_heads * c.head_dim * self._len * self.keys.element_size()

    # ---- checkpoints (labkit.generation.state) ----------------------------------------------

    def options(self) -> dict:
        return {"max_len": self.max_len, "batch_size": self.batch_size, "window": self.window, "sinks": self.sinks}

    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict]:
        n = self._len
        tensors = {"keys": self.keys[:, :, :, :n], "values": self.values[:, :, :, :n], "kept": self._kept[:n]}
        return tensors, {"n_cached": n, "seen": self._seen}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        n = int(meta["n_cached"])
        self.keys[:, :, :, :n] = tensors["keys"]
        self.values[:, :, :, :n] = tensors["values"]
        self._kept[:n] = tensors["kept"]
        self._len, self._seen = n, int(meta["seen"])
