"""H2O: keep the heavy hitters (the tokens that received the most attention) and the most recent tokens.

Follows Zhang, Sheng, Zhou, Chen, Zheng, Cai, Song, Tian, Ré, Barrett, Wang and Chen 2023,
"H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models"
(NeurIPS 2023; FMInference/H2O). The observation behind it: the attention a token
receives, summed over the queries that have read it, is concentrated on a few tokens (the
"heavy hitters"), and those few matter most for what the model writes next. So, with room for
`budget` tokens per layer and KV head:

1. every query adds its attention probabilities to the score of each token it sees
   (the score of a token is a column sum of the attention matrix, over every query so far);
2. the `recent` newest tokens are always kept (the model's local context);
3. of the older tokens, the `budget − recent − sinks` with the largest score are kept, and
   the rest are evicted for good; their scores go with them.

The budget splits half and half by default, as in the paper's experiments: `recent` =
⌈budget / 2⌉ recent tokens, the other half heavy hitters. `sinks` (default 0; not in the
paper) keeps the first tokens whatever their score, as StreamingLLM's attention sinks
(`labkit.kvcache.sliding`); they count in the budget. The choice is made per layer, per
batch row and per KV head: two heads keep different tokens (`kept_positions`).

What is approximated or chosen here, said plainly:

- **Grouped-query attention.** The paper's models give each query head its own keys; here
  the g query heads of a group share a KV head, so a token is kept or evicted for all g at
  once, and its score sums their probabilities (`attention_weights`).
- **The prompt.** The prompt is read with full attention; at its end its tokens' scores are
  the column sums of its causal attention matrix, then the cache is cut to the budget by the
  rule above. A token near the start has been read by more queries than one near the end,
  so the accumulated score leans toward early tokens: a bias of the paper's score itself.
- **Several tokens a pass.** The paper evicts one token per generated token (the greedy
  step of its analysis); a pass of several tokens evicts as many as needed at once, by the same
  ranking. With one token per pass the two are the same.
- **Positions.** Keys keep their true RoPE positions and new queries theirs
  (`labkit.kvcache.eviction`), so an evicted cache reads like a contiguous cache with holes.

`bytes_allocated()` counts the kept keys and values, their positions (int32) and their scores
(float32), per layer, batch row and KV head: the scores are state H2O must carry.

    >>> from labkit.model import ModelConfig
    >>> cfg = ModelConfig(d_model=4, n_layers=1, n_heads=1, vocab_size=10, ffn_dim=8)   # head_dim 4
    >>> cache = H2OCache(cfg, budget=4)                     # 2 heavy hitters + 2 recent tokens
    >>> k = torch.zeros(1, 6, 1, 4); k[0, 2, 0, 0] = 100.0  # token 2's key: what every query looks for
    >>> q = torch.zeros(1, 6, 1, 4); q[..., 0] = 1.0
    >>> _ = cache.begin(6); _ = cache.attend(0, q, k, k, None); cache.end()
    >>> cache.scores[0][0, 0].round(decimals=3).tolist()     # token 0 (all of query 0, half of query 1), token 2
    [1.5, 4.0, 0.0, 0.0]
    >>> cache.kept_positions()[0, 0].tolist()                # heavy hitters 0 and 2, recent 4 and 5
    [0, 2, 4, 5]
"""
from __future__ import annotations

import torch

from labkit import checks
from labkit.kvcache.eviction import EvictingCache, attention_weights, take

__all__ = ["H2OCache"]


class H2OCache(EvictingCache):
    """`budget` tokens per layer and KV head: `sinks` first tokens, `recent` newest, the rest heavy hitters.

    `recent` defaults to ⌈budget / 2⌉ (the paper's half/half split), `sinks` to 0.
    `scores[layer]` is each kept token's accumulated attention, float32 [B, n_kv_heads, n_cached].
    """

    kind = "h2o"

    def __init__(self, config, *, budget: int | None = None, recent: int | None = None, sinks: int = 0, **opts):
        super().__init__(config, kept=budget, kept_name="budget", why="tokens kept per layer and KV head", **opts)
        self.budget = budget
        recent = budget - budget // 2 if recent is None else recent
        checks.integer("sinks", sinks, 0, budget - 1, why=f"budget={budget} leaves room for a recent token")
        checks.integer("recent", recent, 1, budget - sinks, why=f"budget - sinks, with budget={budget}, sinks={sinks}")
        self.recent, self.sinks = recent, sinks
        self.heavy = budget - recent - sinks

    def observe(self, layer, q, keys, mask) -> None:
        # each token's share of this pass's attention: column sums over the pass's queries, [B, Hkv, n + T]
        self._observed[layer] = attention_weights(q, keys, mask).sum(2)

    def select(self, layer: int, n_new: int) -> torch.Tensor | None:
        old = self.scores[layer]
        B, Hkv, n = old.shape
        scores = torch.cat([old, old.new_zeros(B, Hkv, n_new)], 2)  # new tokens start at 0
        if layer in self._observed:
            scores = scores + self._observed[layer]
        S = n + n_new
        if S <= self.budget:
            self.scores[layer] = scores
            return None
        older = scores[:, :, self.sinks:S - self.recent]  # the candidates: neither a sink nor recent
        heavy = older.topk(self.heavy, dim=-1).indices.sort(-1).values + self.sinks
        slots = lambda a, b: torch.arange(a, b, device=scores.device).expand(B, Hkv, b - a)  # noqa: E731
        keep = torch.cat([slots(0, self.sinks), heavy, slots(S - self.recent, S)], 2)
        self.scores[layer] = take(scores, keep)
        return keep
