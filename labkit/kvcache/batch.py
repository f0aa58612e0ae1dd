"""Many sequences in one forward pass, on one pool of KV blocks: the serving engine's cache.

A server runs the requests of many users together. Each sits at its own position and
brings its own number of new tokens: one for a request that is decoding, a chunk of its
prompt for one that is being prefilled. vLLM's answer, followed here, is to *pack* the
new tokens of every sequence into one row (`ids` [1, N], N = the sum of the rows' new
tokens), so every weight matrix is read once for the whole batch, and to run attention
per sequence over that sequence's blocks (Kwon et al. 2023, PagedAttention).

    batch = PagedBatch(config, num_blocks=256, block_size=16)
    batch.add("a"); batch.add("b")
    batch.plan([("a", 5), ("b", 3)])              # a: 5 prompt tokens, b: 3
    logits = model(ids, cache=batch, last_only=True)  # ids [1, 8] -> logits [1, 2, V], one per row
    batch.plan([("a", 1), ("b", 1)])              # both decode one token: positions 5 and 3

`BlockTables` is the bookkeeping alone (which blocks each sequence holds, no tensors),
so a scheduler can plan, and be tested, without a model. It also caches prefixes across
sequences (vLLM's automatic prefix caching, nano-vllm's): every full block a sequence has
committed is registered under the hash of its tokens chained to its parent's
(`register_full`), a new sequence starts on the longest chain of registered blocks its
tokens match (`cached_prefix`, `adopt`: shared, reference-counted, never written again),
and a block nobody holds keeps its hash on the free list until it is allocated again,
least recently freed first. Attention reads through the
model's `cache.attend` hook: the decoding rows go together into one call (their keys
gathered and padded to the longest, the padding masked), each prefill chunk into its
own causal call, offset by what the sequence already holds.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from labkit.kvcache.base import KVCache, causal_mask
from labkit.kvcache.paged import BlockManager, hash_block

__all__ = ["BlockTables", "PagedBatch"]


class BlockTables:
    """The block table and committed length of every sequence, on one `BlockManager`.

    `reserve(key, n)` makes room for n more tokens (allocating blocks); `commit(key, n)`
    counts them as held; `free(key)` gives every block back. Invariant (tested): the
    blocks in the tables are exactly the manager's used blocks, each in one table.
    """

    def __init__(self, num_blocks: int, block_size: int):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.block_size = block_size
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

    def free(self, key) -> None:
        """Give back every block of `key` and forget it (a finished or preempted sequence)."""
        for block in self.tables.pop(key):
            self.manager.decref(block)
        del self.lengths[key]
        self._hashed.pop(key, None)

    # ---- prefix caching across sequences ------------------------------------------------------

    def cached_prefix(self, tokens) -> list[int]:
        """The registered blocks holding the longest run of `tokens`' full blocks, from the start.

        At least one token is always left out, so the sequence still has a token to run (its logits
        give the next token), as vLLM does for a prompt that is cached whole.
        """
        blocks, parent, bs = [], b"", self.block_size
        for i in range((len(tokens) - 1) // bs):
            parent = hash_block(parent, tokens[i * bs:(i + 1) * bs])
            block = self.manager.lookup(parent)
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

    def used_tokens(self) -> int:
        return sum(self.lengths.values())

    def utilisation(self) -> float:
        """Share of the slots in allocated blocks that hold a token (vLLM's measure of paged KV)."""
        slots = (self.num_blocks - self.n_free) * self.block_size
        return 1.0 if slots == 0 else self.used_tokens() / slots


class PagedBatch(KVCache):
    """A packed batch of sequences over one `BlockPool`: `model(ids [1, N], cache=batch)`.

    Call `plan([(key, n_new), ...])` before each forward: the rows of `ids`, in order.
    With `last_only=True` the model returns the logits of each row's last token, [1, rows, V].
    """

    packed = True

    def __init__(self, config, *, num_blocks: int, block_size: int = 16, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        super().__init__(config, max_len=config.max_seq_len, batch_size=1, dtype=dtype, device=device)
        self.tables = BlockTables(num_blocks, block_size)
        # token-major blocks [n_layers, num_blocks, block_size, n_kv_heads, head_dim]: gathering a sequence's
        # blocks gives [keys, heads, head_dim] rows in order, a view away from what attention reads (no permute copy)
        shape = (config.n_layers, num_blocks, block_size, config.n_kv_heads, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=self.device)
        self.values = torch.zeros(shape, dtype=dtype, device=self.device)
        self.block_size = block_size
        self._rows: list[tuple] | None = None
        self._pass: dict | None = None

    # ---- sequences --------------------------------------------------------------------

    def add(self, key) -> None:
        self.tables.add(key)

    def free(self, key) -> None:
        self.tables.free(key)

    def length(self, key) -> int:
        return self.tables.lengths[key]

    def plan(self, rows) -> None:
        """The sequences of the next forward pass and their new tokens: [(key, n_new), ...]."""
        rows = [(key, n) for key, n in rows]
        if not rows:
            raise ValueError("rows must name at least one (sequence, n_new) pair, got none")
        for key, n in rows:
            if key not in self.tables.tables:
                raise ValueError(f"sequence {key!r} is not in the batch; add() it first")
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"n_new of sequence {key!r} must be a positive integer, got {n!r}")
            if self.length(key) + n > self.config.max_seq_len:
                raise ValueError(f"sequence {key!r} would hold {self.length(key) + n} tokens, more than the "
                                 f"context window of {self.config.max_seq_len}")
        if len({key for key, _ in rows}) != len(rows):
            raise ValueError("each sequence may appear only once in a pass")
        self._rows = rows

    @property
    def last_index(self) -> torch.Tensor:
        """Index of each row's last token in the packed pass (what `last_only` keeps)."""
        return self._pass["last"]

    # ---- the protocol -----------------------------------------------------------------

    @property
    def seq_len(self) -> int:
        return self.tables.used_tokens()

    def begin(self, n_new: int) -> torch.Tensor:
        if self._rows is None:
            raise RuntimeError("plan() the rows of the pass before running the model")
        total = sum(n for _, n in self._rows)
        if n_new != total:
            raise ValueError(f"ids hold {n_new} tokens but the planned rows add up to {total}")
        for key, n in self._rows:
            self.tables.reserve(key, n)
        bs, dev = self.block_size, self.device
        counts = [n for _, n in self._rows]
        starts = [self.length(key) for key, _ in self._rows]  # tokens each sequence already holds
        ends = [s + n for s, n in zip(starts, counts)]
        last = torch.tensor(counts, device=dev).cumsum(0) - 1  # [S]: each row's last token in the pass
        token_start = [int(i) - n + 1 for i, n in zip(last, counts)]
        positions = torch.cat([torch.arange(s, e) for s, e in zip(starts, ends)]).to(dev)  # [N]
        tables = [self.tables.tables[key] for key, _ in self._rows]
        width = max(len(t) for t in tables)
        padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=dev)  # [S, width]
        row_of_token = torch.repeat_interleave(torch.arange(len(counts), device=dev), torch.tensor(counts, device=dev))
        p = {"write": (padded[row_of_token, positions // bs], positions % bs),  # block and slot of each new token
             "last": last, "table": padded, "prefill": [], "decode": None}
        decode = [i for i, n in enumerate(counts) if n == 1]
        if decode:  # one padded call for all decoding rows; the padding (and block 0 standing in) is masked
            keys_at = torch.arange(math.ceil(max(ends[i] for i in decode) / bs) * bs, device=dev)
            seen = keys_at[None, :] < torch.tensor([ends[i] for i in decode], device=dev)[:, None]  # [Sd, K]
            mask = torch.zeros(seen.shape, dtype=self.dtype, device=dev).masked_fill_(~seen, float("-inf"))
            p["decode"] = (torch.tensor(decode, device=dev), torch.tensor([token_start[i] for i in decode], device=dev),
                           mask[:, None, None, :])  # additive, made once per pass: every layer reuses it
        for i, n in enumerate(counts):
            if n > 1:
                p["prefill"].append((i, token_start[i], n, ends[i], causal_mask(n, ends[i], dev)))
        self._pass, self._n_new = p, n_new
        self.positions_in_pass = positions
        self.pass_end = max(ends)
        return positions

    def update(self, layer, k, v, rope):
        raise RuntimeError("a PagedBatch runs attention itself: the model calls attend(), not update()")

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope) -> torch.Tensor:
        """Store this pass's keys/values, attend each sequence over its own: q [1, N, Hq, D] -> [N, Hq·D]."""
        p = self._pass
        keys, values = self.keys[layer], self.values[layer]  # [num_blocks, bs, Hkv, D]
        H, D = k.shape[2], k.shape[3]
        blocks, offsets = p["write"]
        keys[blocks, offsets] = k[0]  # [N, Hkv, D], one row per token; keys arrive rotated (rotate_new_keys)
        values[blocks, offsets] = v[0]
        q = q.transpose(1, 2)  # [1, Hq, N, D]
        out = torch.empty_like(q)
        Hq = q.shape[1]
        if p["decode"] is not None:
            rows, tokens, mask = p["decode"]
            table = p["table"][rows][:, : mask.shape[-1] // self.block_size]  # [Sd, nb]
            kd, vd = (self._gather(store, table) for store in (keys, values))  # [Sd, Hkv, K, D]
            qd = q[0, :, tokens].transpose(0, 1).reshape(len(tokens), H, Hq // H, D)  # [Sd, Hkv, g, D]: a group's heads as rows
            od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask)  # [Sd, Hkv, g, D]
            out[0, :, tokens] = od.reshape(len(tokens), Hq, D).transpose(0, 1)
        for row, start, n, end, mask in p["prefill"]:
            table = p["table"][row: row + 1, : math.ceil(end / self.block_size)]
            kp, vp = (self._gather(store, table)[:, :, :end] for store in (keys, values))  # [1, Hkv, end, D]
            out[:, :, start:start + n] = F.scaled_dot_product_attention(
                q[:, :, start:start + n], kp, vp, attn_mask=mask, enable_gqa=Hq != H)
        return out.transpose(1, 2).reshape(-1, Hq * D)

    @staticmethod
    def _gather(store: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """Blocks of `table` [S, nb] read in order: store [num_blocks, bs, H, D] -> [S, H, nb·bs, D] (a view of one copy)."""
        S, nb = table.shape
        _, bs, H, D = store.shape
        # index_select on the flat table: one contiguous copy (indexing with the 2-D table is ~40x slower on CPU)
        return store.index_select(0, table.reshape(-1)).view(S, nb * bs, H, D).transpose(1, 2)

    def end(self) -> None:
        if self._n_new is None:
            raise RuntimeError("end() called without begin()")
        for key, n in self._rows:
            self.tables.commit(key, n)
        self.abort()

    def abort(self) -> None:
        self._n_new = self._pass = self._rows = None

    def reset(self) -> None:
        for key in list(self.tables.tables):
            self.tables.free(key)
        self.abort()

    def bytes_allocated(self) -> int:
        return (self.tables.num_blocks - self.tables.n_free) * self.block_bytes()

    def bytes_used(self) -> int:
        return self.tables.used_tokens() * self.block_bytes() // self.block_size

    def block_bytes(self) -> int:
        """Bytes of one block: keys and values of `block_size` tokens in every layer."""
        return 2 * self.keys[:, 0].numel() * self.keys.element_size()
