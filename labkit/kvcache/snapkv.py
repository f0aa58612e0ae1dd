"""SnapKV: after the prompt, keep the prompt tokens its last queries look at, plus those last tokens.

Follows Li, Huang, Yang, Venkitesh, Locatelli, Ye, Cai, Lewis and Chen 2024, "SnapKV: LLM
Knows What You Are Looking for Before Generation" (NeurIPS 2024; FasterDecoding/SnapKV,
`snapkv_utils.py`). The observation behind it: which prompt tokens the model will attend to
while it generates is already visible in how the *end of the prompt* (often the question
after a long document) attends to the rest, and it differs from head to head. So, once, at
the end of the prompt's forward pass, per layer and per KV head:

1. the last `obs_window` prompt queries (the observation window) vote: a prompt token's score
   is the attention they pay it, summed over the window's queries and over the query heads
   that share the KV head (`attention_weights`);
2. the scores of the tokens before the window are smoothed by a 1-D pooling over
   neighbouring positions (`pooling` "max" or "avg", odd `kernel`), so a chosen token brings
   its neighbours and a kept phrase stays whole;
3. the `prompt_budget − obs_window` best of them are kept, with the window itself; the rest of the
   prompt is evicted for good.

A prompt of at most `prompt_budget` tokens is kept whole. Defaults: `obs_window=32`, `kernel=7`,
`pooling="max"`, as in the paper's experiments. Each head keeps its own tokens
(`kept_positions`); keys keep their true RoPE positions (`labkit.kvcache.eviction`).

What is chosen here, said plainly:

- **The prompt is the first forward pass.** The vote happens at the end of the first pass
  into an empty cache, so the prompt must come in one pass (`labkit.prefill` feeds it so:
  this kind does not split prompts). Later passes, a second chat turn included, are
  appended without a vote.
- **`every_pass=True`** (not the paper's rule: a variant for comparing at equal *peak* bytes) votes at
  the end of every pass of at least `obs_window` tokens that leaves more than `prompt_budget` tokens, over all
  held and new tokens, so a prompt fed in chunks, as H2O is fed, never holds more than prompt_budget + one chunk.
  Passes shorter than the window (decode steps) are appended without a vote.
- **Generation is not compressed.** As in the paper, generated tokens are appended after
  the selected prompt tokens and nothing is evicted again: `prompt_budget` bounds the prompt's
  part of the cache, which holds `min(prompt, prompt_budget) + generated` tokens per KV head. (H2O's
  `budget` bounds its whole cache; the names differ because the bounds do.)
- **Grouped-query attention.** A KV head's vote sums the g query heads that read it, so
  the g heads of a group keep one set of tokens and the cache keeps GQA's saving (one set
  per query head would store each key g times).

`bytes_allocated()` counts the kept keys and values and their positions (int32), per layer,
batch row and KV head; the votes live only during the prompt's pass, so no scores are carried.

    >>> from labkit.model import ModelConfig
    >>> cfg = ModelConfig(d_model=4, n_layers=1, n_heads=1, vocab_size=10, ffn_dim=8)   # head_dim 4
    >>> cache = SnapKVCache(cfg, prompt_budget=5, obs_window=2, kernel=3)   # 3 prompt tokens + the window of 2
    >>> k = torch.zeros(1, 8, 1, 4); k[0, 3, 0, 0], k[0, 5, 0, 0] = 100.0, 98.0   # the window reads 3, then 5
    >>> q = torch.zeros(1, 8, 1, 4); q[0, 6:, 0, 0] = 1.0
    >>> _ = cache.begin(8); _ = cache.attend(0, q, k, k, None); cache.end()
    >>> cache.kept_positions()[0, 0].tolist()             # 3 and its neighbours (max-pooled), window 6, 7
    [2, 3, 4, 6, 7]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from labkit import checks
from labkit.kvcache.eviction import EvictingCache, attention_weights

__all__ = ["SnapKVCache"]

POOLINGS = {"max": F.max_pool1d, "avg": F.avg_pool1d}
RENAMED = {"budget": "prompt_budget", "window": "obs_window"}  # the names SnapKV took before they were its own
RENAMED_WHY = {"prompt_budget": "the bound on the prompt's part of the cache", "obs_window": "the queries that vote"}


class SnapKVCache(EvictingCache):
    """`prompt_budget` prompt tokens per layer and KV head (the `obs_window` last ones and the best voted), generation
    appended. The names `budget` and `window` are refused: H2O's `budget` bounds a whole cache and the sliding
    cache's `window` is its size, so SnapKV's bounds have names of their own."""

    kind = "snapkv"

    def __init__(self, config, *, prompt_budget: int | None = None, obs_window: int = 32, kernel: int = 7,
                 pooling: str = "max", every_pass: bool = False, **opts):
        for old, new in RENAMED.items():
            if old in opts:
                raise ValueError(f"snapkv has no {old}=; it is {new}= ({RENAMED_WHY[new]}), got {old}={opts[old]!r}")
        super().__init__(config, kept=prompt_budget, kept_name="prompt_budget",
                         why="prompt tokens kept per layer and KV head", **opts)
        self.prompt_budget = prompt_budget
        self.every_pass = checks.flag("every_pass", every_pass)
        checks.integer("obs_window", obs_window, 1, prompt_budget - 1,
                       why=f"below prompt_budget={prompt_budget}: room for voted tokens")
        checks.positive_int("kernel", kernel)
        if kernel % 2 == 0:
            raise ValueError(f"kernel must be odd (the pooling keeps every position centred), got {kernel}")
        checks.one_of("pooling", pooling, sorted(POOLINGS))
        self.obs_window, self.kernel, self.pooling = obs_window, kernel, pooling

    def observe(self, layer, q, keys, mask) -> None:
        if self.every_pass:  # H2O's feeding: vote whenever held + new tokens overflow the budget
            if keys.shape[2] <= self.prompt_budget or q.shape[1] < self.obs_window:
                return
        elif self._seen or q.shape[1] <= self.prompt_budget:  # not a prompt, or one that fits: nothing to vote on
            return
        w = self.obs_window
        # the window's queries over every prompt key, summed over the window: [B, Hkv, T]
        self._observed[layer] = attention_weights(q[:, -w:], keys, mask[-w:]).sum(2)

    def select(self, layer: int, n_new: int) -> torch.Tensor | None:
        votes = self._observed.get(layer)
        if votes is None:
            return None  # append: generation, or a prompt within the budget
        B, Hkv, T = votes.shape
        before = T - self.obs_window  # the prompt tokens that compete
        smooth = POOLINGS[self.pooling](votes[:, :, :before], self.kernel, stride=1, padding=self.kernel // 2)
        best = smooth.topk(self.prompt_budget - self.obs_window, dim=-1).indices.sort(-1).values
        window = torch.arange(before, T, device=votes.device).expand(B, Hkv, self.obs_window)
        return torch.cat([best, window], 2)
