"""Drafters: cheap guesses of the next few tokens, each behind one method, `propose`.

    tokens, q = drafter.propose(history, gamma, params, generator)

`tokens` are at most `gamma` proposed ids; `q` [len(tokens), V] are the probabilities they
were drawn with, or None when they were chosen deterministically (greedy drafts, n-gram
lookup). A drafter may keep state between calls (a KV cache); it is told nothing about what
was accepted and finds out from `history`, which always ends with the last emitted token.

- `DraftModel`: a smaller model with the same vocabulary and its own KV cache (the
  Shakespeare draft for the Shakespeare target);
- `PromptLookup`: the continuation of the latest earlier occurrence of the last n tokens
  (Saxena 2023, "prompt lookup decoding"): free, and strong when the reply quotes its input;
- `LayerSkip`: the target itself, exiting after its first k layers into its own final norm
  and LM head (self-speculation, as in Elhoushi et al. 2024 "LayerSkip", without their
  early-exit training). It drafts on the target's own KV cache: layers < k write the draft
  positions there, and the verification pass overwrites them, so no second cache is held.
"""
from __future__ import annotations

import torch

from labkit.sampling import SamplingParams, sample_next

__all__ = ["DraftModel", "PromptLookup", "LayerSkip"]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _draw(next_logits, history: list[int], gamma: int, params: SamplingParams, generator):
    """γ tokens, each from the sampler pipeline applied to `next_logits(seq)`: (tokens, q [γ, V] or None if greedy)."""
    seq, tokens, probs = list(history), [], []
    for _ in range(gamma):
        x, q = sample_next(next_logits(seq), seq, params, generator, return_probs=True)
        if q is not None:
            probs.append(q)
        tokens.append(x)
        seq.append(x)
    return tokens, (torch.stack(probs) if probs else None)


class DraftModel:
    """Draft with a small model: γ one-token forwards on its own KV cache, rolled back to what was accepted."""

    def __init__(self, model, max_len: int | None = None):
        self.model = model
        self.cache = model.new_cache(max_len=max_len or model.config.max_seq_len)
        self.tokens: list[int] = []  # what self.cache holds
        self.steps = 0  # forward passes run (for cost accounting)

    @torch.inference_mode()
    def _logits_after(self, history: list[int]) -> torch.Tensor:
        keep = min(_common_prefix(self.tokens, history), len(history) - 1)
        if keep < self.cache.seq_len:
            self.cache.truncate(keep)
        self.tokens = self.tokens[:keep]
        new = history[keep:]
        logits = self.model(torch.tensor([new], device=self.model.device), cache=self.cache, last_only=True)
        self.tokens += new
        self.steps += 1
        return logits[0, -1].float()

    def propose(self, history: list[int], gamma: int, params: SamplingParams, generator=None):
        return _draw(self._logits_after, history, gamma, params, generator)


class PromptLookup:
    """Propose the tokens that followed the latest earlier match of the last `n` tokens (n = max_ngram..1)."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.steps = 0

    def matches(self, history: list[int]):
        """Where each earlier match of the last n tokens ends (its continuation starts): longest n first, latest first."""
        for n in range(min(self.max_ngram, len(history) - 1), self.min_ngram - 1, -1):
            tail = history[-n:]
            for start in range(len(history) - n - 1, -1, -1):  # latest match first, never the tail itself
                if history[start:start + n] == tail:
                    yield start + n

    def propose(self, history: list[int], gamma: int, params: SamplingParams | None = None, generator=None):
        for end in self.matches(history):
            follow = history[end:end + gamma]
            if follow:
                return list(follow), None
        return [], None


class LayerSkip:
    """Draft with the target's first `k` layers, on the target's own KV cache (`attach`ed by the decoding loop)."""

    def __init__(self, target, k: int):
        n = target.config.n_layers
        if not isinstance(k, int) or not 1 <= k < n:
            raise ValueError(f"k must be an integer in [1, {n - 1}] (the target has {n} layers), got {k!r}")
        self.model, self.k = target, k
        self.cache = None
        self.steps = 0

    def attach(self, cache) -> None:
        """Use the target's cache, which holds every token of the history but the last."""
        if not cache.supports("truncate"):
            raise ValueError(f"LayerSkip drafts on the target's cache and rolls it back; a {cache.kind} cache cannot")
        self.cache = cache

    @torch.inference_mode()
    def propose(self, history: list[int], gamma: int, params: SamplingParams, generator=None):
        if self.cache is None:
            raise RuntimeError("LayerSkip needs the target's cache: the decoding loop calls attach(cache)")
        start = self.cache.seq_len
        if start != len(history) - 1:
            raise ValueError(f"the target's cache holds {start} tokens; the history has {len(history)} (expected one more)")
        def next_logits(seq):
            x = torch.tensor([[seq[-1]]], device=self.model.device)
            self.steps += 1
            return self.model(x, cache=self.cache, last_only=True, n_layers=self.k)[0, -1].float()

        try:
            return _draw(next_logits, history, gamma, params, generator)
        finally:
            self.cache.truncate(start)  # the verification pass writes every layer at these positions
