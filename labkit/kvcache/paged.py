"""The paged KV cache of one request: a view over the one block store (`labkit.kvcache.blocks`).

Follows Kwon et al. 2023 (vLLM's PagedAttention): keys and values live in fixed-size
blocks of a `BlockPool`, and the cache holds, per sequence of its batch, a block table
(logical block i -> physical block id) in the pool's `BlockTables`. Token t lives in block
`block_table[t // block_size]` at offset `t % block_size`, so a sequence wastes at most
`block_size - 1` slots (internal fragmentation) instead of a whole preallocated context.
The serving engine's `PagedBatch` pages over the same kind of pool, with the same books,
gather and block size arithmetic: one store, two views.

Sharing: `fork()` copies the block table and bumps the reference counts (beams, parallel
samples); writing into a block that is shared first copies it (copy-on-write). Prefix
caching hashes every *full* block together with the hash of the block before it (vLLM's
`hash_block_tokens`), so a new request whose prompt starts with the same blocks reuses
them (`reuse_prefix`). Attention reads through a pure-PyTorch gather of the table's
blocks, so it runs anywhere.

    >>> from labkit.model import ModelConfig
    >>> cfg = ModelConfig(d_model=8, n_layers=1, n_heads=2, vocab_size=10, ffn_dim=8)
    >>> cache = PagedCache(cfg, max_len=32, block_size=4)
    >>> cache.begin(6); cache.end()
    tensor([0, 1, 2, 3, 4, 5])
    >>> cache.block_tables, cache.fragmentation()       # 2 blocks for 6 tokens: 2 of 8 slots empty
    ([[0, 1]], 0.25)
"""
from __future__ import annotations

import itertools
import math

import torch

from labkit import checks
from labkit.kvcache.base import KVCache, causal_mask
from labkit.kvcache.blocks import BlockManager, BlockPool, hash_block

__all__ = ["BlockManager", "BlockPool", "PagedCache", "hash_block"]

_views = itertools.count()  # each cache's sequences are keyed (view number, row) in the pool's tables


class PagedCache(KVCache):
    """`batch_size` sequences, each a block table into a (possibly shared) `BlockPool`.

    `num_blocks` defaults to enough for `max_len` tokens per sequence; give more to fork.
    `bytes_allocated()` counts the blocks this cache's tables point to.
    """

    kind = "paged"

    def __init__(self, config, *, block_size: int = 16, num_blocks: int | None = None, pool: BlockPool | None = None, **opts):
        super().__init__(config, **opts)
        checks.positive_int("block_size", block_size)
        if num_blocks is None:
            num_blocks = math.ceil(self.max_len / block_size) * self.batch_size
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")
        if pool is not None and pool.block_size != block_size:
            raise ValueError(f"block_size {block_size} differs from the pool's {pool.block_size}")
        self.pool = pool or BlockPool(config, num_blocks, block_size, self.dtype, self.device)
        self.block_size = block_size
        view = next(_views)
        self._keys = [(view, b) for b in range(self.batch_size)]  # this cache's sequences in the pool's tables
        for key in self._keys:
            self.pool.tables.add(key)
        self._write = self._table = self._mask = None

    @property
    def block_tables(self) -> list[list[int]]:
        return [self.pool.tables.tables[key] for key in self._keys]

    @property
    def seq_len(self) -> int:
        return self.pool.tables.lengths[self._keys[0]]

    # ---- the protocol -----------------------------------------------------------------

    def begin(self, n_new: int) -> torch.Tensor:
        self.check_new(n_new)
        pool, tables, bs, start = self.pool, self.pool.tables, self.block_size, self.seq_len
        refs = pool.manager.ref_count
        copies = sum(1 for t in self.block_tables if start % bs and refs[t[start // bs]] > 1)  # copy-on-write
        needed = sum(tables.blocks_needed(key, n_new) for key in self._keys) + copies
        if needed > pool.manager.n_free:
            raise ValueError(f"out of KV blocks: {n_new} new tokens need {needed} blocks, {pool.manager.n_free} "
                             f"of {pool.num_blocks} are free; create the cache with a larger num_blocks")
        for key in self._keys:
            pool.copy_on_write(key, start)
            tables.reserve(key, n_new)
        self._n_new = n_new
        positions = self.new_positions(start, n_new)
        slots = [pool.slots(key, start, n_new) for key in self._keys]
        self._write = (torch.cat([b for b, _ in slots]), torch.cat([o for _, o in slots]))  # [B·n_new] each
        self._table = pool.table_tensor(self._keys)  # [B, n_blocks]
        self._mask = causal_mask(n_new, start + n_new, self.device)
        return positions

    def update(self, layer, k, v, rope):
        if layer == 0:
            self.check_kv(layer, k, v)
        end = self.seq_len + self._n_new
        blocks, offsets = self._write
        H, D = k.shape[1], k.shape[3]  # k arrives rotated (rotate_new_keys)
        # [B, H, n_new, D] -> [B·n_new, H, D]: one row per token, written at (block, offset)
        self.pool.keys[layer][blocks, offsets] = k.transpose(1, 2).reshape(-1, H, D)
        self.pool.values[layer][blocks, offsets] = v.transpose(1, 2).reshape(-1, H, D)
        return self._read(layer, self._table, end) + (self._mask,)

    def _read(self, layer: int, table: torch.Tensor, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of `layer` through `table`: [B, H, end, D] each (the pool's one gather)."""
        return tuple(self.pool.gather(store[layer], table)[:, :, :end] for store in (self.pool.keys, self.pool.values))

    def end(self) -> None:
        if self._n_new is None:
            raise RuntimeError("end() called without begin()")
        for key in self._keys:
            self.pool.tables.commit(key, self._n_new)
        self._n_new = self._write = self._table = self._mask = None

    def abort(self) -> None:
        self._n_new = self._write = self._table = self._mask = None

    def reset(self) -> None:
        """Give every block back to the pool (cached prefix blocks keep their hash)."""
        for key in self._keys:
            self.pool.tables.free(key)
            self.pool.tables.add(key)
        self.abort()

    release = reset

    def bytes_allocated(self) -> int:
        return sum(len(t) for t in self.block_tables) * self.pool.block_bytes()

    def bytes_used(self) -> int:
        return self.batch_size * self.seq_len * self.pool.block_bytes() // self.block_size

    def layer_kv(self, layer: int, rope=None) -> tuple[torch.Tensor, torch.Tensor]:
        """What `layer` attends over: keys (rotated) and values [B, n_kv_heads, seq_len, head_dim]."""
        if self.seq_len == 0:
            c = self.config
            empty = torch.zeros(self.batch_size, c.n_kv_heads, 0, c.head_dim, dtype=self.dtype, device=self.device)
            return empty, empty.clone()
        return self._read(layer, self.pool.table_tensor(self._keys), self.seq_len)

    # ---- sharing ----------------------------------------------------------------------

    def fork(self) -> "PagedCache":
        """A copy that shares every block (copy-on-write): `child = cache.fork()`."""
        if self._n_new is not None:
            raise RuntimeError("fork() during a forward pass")
        child = PagedCache(self.config, block_size=self.block_size, pool=self.pool, max_len=self.max_len,
                           batch_size=self.batch_size, dtype=self.dtype, device=self.device)
        for key, child_key in zip(self._keys, child._keys):
            self.pool.tables.fork(key, child_key)
        return child

    def reuse_prefix(self, ids) -> int:
        """Attach cached blocks that hold the start of `ids`; return how many tokens they cover.

        Only full blocks are shared, and at least one token is left to compute, so the
        caller runs the model on `ids[n:]`. Needs an empty cache with batch_size 1.
        """
        if self.seq_len or self.batch_size != 1:
            raise ValueError("reuse_prefix needs an empty cache with batch_size=1")
        tables = self.pool.tables
        return tables.adopt(self._keys[0], tables.cached_prefix(list(ids)))

    def register_prefix(self, ids) -> None:
        """Make this sequence's full blocks findable by `reuse_prefix`; `ids` = the tokens it holds."""
        ids = list(ids)
        if len(ids) != self.seq_len or self.batch_size != 1:
            raise ValueError(f"register_prefix needs the {self.seq_len} tokens the cache holds (batch_size 1), got {len(ids)}")
        self.pool.tables.register_full(self._keys[0], ids)
    # ---- checkpoints (labkit.generation.state) ----------------------------------------------

    def options(self) -> dict:
        return {"max_len": self.max_len, "batch_size": self.batch_size, "block_size": self.block_size,
                "num_blocks": self.pool.num_blocks}

    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict]:
        keys, values = zip(*(self.layer_kv(layer) for layer in range(self.config.n_layers)))
        return {"keys": torch.stack(keys), "values": torch.stack(values)}, {"seq_len": self.seq_len}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Write saved keys/values [L, B, H, T, D] into fresh blocks (keys are already rotated)."""
        self.reset()
        n = int(meta["seq_len"])
        if n == 0:
            return
        identity = lambda x, positions: x  # noqa: E731
        self.begin(n)
        for layer in range(self.config.n_layers):
            self.update(layer, tensors["keys"][layer], tensors["values"][layer], identity)
        self.end()
