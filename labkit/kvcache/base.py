"""The KV cache interface every cache kind implements.

One forward pass over `n_new` tokens talks to the cache in three steps:

    positions = cache.begin(n_new)        # RoPE positions of the new queries, LongTensor [n_new]
    for layer in range(n_layers):         # inside each attention layer:
        out = cache.attend(layer, q, k, v, rope)   # [B·n_new, n_heads·head_dim]
        #   q: this pass's queries, rotated, [B, n_new, n_heads, head_dim]
        #   k, v: this pass's keys and values [B, n_new, n_kv_heads, head_dim]; the keys are
        #   rotated at `positions` when the kind says `rotate_new_keys` (the default), raw otherwise
        #   rope(x, positions) rotates x [B, H, T, head_dim] to the given positions
    cache.end()                           # commit: seq_len grows by n_new

`attend` stores the new keys and values (`update`) and runs attention over everything
the cache returns (`attention`, with the one-query GQA trick). `update(layer, k, v, rope)`
takes k, v head-major, [B, n_kv_heads, n_new, head_dim], and returns `(keys, values, mask)`:
keys and values [B, n_kv_heads, n_keys, head_dim] (keys rotated), mask None (every new
query sees every key) or bool [n_new, n_keys]. A kind overrides `attend` only when it runs
attention its own way (`PagedBatch`: each packed sequence over its own blocks).

Who rotates keys: a contiguous cache stores each key rotated once, at its absolute
position, and the model rotates the new keys together with the queries (one call); a
StreamingLLM cache (Xiao et al. 2024, `rotate_new_keys = False`) stores keys before RoPE
and rotates them by their *slot* at read time; a paged cache gathers blocks; a quantized
cache dequantizes. The attention layer only ever sees "keys to attend over", so every kind
is a drop-in.

Optional capabilities are declared here and raise NotImplementedError unless a kind has
them (`supports(name)` says which): `truncate` (roll back tokens: speculative decoding),
`compact` (keep a chosen subset of the newest tokens: tree verification), `reorder` (beam search), `state_tensors` / `load_state_tensors` (save a prefill to a file);
`plan_chunks` (the pass sizes for a long prompt) and `reuse_prefix` / `register_prefix`
(prefix blocks shared between requests) have do-nothing defaults.

Bookkeeping every kind reports: `seq_len` (tokens committed), `bytes_used()` (bytes
holding committed tokens), `bytes_allocated()` (bytes reserved), `fragmentation()`
(1 − used/allocated), `reset()` (forget everything, keep the memory).
"""
from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

Rope = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# kind name -> class; filled by subclasses that set `kind` (see __init_subclass__)
KINDS: dict[str, type["KVCache"]] = {}


class KVCache(ABC):
    """Abstract KV cache for a model with `config` (see the module docstring for the protocol)."""

    kind: str = ""
    rotate_new_keys: bool = True  # the model hands `update` keys already rotated at the pass's positions
    packed: bool = False  # many sequences packed in one row: `last_index` names each one's last token

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.kind:
            if cls.kind in KINDS and KINDS[cls.kind].__qualname__ != cls.__qualname__:
                raise TypeError(f"cache kind {cls.kind!r} is already registered by {KINDS[cls.kind].__name__}")
            KINDS[cls.kind] = cls

    def __init__(self, config, *, max_len: int | None = None, batch_size: int = 1,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        max_len = config.max_seq_len if max_len is None else max_len
        if not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.config = config
        self.max_len = max_len
        self.batch_size = batch_size
        self.dtype = dtype
        self.device = torch.device(device)
        self._n_new = None  # tokens of the forward pass in progress (between begin and end)
        self.positions_in_pass = None  # what `new_positions` made for the pass in progress
        self.pass_end = 0  # 1 + the last position of the pass in progress (a Python int: checked without a sync)

    # ---- the protocol -----------------------------------------------------------------

    @property
    @abstractmethod
    def seq_len(self) -> int:
        """Tokens committed so far (the next token's position, for a cache that never evicts)."""

    @abstractmethod
    def begin(self, n_new: int) -> torch.Tensor:
        """Start a forward pass over `n_new` tokens; return their RoPE positions, LongTensor [n_new].

        Raises ValueError when the cache cannot hold them.
        """

    @abstractmethod
    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, rope: Rope):
        """Add this step's keys/values for `layer`; return `(keys, values, mask)` to attend over."""

    @abstractmethod
    def end(self) -> None:
        """Commit the tokens of the pass started by `begin`."""

    @abstractmethod
    def reset(self) -> None:
        """Forget every token; keep the allocated memory."""

    @abstractmethod
    def bytes_allocated(self) -> int:
        """Bytes reserved for keys and values (and any scales or tables)."""

    @abstractmethod
    def bytes_used(self) -> int:
        """Bytes that hold the committed tokens."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: Rope) -> torch.Tensor:
        """Store this pass's keys and values, attend over all: q [B, T, H, D], k, v [B, T, Hkv, D] -> [B·T, H·D]."""
        keys, values, mask = self.update(layer, k.transpose(1, 2), v.transpose(1, 2), rope)
        return attention(q, keys, values, mask)

    def abort(self) -> None:
        """Drop the pass in progress (a forward that failed); committed tokens stay."""
        self._n_new = None

    # ---- optional capabilities (see the module docstring) ---------------------------------

    @classmethod
    def supports(cls, capability: str) -> bool:
        """Whether this kind implements `capability` ("truncate", "reorder", "state_tensors", ...)."""
        if capability not in _CAPABILITIES:
            raise ValueError(f"capability must be one of {_CAPABILITIES}, got {capability!r}")
        return getattr(cls, capability) is not getattr(KVCache, capability)

    def truncate(self, n: int) -> None:
        """Keep only the first `n` tokens (roll back rejected speculative tokens)."""
        raise NotImplementedError(f"the {self.kind or type(self).__name__} cache cannot drop tokens (truncate); "
                                  "use the contiguous cache")

    def compact(self, n: int, slots) -> None:
        """Keep the first `n` tokens, then the tokens at `slots` (increasing, each >= n) moved down to n, n+1, ...

        Drops every other token (the rejected branches of a verified token tree). Keys stay as
        they were rotated: the caller wrote them at the positions they move to.
        """
        raise NotImplementedError(f"the {self.kind or type(self).__name__} cache cannot keep a subset of its tokens "
                                  "(compact); use the contiguous cache")

    def plan_chunks(self, n: int) -> list[int]:
        """Sizes of the forward passes that feed `n` more tokens: one pass, unless a kind needs pieces."""
        return [n]

    def reuse_prefix(self, ids) -> int:
        """Take cached blocks holding a prefix of `ids` (an empty cache); return how many tokens they hold."""
        return 0

    def register_prefix(self, ids) -> None:
        """Make the full blocks holding `ids` findable by `reuse_prefix` (kinds that share blocks)."""

    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict]:
        """The committed state as named tensors plus metadata (what `labkit.save_state` writes)."""
        raise NotImplementedError(f"the {self.kind or type(self).__name__} cache cannot be saved to a file")

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Restore what `state_tensors` returned (into an empty cache of the same shape)."""
        raise NotImplementedError(f"the {self.kind or type(self).__name__} cache cannot be loaded from a file")

    def reorder(self, rows) -> None:
        """Make batch row i a copy of old row `rows[i]` (beam search keeps its surviving beams).

        The batch size becomes `len(rows)`; a row may be picked more than once. Kinds that
        do not support it raise NotImplementedError.
        """
        raise NotImplementedError(f"the {self.kind or type(self).__name__} cache cannot reorder its batch rows; "
                                  "use the contiguous cache")

    def new_positions(self, start: int, n_new: int) -> torch.Tensor:
        """Positions start .. start+n_new-1 for `begin` to return, kept as `self.positions_in_pass`.

        A kind that rotates its new keys at these positions hands `update`'s rope this same
        tensor: RoPE then gathers its tables once per pass for the queries and keys of every
        layer (`Rotary.at` reuses them while the same tensor comes back).
        """
        self.positions_in_pass = torch.arange(start, start + n_new, device=self.device)
        self.pass_end = start + n_new
        return self.positions_in_pass

    def check_rows(self, rows) -> torch.Tensor:
        """Validate `rows` for `reorder`: a non-empty list of row indices in [0, batch_size)."""
        if self._n_new is not None:
            raise RuntimeError("reorder() called during a forward pass (between begin() and end())")
        rows = torch.as_tensor(rows, dtype=torch.long).reshape(-1)
        if rows.numel() == 0:
            raise ValueError("rows must name at least one batch row, got none")
        lo, hi = int(rows.min()), int(rows.max())
        if lo < 0 or hi >= self.batch_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"rows must be in [0, {self.batch_size}) (the batch size), got {bad}")
        return rows.to(self.device)

    # ---- shared helpers ---------------------------------------------------------------

    def fragmentation(self) -> float:
        """Share of the allocated bytes not holding tokens: 1 − used / allocated."""
        allocated = self.bytes_allocated()
        return 0.0 if allocated == 0 else 1.0 - self.bytes_used() / allocated

    def check_new(self, n_new: int, capacity: int | None = None) -> None:
        """Validate `n_new` for `begin` against `capacity` tokens (default `max_len`)."""
        if self._n_new is not None:
            raise RuntimeError("begin() called twice without end(): a forward pass is already in progress")
        if not isinstance(n_new, int) or n_new < 1:
            raise ValueError(f"n_new must be a positive integer, got {n_new!r}")
        capacity = self.max_len if capacity is None else capacity
        if self.seq_len + n_new > capacity:
            raise ValueError(
                f"the cache holds at most {capacity} tokens: {self.seq_len} cached + {n_new} new = "
                f"{self.seq_len + n_new}; create it with a larger max_len (the model's context is "
                f"{self.config.max_seq_len})"
            )

    def check_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Validate the shapes handed to `update` (cheap; meant for the reference kinds)."""
        expected = (self.batch_size, self.config.n_kv_heads, self._n_new, self.config.head_dim)
        if self._n_new is None:
            raise RuntimeError("update() called outside begin()/end()")
        if tuple(k.shape) != expected or tuple(v.shape) != expected:
            raise ValueError(f"layer {layer}: keys/values must have shape {expected}, got {tuple(k.shape)} and {tuple(v.shape)}")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(seq_len={self.seq_len}, max_len={self.max_len}, batch_size={self.batch_size}, "
                f"dtype={self.dtype}, allocated={self.bytes_allocated() / 2**20:.1f} MiB)")


_CAPABILITIES = ("truncate", "compact", "reorder", "plan_chunks", "reuse_prefix", "register_prefix", "state_tensors",
                 "load_state_tensors")


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None,
              causal: bool = False) -> torch.Tensor:
    """softmax(q·kᵀ/√D)·v for q [B, T, H, D] over keys, values [B, Hkv, S, D]: returns [B·T, H·D].

    Query head h reads KV head h // (H / Hkv) (grouped-query attention). `mask`: None (every
    query sees every key) or bool [T, S]; `causal`: the T queries are the S keys themselves.
    One query that sees every key (a decode step) takes the GQA trick: the g = H / Hkv query
    heads of a group become g rows against one KV head, so no key or value is ever copied.
    """
    B, T, H, D = q.shape
    Hkv = keys.shape[1]
    if T == 1 and mask is None:
        out = F.scaled_dot_product_attention(q.view(B, Hkv, H // Hkv, D), keys, values)  # [B, Hkv, g, D]
        return out.reshape(B, H * D)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, is_causal=causal,
                                         enable_gqa=H != Hkv)  # [B, H, T, D]
    return out.transpose(1, 2).reshape(B * T, H * D)


@contextmanager
def forward_pass(cache, n_new: int, device=None):
    """One forward pass's talk with `cache` (the protocol above): yields the RoPE positions of the n_new
    tokens (`cache.begin`), commits them when the block ends (`cache.end`), drops the pass if it raises
    (`cache.abort`). With no cache: positions 0 .. n_new-1 and nothing to commit.
    """
    if cache is None:
        yield torch.arange(n_new, device=device)
        return
    positions = cache.begin(n_new)
    try:
        yield positions
    except BaseException:
        cache.abort()
        raise
    cache.end()


def causal_mask(n_new: int, n_keys: int, device=None) -> torch.Tensor | None:
    """Mask for `n_new` queries that are the last `n_new` of `n_keys` keys: bool [n_new, n_keys].

    Query i may see keys 0 .. n_keys − n_new + i. Returns None when n_new == 1 (it sees all).

        >>> causal_mask(2, 3).int()
        tensor([[1, 1, 0],
                [1, 1, 1]], dtype=torch.int32)
    """
    if n_new == 1:
        return None
    return torch.ones(n_new, n_keys, dtype=torch.bool, device=device).tril(diagonal=n_keys - n_new)


# ---- the registry of kinds -----------------------------------------------------------

_KIND_MODULES = ("contiguous", "sliding", "paged", "quantized", "h2o", "snapkv", "compressed", "windowed")  # modules whose classes register a kind


def kinds() -> list[str]:
    """The cache kinds available, e.g. ['contiguous', ...]."""
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name in _KIND_MODULES:
            importlib.import_module(f"labkit.kvcache.{info.name}")
    return sorted(KINDS)


def new_cache(kind: str, config, **opts) -> KVCache:
    """Build a cache of `kind` for a model with `config`; `opts` go to that kind's constructor."""
    if kind not in KINDS:
        kinds()
    if kind not in KINDS:
        raise ValueError(f"unknown cache kind {kind!r}; available kinds: {', '.join(kinds())}")
    return KINDS[kind](config, **opts)
