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

The blocks live in a `BlockPool` (`labkit.kvcache.blocks`, the one paged store, which
`PagedCache` uses too), and its `BlockTables` is the bookkeeping alone (which blocks each
sequence holds, no tensors), so a scheduler can plan, and be tested, without a model. It
also caches prefixes across sequences (vLLM's automatic prefix caching, nano-vllm's; see
`blocks.py`). Attention reads through the model's `cache.attend` hook: the decoding rows go together into one call (their keys
gathered and padded to the longest, the padding masked), each prefill chunk into its
own causal call, offset by what the sequence already holds.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from labkit.kvcache.base import KVCache, attention, causal_mask
from labkit.kvcache.blocks import BlockPool, BlockTables

__all__ = ["BlockTables", "PagedBatch"]  # BlockTables lives in blocks.py; named here for the scheduler


class PagedBatch(KVCache):
    """A packed batch of sequences over one `BlockPool`: `model(ids [1, N], cache=batch)`.

    Call `plan([(key, n_new), ...])` before each forward: the rows of `ids`, in order.
    With `last_only=True` the model returns the logits of each row's last token, [1, rows, V].
    """

    packed = True

    def __init__(self, config, *, num_blocks: int | None = None, block_size: int = 16, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", pool: BlockPool | None = None):
        super().__init__(config, max_len=config.max_seq_len, batch_size=1, dtype=dtype, device=device)
        if pool is None:
            if num_blocks is None:
                raise ValueError("give num_blocks (the pool's size) or a pool")
            pool = BlockPool(config, num_blocks, block_size, dtype, self.device)
        elif pool.block_size != block_size:
            raise ValueError(f"block_size {block_size} differs from the pool's {pool.block_size}")
        self.pool, self.tables = pool, pool.tables
        self.keys, self.values = pool.keys, pool.values  # token-major: see labkit.kvcache.blocks
        self.block_size = block_size
        self._rows: list[tuple] | None = None
        self._keep: list[int] = []
        self._pass: dict | None = None

    # ---- sequences --------------------------------------------------------------------

    def add(self, key) -> None:
        self.tables.add(key)

    def free(self, key) -> None:
        self.tables.free(key)

    def length(self, key) -> int:
        return self.tables.lengths[key]

    def export_kv(self, key) -> tuple[torch.Tensor, torch.Tensor]:
        """The committed keys (rotated) and values of sequence `key`: [n_layers, length, n_kv_heads, head_dim] each."""
        n, table = self.length(key), self.pool.table_tensor([key])
        flat = lambda store: store.index_select(1, table[0]).flatten(1, 2)[:, :n]  # noqa: E731
        return flat(self.keys), flat(self.values)

    def layer_kv(self, key, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's committed keys (rotated) and values of sequence `key`: [1, n_kv_heads, length, head_dim] each,
        a contiguous cache's layout (what a zero-copy drafting head attends over)."""
        n, table = self.length(key), self.pool.table_tensor([key])
        return tuple(self.pool.gather(store[layer], table)[:, :, :n] for store in (self.keys, self.values))

    def import_kv(self, key, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Add sequence `key` holding `keys`/`values` [n_layers, n, n_kv_heads, head_dim] (from `export_kv`,
        possibly of another batch: disaggregated prefill), as if a pass had computed them here."""
        c = self.config
        want = (c.n_layers, keys.shape[1] if keys.dim() == 4 else -1, c.n_kv_heads, c.head_dim)
        if keys.dim() != 4 or tuple(keys.shape) != want or values.shape != keys.shape:
            raise ValueError(f"keys and values must both be [n_layers, n, n_kv_heads, head_dim] = {want}, "
                             f"got {tuple(keys.shape)} and {tuple(values.shape)}")
        n = keys.shape[1]
        if n < 1 or n > c.max_seq_len:
            raise ValueError(f"the sequence must hold 1..{c.max_seq_len} tokens, got {n}")
        self.tables.add(key)
        try:
            self.tables.reserve(key, n)
        except ValueError:
            self.tables.free(key)
            raise
        blocks, offsets = self.pool.slots(key, 0, n)
        self.keys[:, blocks, offsets] = keys.to(self.dtype)
        self.values[:, blocks, offsets] = values.to(self.dtype)
        self.tables.commit(key, n)

    def plan(self, rows, logits: dict | None = None) -> None:
        """The sequences of the next forward pass and their new tokens: [(key, n_new), ...].

        `logits` {key: m}: with `last_only`, that row gives the logits of its last m tokens, not its last one
        (a speculative row: the last emitted token and its m − 1 drafted tokens, verified together)."""
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
        keep = dict(logits or {})
        for key, m in keep.items():
            n = dict(rows).get(key)
            if n is None or not isinstance(m, int) or not 1 <= m <= n:
                raise ValueError(f"logits of sequence {key!r} must be an integer in [1, its {n} new tokens], got {m!r}")
        self._rows, self._keep = rows, [keep.get(key, 1) for key, _ in rows]

    @property
    def last_index(self) -> torch.Tensor:
        """Index of each row's last token in the packed pass (what `last_only` keeps)."""
        return self._pass["last"]

    def pass_rows(self) -> list[tuple[object, int, int, int]]:
        """The running pass's rows (after `begin`): (key, position of its first new token, new tokens, logits kept)."""
        if self._pass is None:
            raise RuntimeError("pass_rows() is known between begin() and end()")
        return [(key, start, n, m) for (key, n), start, m in zip(self._rows, self._pass["starts"], self._keep)]

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
        padded = self.pool.table_tensor([key for key, _ in self._rows])  # [S, width], short tables padded with block 0
        row_of_token = torch.repeat_interleave(torch.arange(len(counts), device=dev), torch.tensor(counts, device=dev))
        if any(m > 1 for m in self._keep):  # rows that keep their last m tokens' logits
            last = torch.cat([torch.arange(int(i) - m + 1, int(i) + 1) for i, m in zip(last, self._keep)]).to(dev)
        p = {"write": (padded[row_of_token, positions // bs], positions % bs),  # block and slot of each new token
             "last": last, "starts": starts, "counts": counts, "table": padded, "prefill": [], "decode": None}
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
            kd, vd = (self.pool.gather(store, table) for store in (keys, values))  # [Sd, Hkv, K, D]
            qd = q[0, :, tokens].transpose(0, 1).reshape(len(tokens), H, Hq // H, D)  # [Sd, Hkv, g, D]: a group's heads as rows
            od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask)  # [Sd, Hkv, g, D]
            out[0, :, tokens] = od.reshape(len(tokens), Hq, D).transpose(0, 1)
        for row, start, n, end, mask in p["prefill"]:
            table = p["table"][row: row + 1, : math.ceil(end / self.block_size)]
            kp, vp = (self.pool.gather(store, table)[:, :, :end] for store in (keys, values))  # [1, Hkv, end, D]
            out[:, :, start:start + n] = F.scaled_dot_product_attention(
                q[:, :, start:start + n], kp, vp, attn_mask=mask, enable_gqa=Hq != H)
        return out.transpose(1, 2).reshape(-1, Hq * D)

    def attend_alone(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope) -> torch.Tensor:
        """`attend` with every query alone over the keys its sequence holds up to it (the batch-invariant mode).

        A query at position t of a sequence takes the one-query call over that sequence's first t + 1 keys,
        whatever the other rows of the pass, how many tokens its own row brings, or whether they are a prompt
        chunk, a decode or drafted tokens being verified: its bits depend on its keys alone (T calls, not one)."""
        p = self._pass
        keys, values = self.keys[layer], self.values[layer]
        blocks, offsets = p["write"]
        keys[blocks, offsets] = k[0]
        values[blocks, offsets] = v[0]
        out, token = [], 0
        for row, (start, n) in enumerate(zip(p["starts"], p["counts"])):
            table = p["table"][row: row + 1, : math.ceil((start + n) / self.block_size)]
            kr, vr = (self.pool.gather(store, table) for store in (keys, values))  # [1, Hkv, nb·bs, D]
            for i in range(n):
                out.append(attention(q[:, token + i: token + i + 1], kr[:, :, :start + i + 1], vr[:, :, :start + i + 1]))
            token += n
        return torch.cat(out)

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
        return self.pool.block_bytes()
