"""What the budgeted eviction kinds (`h2o`, `snapkv`) share: per-head kept tokens, the attention they are scored by.

A cache with a token `budget` keeps at most that many tokens per layer and per KV head
(SnapKV: of the prompt) and drops the others for good, with no training and no change to
the model. Which tokens survive is each kind's rule, read off attention probabilities:
H2O keeps the tokens that have received the most attention so far (`labkit.kvcache.h2o`),
SnapKV the prompt tokens that the prompt's last queries look at (`labkit.kvcache.snapkv`).
What they have in common lives here:

- **Per-head selection.** Each (layer, batch row, KV head) keeps its own tokens, so two
  heads of one layer may hold different positions. They all hold the same *number* n of
  tokens, so a layer's keys are still one tensor [B, n_kv_heads, n, head_dim], the one
  `attention` function reads them unchanged and one causal mask serves every head: the n
  kept tokens are older than the pass, so every new query sees all of them, then its own
  pass causally.
- **True positions.** Keys are stored rotated at their position in the text
  (`rotate_new_keys`, as in the contiguous cache), and a new query is rotated at its own
  position `seq_len + i`, never at its slot. RoPE makes q·k depend only on the difference of
  the two positions, so moving a key to another slot changes nothing it computes: evicting
  and compacting needs no re-rotation. (The `sliding` kind renumbers positions by slot
  instead.) `kept_positions` records where each kept token came from; attention never needs it.
- **Select after the pass.** A pass attends over the kept tokens plus its own (`update`
  returns them concatenated); at `end()` its keys and values join the kept ones and only
  then does the kind choose the survivors (`select`). So a prompt is read with full
  attention before anything is evicted, as in both papers, and a pass that fails leaves
  the cache as it was.
- **Scores.** `attention_weights` gives softmax(q·kᵀ/√D), summed over the query heads that
  share a KV head: the probabilities the fused attention kernel computes and never returns.
  The output still comes from `labkit.kvcache.base.attention`; scoring outside the kernel
  costs one more q·kᵀ product per layer (the papers' code runs attention unfused for the
  same reason). The kinds see scores only through `attend` (the model's path).

Bytes: the tensors are sized to the tokens kept (new ones at each `end()`, nothing
reserved ahead), so `bytes_allocated() == bytes_used()`: keys, values, the kept positions
(int32) and the scores a kind carries from pass to pass (H2O: float32, SnapKV: none). A
pass's concatenated copies and probabilities are temporary and not counted, as the quantized
kind does not count its dequantized copies. `max_len` bounds the text's length (the
positions), `budget` the memory.
"""
from __future__ import annotations

import torch

from labkit import checks
from labkit.kvcache.base import KVCache, attention, causal_mask

__all__ = ["EvictingCache", "attention_weights", "take"]


def attention_weights(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q·kᵀ/√D) of q [B, T, H, D] over keys [B, Hkv, S, D], per KV head: float32 [B, Hkv, T, S].

    Query head h reads KV head h // g (g = H / Hkv), as in `attention`; the g probabilities
    of a group are summed, so a key's weight is the attention its KV head's queries pay it
    (between 0 and g per query). `mask`: None or bool [T, S], True where a query sees a key.
    """
    B, T, H, D = q.shape
    Hkv = keys.shape[1]
    qg = q.reshape(B, T, Hkv, H // Hkv, D).permute(0, 2, 3, 1, 4).float()  # [B, Hkv, g, T, D]
    logits = qg @ keys.float().unsqueeze(2).transpose(-1, -2) * D ** -0.5  # [B, Hkv, g, T, S]
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return logits.softmax(-1).sum(2)


def take(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """x [B, Hkv, S, ...] at the slots `keep` [B, Hkv, m] of each row and head: [B, Hkv, m, ...]."""
    index = keep.view(*keep.shape, *[1] * (x.dim() - 3)).expand(*keep.shape, *x.shape[3:])
    return x.gather(2, index)


class EvictingCache(KVCache):
    """Base of the budgeted kinds: at most `kept` tokens per layer and KV head at the end of a pass that evicts.

    Each kind names its bound for what it bounds (H2O's `budget`: the whole cache; SnapKV's `prompt_budget`:
    the prompt's part) and hands it on as `kept`, with `kept_name` and `why` for the error message. A kind
    overrides `observe` (record scores from a layer's attention) and `select` (the
    slots that survive a pass); `scores[layer]` holds what it carries from pass to pass.
    """

    def __init__(self, config, *, kept: int | None, kept_name: str, why: str, **opts):
        super().__init__(config, **opts)
        self.kept = checks.positive_int(kept_name, kept, why=why)
        self.reset()

    # ---- what a kind decides -------------------------------------------------------------

    def observe(self, layer: int, q: torch.Tensor, keys: torch.Tensor, mask) -> None:
        """See layer `layer`'s queries q [B, T, H, D] over keys [B, Hkv, n + T, D] (kept + this pass)."""

    def select(self, layer: int, n_new: int) -> torch.Tensor | None:
        """Slots to keep of the n_cached + n_new: LongTensor [B, Hkv, m], increasing; None keeps all."""
        return None

    # ---- the protocol --------------------------------------------------------------------

    @property
    def seq_len(self) -> int:
        return self._seen

    @property
    def n_cached(self) -> int:
        """Tokens each KV head of each layer holds now."""
        return self.keys[0].shape[2]

    def kept_positions(self, layer: int = 0) -> torch.Tensor:
        """Text positions of the tokens `layer` keeps, per batch row and KV head: LongTensor [B, Hkv, n_cached]."""
        return self.positions[layer].long()

    def layer_kv(self, layer: int, rope=None) -> tuple[torch.Tensor, torch.Tensor]:
        """What `layer` attends over next: keys (rotated at their true positions) and values [B, Hkv, n_cached, D]."""
        return self.keys[layer], self.values[layer]

    def begin(self, n_new: int) -> torch.Tensor:
        self.check_new(n_new)  # against max_len: the positions must stay inside the text the cache was made for
        self._n_new = n_new
        self._mask = causal_mask(n_new, self.n_cached + n_new, self.device)
        return self.new_positions(self._seen, n_new)  # true positions, not slots

    def update(self, layer, k, v, rope):
        if layer == 0:
            self.check_kv(layer, k, v)
        self._pending[layer] = (k, v)  # stored at end(), after the kind has seen the pass
        return torch.cat([self.keys[layer], k], 2), torch.cat([self.values[layer], v], 2), self._mask

    def attend(self, layer, q, k, v, rope):
        keys, values, mask = self.update(layer, k.transpose(1, 2), v.transpose(1, 2), rope)
        self.observe(layer, q, keys, mask)
        return attention(q, keys, values, mask)

    def end(self) -> None:
        if self._n_new is None:
            raise RuntimeError("end() called without begin()")
        if len(self._pending) != self.config.n_layers:
            self.abort()
            raise RuntimeError(f"the {self.kind} cache needs every layer's keys in every pass "
                               f"(early exit is not supported); the pass was dropped")
        T, (B, Hkv) = self._n_new, (self.batch_size, self.config.n_kv_heads)
        new = torch.arange(self._seen, self._seen + T, dtype=torch.int32, device=self.device).expand(B, Hkv, T)
        for layer, (k, v) in self._pending.items():
            keep = self.select(layer, T)
            keys, values = torch.cat([self.keys[layer], k], 2), torch.cat([self.values[layer], v], 2)
            positions = torch.cat([self.positions[layer], new], 2)
            if keep is not None:
                keys, values, positions = take(keys, keep), take(values, keep), take(positions, keep)
            self.keys[layer], self.values[layer], self.positions[layer] = keys, values, positions
        self._seen += T
        self.abort()

    def abort(self) -> None:
        self._n_new = self._mask = None
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> this pass's keys, values
        self._observed: dict[int, torch.Tensor] = {}  # layer -> what `observe` recorded in this pass

    def reset(self) -> None:
        c = self.config
        empty = lambda dtype, *d: torch.zeros(self.batch_size, c.n_kv_heads, 0, *d, dtype=dtype, device=self.device)  # noqa: E731
        self.keys = [empty(self.dtype, c.head_dim) for _ in range(c.n_layers)]  # [B, Hkv, n, D] each, rotated
        self.values = [empty(self.dtype, c.head_dim) for _ in range(c.n_layers)]
        self.positions = [empty(torch.int32) for _ in range(c.n_layers)]  # [B, Hkv, n]: where each kept token was
        self.scores = [empty(torch.float32) for _ in range(c.n_layers)]  # [B, Hkv, n] or empty: the kind's own
        self._seen = 0
        self.abort()

    def bytes_allocated(self) -> int:
        tensors = self.keys + self.values + self.positions + self.scores
        return sum(t.numel() * t.element_size() for t in tensors)

    def bytes_used(self) -> int:
        return self.bytes_allocated()  # sized to what is kept: nothing reserved ahead
