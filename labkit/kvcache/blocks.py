"""The one paged KV store: blocks of keys and values, and the books that say who holds which.

Follows Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving
with PagedAttention" (vLLM), with the bookkeeping of nano-vllm's `BlockManager`:

- `BlockManager`: a free list, a reference count per block and the prefix-hash table;
- `BlockTables`: per sequence, a block table (logical block i -> physical block id) and the
  tokens it has committed, on one manager; sequences can share blocks (`fork`, `adopt`);
- `BlockPool`: the memory itself, keys and values [n_layers, num_blocks, block_size,
  n_kv_heads, head_dim] (token-major: gathering a sequence's blocks gives its keys in order,
  a view away from what attention reads), with its `BlockTables`, the one `gather` and the
  one `block_bytes`.

Token t of a sequence lives in block `table[t // block_size]` at offset `t % block_size`, so
a sequence wastes at most `block_size - 1` slots. Prefix caching hashes every *full* block
together with the hash of the block before it (vLLM's `hash_block_tokens`): a new sequence
whose tokens start with the same blocks adopts them (`cached_prefix`, `adopt`), shared and
reference-counted; a block nobody holds keeps its hash on the free list until it is
allocated again, least recently freed first.

Both caches that page live on a `BlockPool`: `PagedCache` (`paged.py`, one request's view,
the `model.new_cache("paged")` kind) and `PagedBatch` (`batch.py`, the serving engine's
packed batch). Pass one pool to several caches and they share blocks.
"""
from __future__ import annotations

import hashlib
import math
from collections import deque

import torch

from labkit import checks

__all__ = ["BlockManager", "BlockTables", "BlockPool", "hash_block"]


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


class BlockTables:
    """The block table and committed length of every sequence, on one `BlockManager`.

    `reserve(key, n)` makes room for n more tokens (allocating blocks); `commit(key, n)`
    counts them as held; `free(key)` gives every block back. Invariant (tested): the
    blocks in the tables are exactly the manager's used blocks, each in one table.
    """

    def __init__(self, num_blocks: int, block_size: int):
        checks.positive_int("num_blocks", num_blocks)
        self.block_size = checks.positive_int("block_size", block_size)
        self.manager = BlockManager(num_blocks)
        self.tables: dict = {}
        self.lengths: dict = {}
        self._hashed: dict = {}  # key -> (full blocks registered, hash of the last one)

    @property
    def num_blocks(self) -> int:
        return self.manager.num_blocks

    @property
    def n_free(self) -> int:
        return self.manager.n_free

    def add(self, key) -> None:
        if key in self.tables:
            raise ValueError(f"sequence {key!r} is already in the batch")
        self.tables[key], self.lengths[key] = [], 0

    def blocks_needed(self, key, n_new: int) -> int:
        """Blocks to allocate so that sequence `key` can hold `n_new` more tokens."""
        held = len(self.tables[key]) if key in self.tables else 0
        length = self.lengths.get(key, 0)
        return max(0, math.ceil((length + n_new) / self.block_size) - held)

    def can_reserve(self, key, n_new: int) -> bool:
        return self.blocks_needed(key, n_new) <= self.n_free

    def reserve(self, key, n_new: int) -> None:
        needed = self.blocks_needed(key, n_new)
        if needed > self.n_free:
            raise ValueError(f"out of KV blocks: sequence {key!r} needs {needed} more blocks for {n_new} tokens, "
                             f"{self.n_free} of {self.num_blocks} are free")
        self.tables[key].extend(self.manager.allocate() for _ in range(needed))

    def commit(self, key, n_new: int) -> None:
        self.lengths[key] += n_new

    def truncate(self, key, length: int) -> None:
        """Keep the first `length` committed tokens of `key`: blocks past them go back (rejected drafted tokens).

        A block registered in the prefix cache is never dropped: registration covers verified tokens only."""
        bs, registered = self.block_size, self._hashed.get(key, (0, b""))[0]
        if not isinstance(length, int) or not registered * bs <= length <= self.lengths[key]:
            raise ValueError(f"length must be an integer in [{registered * bs}, {self.lengths[key]}] for sequence "
                             f"{key!r}, got {length!r}")
        table = self.tables[key]
        for block in table[math.ceil(length / bs):]:
            self.manager.decref(block)
        del table[math.ceil(length / bs):]
        self.lengths[key] = length

    def free(self, key) -> None:
        """Give back every block of `key` and forget it (a finished or preempted sequence)."""
        for block in self.tables.pop(key):
            self.manager.decref(block)
        del self.lengths[key]
        self._hashed.pop(key, None)

    # ---- prefix caching across sequences ------------------------------------------------------

    def prefix_hashes(self, tokens) -> list[bytes]:
        """The chained hashes of `tokens`' full blocks that a cached prefix may cover (all but the last token's)."""
        hashes, parent, bs = [], b"", self.block_size
        for i in range((len(tokens) - 1) // bs):
            parent = hash_block(parent, tokens[i * bs:(i + 1) * bs])
            hashes.append(parent)
        return hashes

    def cached_prefix(self, tokens, hashes: list[bytes] | None = None) -> list[int]:
        """The registered blocks holding the longest run of `tokens`' full blocks, from the start.

        At least one token is always left out, so the sequence still has a token to run (its logits
        give the next token), as vLLM does for a prompt that is cached whole. `hashes`: `prefix_hashes(tokens)`,
        if the caller keeps them (a request waiting at the head of a queue is looked up at every step).
        """
        blocks = []
        for h in self.prefix_hashes(tokens) if hashes is None else hashes:
            block = self.manager.lookup(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def fits_after(self, blocks: list[int], n_new: int) -> bool:
        """Whether a new sequence starting on cached `blocks` can reserve `n_new` more tokens: the new blocks,
        plus the cached blocks nobody holds (adopting takes them off the free list), must be free."""
        revived = sum(1 for b in blocks if self.manager.ref_count[b] == 0)
        return math.ceil((len(blocks) * self.block_size + n_new) / self.block_size) - len(blocks) + revived <= self.n_free

    def adopt(self, key, blocks: list[int]) -> int:
        """Start the new sequence `key` on cached `blocks` (from `cached_prefix`); returns the tokens they hold."""
        if self.tables.get(key):
            raise ValueError(f"sequence {key!r} already holds blocks; only a new sequence adopts a cached prefix")
        for block in blocks:
            self.manager.incref(block)
        self.tables[key] = list(blocks)
        self.lengths[key] = len(blocks) * self.block_size
        # registered blocks carry their chained hash: the chain goes on from the last one
        self._hashed[key] = (len(blocks), self.manager.block_hash[blocks[-1]] if blocks else b"")
        return self.lengths[key]

    def register_full(self, key, tokens) -> None:
        """Register every full block `key` has committed (its first `lengths[key]` tokens are `tokens`'),
        so later sequences with the same prefix can adopt it."""
        done, parent = self._hashed.get(key, (0, b""))
        bs = self.block_size
        full = min(self.lengths[key], len(tokens)) // bs
        for i in range(done, full):
            parent = hash_block(parent, tokens[i * bs:(i + 1) * bs])
            self.manager.register(self.tables[key][i], parent)
        self._hashed[key] = (max(done, full), parent)

    def fork(self, key, new_key) -> None:
        """Sequence `new_key` starts as a copy of `key` that shares every block (reference counts go up)."""
        if self.tables.get(new_key):
            raise ValueError(f"sequence {new_key!r} already holds blocks; only a new sequence is forked into")
        self.tables[new_key] = list(self.tables[key])
        for block in self.tables[new_key]:
            self.manager.incref(block)
        self.lengths[new_key] = self.lengths[key]
        if key in self._hashed:
            self._hashed[new_key] = self._hashed[key]

    def used_tokens(self) -> int:
        return sum(self.lengths.values())

    def utilisation(self) -> float:
        """Share of the slots in allocated blocks that hold a token (vLLM's measure of paged KV)."""
        slots = (self.num_blocks - self.n_free) * self.block_size
        return 1.0 if slots == 0 else self.used_tokens() / slots


class BlockPool:
    """Keys and values [n_layers, num_blocks, block_size, n_kv_heads, head_dim] and their `BlockTables`."""

    def __init__(self, config, num_blocks: int, block_size: int, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        self.tables = BlockTables(num_blocks, block_size)
        shape = (config.n_layers, num_blocks, block_size, config.n_kv_heads, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.config, self.dtype, self.device = config, dtype, torch.device(device)

    @property
    def block_size(self) -> int:
        return self.tables.block_size

    @property
    def num_blocks(self) -> int:
        return self.tables.num_blocks

    @property
    def manager(self) -> BlockManager:
        return self.tables.manager

    def block_bytes(self) -> int:
        """Bytes of one block: keys and values of `block_size` tokens in every layer."""
        return 2 * self.keys[:, 0].numel() * self.keys.element_size()

    def bytes_total(self) -> int:
        return self.num_blocks * self.block_bytes()

    def bytes_in_use(self) -> int:
        """Bytes of blocks some sequence references (a shared block counts once)."""
        return self.manager.n_used * self.block_bytes()

    def slots(self, key, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Block and offset of tokens start..start+n of sequence `key` (its blocks must be reserved)."""
        positions = torch.arange(start, start + n, device=self.device)
        table = torch.tensor(self.tables.tables[key], dtype=torch.long, device=self.device)
        return table[positions // self.block_size], positions % self.block_size

    def table_tensor(self, keys) -> torch.Tensor:
        """The block tables of `keys` as one LongTensor [S, width], short ones padded with block 0."""
        tables = [self.tables.tables[key] for key in keys]
        width = max(len(t) for t in tables)
        return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=self.device)

    @staticmethod
    def gather(store: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """Blocks of `table` [S, nb] read in order: store [num_blocks, bs, H, D] -> [S, H, nb·bs, D] (a view of one copy)."""
        S, nb = table.shape
        _, bs, H, D = store.shape
        # index_select on the flat table: one contiguous copy (indexing with the 2-D table is ~40x slower on CPU)
        return store.index_select(0, table.reshape(-1)).view(S, nb * bs, H, D).transpose(1, 2)

    def copy_on_write(self, key, length: int) -> bool:
        """Sequence `key` holds `length` tokens and is about to write into its partly filled last block:
        if another sequence shares that block, give `key` a copy of its own. Returns whether it copied."""
        bs, table = self.block_size, self.tables.tables[key]
        if length % bs == 0 or self.manager.ref_count[table[length // bs]] <= 1:
            return False
        old, new = table[length // bs], self.manager.allocate()
        self.keys[:, new] = self.keys[:, old]
        self.values[:, new] = self.values[:, old]
        self.manager.decref(old)
        table[length // bs] = new
        return True
