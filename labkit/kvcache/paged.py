"""The paged KV cache: fixed-size blocks, a block table per sequence, shared blocks.

Follows Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving
with PagedAttention" (vLLM), with the bookkeeping of nano-vllm's `BlockManager`: a pool
of `num_blocks` blocks of `block_size` tokens, a free list, a reference count per block
and, per sequence, a block table (logical block i -> physical block id). Token t lives
in block `block_table[t // block_size]` at offset `t % block_size`, so a sequence wastes
at most `block_size - 1` slots (internal fragmentation) instead of a whole preallocated
context.

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

import hashlib
import math
from collections import deque

import torch

from labkit.kvcache.base import KVCache, causal_mask

__all__ = ["BlockManager", "BlockPool", "PagedCache", "hash_block"]

NONE_HASH = b""  # the "parent" of block 0


def hash_block(parent: bytes, tokens) -> bytes:
    """Hash of a full block: its tokens chained to its parent block's hash (deterministic)."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(torch.as_tensor(list(tokens), dtype=torch.int64).numpy().tobytes())
    return h.digest()


class BlockManager:
    """Free list, reference counts and the prefix-hash table of `num_blocks` blocks.

    A block whose count drops to 0 goes to the back of the free list but keeps its hash,
    so a later request can still find it; `allocate` takes the front (least recently
    freed) block and forgets its hash.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.free: deque[int] = deque(range(num_blocks))
        self.ref_count = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}

    @property
    def n_free(self) -> int:
        return len(self.free)

    @property
    def n_used(self) -> int:
        return self.num_blocks - len(self.free)

    def allocate(self) -> int:
        if not self.free:
            raise ValueError(f"out of KV blocks: all {self.num_blocks} blocks are in use; create the cache with a larger num_blocks")
        block = self.free.popleft()
        if self.block_hash[block] is not None:  # evict a cached prefix block
            del self.hash_to_block[self.block_hash[block]]
            self.block_hash[block] = None
        self.ref_count[block] = 1
        return block

    def incref(self, block: int) -> None:
        if self.ref_count[block] == 0:
            self.free.remove(block)  # a cached block comes back to life
        self.ref_count[block] += 1

    def decref(self, block: int) -> None:
        if self.ref_count[block] <= 0:
            raise RuntimeError(f"block {block} is already free")
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self.free.append(block)

    def lookup(self, block_hash: bytes) -> int | None:
        return self.hash_to_block.get(block_hash)

    def register(self, block: int, block_hash: bytes) -> None:
        if block_hash not in self.hash_to_block and self.block_hash[block] is None:
            self.hash_to_block[block_hash] = block
            self.block_hash[block] = block_hash


class BlockPool:
    """The physical memory: keys and values [n_layers, num_blocks, n_kv_heads, block_size, head_dim]."""

    def __init__(self, config, num_blocks: int, block_size: int, dtype=torch.float32, device="cpu"):
        shape = (config.n_layers, num_blocks, config.n_kv_heads, block_size, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size, self.num_blocks = block_size, num_blocks
        self.manager = BlockManager(num_blocks)

    def block_bytes(self) -> int:
        return 2 * self.keys[:, 0].numel() * self.keys.element_size()

    def bytes_total(self) -> int:
        return self.num_blocks * self.block_bytes()

    def bytes_in_use(self) -> int:
        """Bytes of blocks some sequence references (a shared block counts once)."""
        return self.manager.n_used * self.block_bytes()


class PagedCache(KVCache):
    """`batch_size` sequences, each a block table into a (possibly shared) `BlockPool`.

    `num_blocks` defaults to enough for `max_len` tokens per sequence; give more to fork.
    `bytes_allocated()` counts the blocks this cache's tables point to.
    """

    kind = "paged"

    def __init__(self, config, *, block_size: int = 16, num_blocks: int | None = None, pool: BlockPool | None = None, **opts):
        super().__init__(config, **opts)
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        if num_blocks is None:
            num_blocks = math.ceil(self.max_len / block_size) * self.batch_size
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")
        if pool is not None and pool.block_size != block_size:
            raise ValueError(f"block_size {block_size} differs from the pool's {pool.block_size}")
        self.pool = pool or BlockPool(config, num_blocks, block_size, self.dtype, self.device)
        self.block_size = block_size
        self.block_tables: list[list[int]] = [[] for _ in range(self.batch_size)]
        self._hashes: list[bytes] = []  # hash chain of the full blocks registered (batch 1)
        self._len = 0
        self._write = self._table = self._mask = None

    @property
    def seq_len(self) -> int:
        return self._len

    # ---- the protocol -----------------------------------------------------------------

    def begin(self, n_new: int) -> torch.Tensor:
        self.check_new(n_new)
        bs, end = self.block_size, self._len + n_new
        n_blocks = math.ceil(end / bs)
        refs = self.pool.manager.ref_count
        copies = sum(1 for t in self.block_tables if self._len % bs and refs[t[-1]] > 1)  # copy-on-write
        needed = sum(max(0, n_blocks - len(t)) for t in self.block_tables) + copies
        if needed > self.pool.manager.n_free:
            raise ValueError(f"out of KV blocks: {n_new} new tokens need {needed} blocks, {self.pool.manager.n_free} "
                             f"of {self.pool.num_blocks} are free; create the cache with a larger num_blocks")
        for table in self.block_tables:
            if self._len % bs:
                self._copy_on_write(table)
            while len(table) < n_blocks:
                table.append(self.pool.manager.allocate())
        self._n_new = n_new
        positions = self.new_positions(self._len, n_new)
        table = torch.tensor(self.block_tables, dtype=torch.long, device=self.device)  # [B, n_blocks]
        self._write = (table[:, positions // bs].reshape(-1), (positions % bs).repeat(self.batch_size))  # [B·n_new] each
        self._table = table
        self._mask = causal_mask(n_new, end, self.device)
        return positions

    def _copy_on_write(self, table: list[int]) -> None:
        """The last block is partly filled and about to be written: if shared, copy it first."""
        manager, old = self.pool.manager, table[-1]
        if manager.ref_count[old] > 1:
            new = manager.allocate()
            self.pool.keys[:, new] = self.pool.keys[:, old]
            self.pool.values[:, new] = self.pool.values[:, old]
            manager.decref(old)
            table[-1] = new

    def update(self, layer, k, v, rope):
        if layer == 0:
            self.check_kv(layer, k, v)
        end = self._len + self._n_new
        blocks, offsets = self._write
        H, D = k.shape[1], k.shape[3]  # k arrives rotated (rotate_new_keys)
        # [B, H, n_new, D] -> [B·n_new, H, D]: one row per token, written at (block, :, offset)
        self.pool.keys[layer][blocks, :, offsets] = k.transpose(1, 2).reshape(-1, H, D)
        self.pool.values[layer][blocks, :, offsets] = v.transpose(1, 2).reshape(-1, H, D)
        return self._gather(self.pool.keys[layer], end), self._gather(self.pool.values[layer], end), self._mask

    def _gather(self, store: torch.Tensor, end: int) -> torch.Tensor:
        """Read the table's blocks in order: store [num_blocks, H, bs, D] -> [B, H, end, D]."""
        B, nb = self._table.shape
        _, H, bs, D = store.shape
        blocks = store.index_select(0, self._table.reshape(-1)).view(B, nb, H, bs, D)  # one copy (2-D indexing is far slower)
        return blocks.permute(0, 2, 1, 3, 4).reshape(B, H, nb * bs, D)[:, :, :end]

    def end(self) -> None:
        if self._n_new is None:
            raise RuntimeError("end() called without begin()")
        self._len += self._n_new
        self._n_new = self._write = self._table = self._mask = None

    def abort(self) -> None:
        self._n_new = self._write = self._table = self._mask = None

    def reset(self) -> None:
        """Give every block back to the pool (cached prefix blocks keep their hash)."""
        for table in self.block_tables:
            for block in table:
                self.pool.manager.decref(block)
            table.clear()
        self._hashes.clear()
        self._len = 0
        self.abort()

    release = reset

    def bytes_allocated(self) -> int:
        return sum(len(t) for t in self.block_tables) * self.pool.block_bytes()

    def bytes_used(self) -> int:
        return self.batch_size * self._len * self.pool.block_bytes() // self.block_size

    def layer_kv(self, layer: int, rope=None) -> tuple[torch.Tensor, torch.Tensor]:
        """What `layer` attends over: keys (rotated) and values [B, n_kv_heads, seq_len, head_dim]."""
        self._table = torch.tensor(self.block_tables, dtype=torch.long, device=self.device)
        try:
            return self._gather(self.pool.keys[layer], self._len), self._gather(self.pool.values[layer], self._len)
        finally:
            self._table = None

    # ---- sharing ----------------------------------------------------------------------

    def fork(self) -> "PagedCache":
        """A copy that shares every block (copy-on-write): `child = cache.fork()`."""
        if self._n_new is not None:
            raise RuntimeError("fork() during a forward pass")
        child = PagedCache(self.config, block_size=self.block_size, pool=self.pool, max_len=self.max_len,
                           batch_size=self.batch_size, dtype=self.dtype, device=self.device)
        child.block_tables = [list(t) for t in self.block_tables]
        for table in child.block_tables:
            for block in table:
                self.pool.manager.incref(block)
        child._len, child._hashes = self._len, list(self._hashes)
        return child

    def reuse_prefix(self, ids) -> int:
        """Attach cached blocks that hold the start of `ids`; return how many tokens they cover.

        Only full blocks are shared, and at least one token is left to compute, so the
        caller runs the model on `ids[n:]`. Needs an empty cache with batch_size 1.
        """
        ids = list(ids)
        if self._len or self.batch_size != 1:
            raise ValueError("reuse_prefix needs an empty cache with batch_size=1")
        parent, manager, bs = NONE_HASH, self.pool.manager, self.block_size
        for i in range((len(ids) - 1) // bs):
            h = hash_block(parent, ids[i * bs:(i + 1) * bs])
            block = manager.lookup(h)
            if block is None:
                break
            manager.incref(block)
            self.block_tables[0].append(block)
            self._hashes.append(h)
            parent = h
        self._len = len(self.block_tables[0]) * bs
        return self._len

    def register_prefix(self, ids) -> None:
        """Make this sequence's full blocks findable by `reuse_prefix`; `ids` = the tokens it holds."""
        ids = list(ids)
        if len(ids) != self._len or self.batch_size != 1:
            raise ValueError(f"register_prefix needs the {self._len} tokens the cache holds (batch_size 1), got {len(ids)}")
        bs, table = self.block_size, self.block_tables[0]
        for i in range(len(self._hashes), self._len // bs):
            parent = self._hashes[-1] if self._hashes else NONE_HASH
            self._hashes.append(hash_block(parent, ids[i * bs:(i + 1) * bs]))
            self.pool.manager.register(table[i], self._hashes[-1])

    # ---- checkpoints (labkit.generation.state) ----------------------------------------------

    def options(self) -> dict:
        return {"max_len": self.max_len, "batch_size": self.batch_size, "block_size": self.block_size,
                "num_blocks": self.pool.num_blocks}

    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict]:
        keys, values = zip(*(self.layer_kv(layer) for layer in range(self.config.n_layers)))
        return {"keys": torch.stack(keys), "values": torch.stack(values)}, {"seq_len": self._len}

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
