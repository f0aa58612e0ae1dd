"""A long text through a compressed cache: how its prompt is fed, its perplexity with every token scored once.

`window_perplexities` (`evaluate`) streams a text through sliding windows; this module does
the same for every cache kind, so the kinds can be compared at equal bytes
(`labkit.kvcache.sizing`). How a long text meets a cache that evicts:

- **Streaming kinds** (`contiguous`, `quantized`, `sliding`, `h2o`): the text goes in chunks
  of `chunk` tokens. Each chunk's tokens attend to what the cache holds plus the chunk itself
  (causally), and eviction happens between chunks: H2O scores the chunk's attention and cuts
  back to its budget at the end of every pass; the sliding window makes room for the chunk
  before it (its chunks are at most `window − sinks`, as `cache_logits` does). A token thus
  sees at least the budget's worth of earlier tokens, whatever the chunk size; the chunk size
  only sets how long freshly seen tokens survive before the next eviction.
- **SnapKV** compresses once, at the end of its prompt's single pass (its kind votes only
  there), so its text is split in two: the first `len − tail` tokens are its prompt, read in
  one pass with full attention and then cut to the budget; the last `tail` tokens follow in
  chunks, appended (SnapKV keeps every token after the prompt). Its held bytes at the end are
  budget + tail tokens: `sizing.equal_bytes_options(..., appended=tail)` sizes it so.

Every token t >= 1 is scored once, from the logits the pass that contains token t − 1
produced. `tail` also selects the tokens whose perplexity is reported separately (`ppl_tail`):
the end of the text, where the cache has evicted the most and the kinds differ the most;
over the whole text the first budget-many tokens, identical for every kind, dilute the
difference.

    >>> long_perplexity(model, ids, "h2o", {"budget": 256}, tail=256)   # doctest: +SKIP
    {'kind': 'h2o', 'ppl': 21.3, 'ppl_tail': 24.0, 'bytes': 11980800, ...}
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from labkit import checks

__all__ = ["ONE_PASS_PROMPT", "votes_once", "feed", "stream_nll", "long_perplexity"]

ONE_PASS_PROMPT = {"snapkv"}  # kinds that compress their prompt once, at the end of its one pass


def _passes(cache, n: int, chunk: int, one_pass: bool = False) -> list[int]:
    """Sizes of the passes feeding n tokens: [n] when `one_pass`, else chunks (at most a window's `max_chunk`)."""
    if one_pass:
        return [n]
    step = min(chunk, getattr(cache, "max_chunk", chunk))
    return [min(step, n - i) for i in range(0, n, step)]


def votes_once(cache) -> bool:
    """Whether `cache` compresses its prompt once, at the end of one pass (SnapKV, unless `every_pass`)."""
    return cache.kind in ONE_PASS_PROMPT and not getattr(cache, "every_pass", False)


@torch.inference_mode()
def feed(model, ids, cache, chunk: int = 256, one_pass: bool | None = None, trace: dict | None = None) -> torch.Tensor:
    """Run `ids` through `cache` (the module docstring's policy); return the last position's logits [V].

    `one_pass`: True feeds every kind in one pass, False in chunks of `chunk`; None: the policy (one pass for
    a kind that votes once on its prompt). `trace`, when given, receives "passes" (their sizes) and
    "peak_tokens": the most tokens per layer and KV head any pass attended over (held + the pass's own), what
    the cache's memory peaks at while the prompt goes in.
    """
    checks.positive_int("chunk", chunk, why="tokens per forward pass")
    x = torch.as_tensor(list(ids)).reshape(1, -1)
    start, logits, peak = 0, None, 0
    if one_pass is None:
        one_pass = votes_once(cache) and cache.seq_len == 0  # a prompt SnapKV compresses
    sizes = _passes(cache, x.shape[1], chunk, one_pass)
    cap = getattr(cache, "window", None) if cache.kind == "sliding" else None  # it makes room before a chunk
    for n in sizes:
        held = int(getattr(cache, "n_cached", cache.seq_len)) + n
        peak = max(peak, held if cap is None else min(held, cap))
        logits = model(x[:, start:start + n], cache=cache, last_only=True)
        start += n
    if trace is not None:
        trace.update(passes=sizes, peak_tokens=peak)
    return logits[0, -1].float()


def _token_nll(logits: torch.Tensor, targets: torch.Tensor, rows: int = 1024) -> torch.Tensor:
    """−log p(target) for logits [T, V] and targets [T], `rows` at a time (no [T, V] log-softmax kept)."""
    return torch.cat([F.cross_entropy(logits[i:i + rows].float(), targets[i:i + rows], reduction="none")
                      for i in range(0, len(targets), rows)])


@torch.inference_mode()
def stream_nll(model, ids, cache, chunk: int = 256, prompt: int = 0) -> torch.Tensor:
    """−log p(ids[t] | what the cache holds) for t = 1 .. T − 1: float32 [T − 1], every token scored once.

    `prompt` tokens go first in one pass (SnapKV's prompt), the rest in passes of `chunk`
    tokens (at most a sliding window's `max_chunk`).
    """
    checks.positive_int("chunk", chunk, why="tokens per forward pass")
    x = torch.as_tensor(list(ids)).reshape(1, -1)
    T = x.shape[1]
    if T < 2:
        raise ValueError(f"ids must hold at least 2 tokens to score a prediction, got {T}")
    if not isinstance(prompt, int) or not 0 <= prompt < T:
        raise ValueError(f"prompt must be an integer in [0, {T}) (tokens read in the first pass), got {prompt!r}")
    sizes = ([prompt] if prompt else []) + _passes(cache, T - prompt, chunk)
    out, start = [], 0
    for n in sizes:
        logits = model(x[:, start:start + n], cache=cache)[0]  # [n, V]: predictions of tokens start+1 .. start+n
        stop = min(start + n, T - 1)  # the last token predicts nothing in the text
        out.append(_token_nll(logits[:stop - start], x[0, start + 1:stop + 1]))
        start += n
    return torch.cat(out)


def long_perplexity(model, ids, kind: str, options: dict | None = None, chunk: int = 256, tail: int = 256,
                    one_pass: bool | None = None) -> dict:
    """Perplexity of `ids` through a new `kind` cache built with `options` (module docstring's policy).

    `one_pass`: True reads all but the tail in one pass (as SnapKV's prompt) for any kind, False feeds every
    kind in chunks; None: the policy.
    Returns {kind, options, ppl (every token), ppl_tail (the last `tail`), bytes (`bytes_allocated()`
    at the end), bytes_per_token (bytes / len(ids)), held (tokens held per layer and KV head)}.
    """
    ids = list(ids)
    if not isinstance(tail, int) or not 1 <= tail < len(ids):
        raise ValueError(f"tail must be an integer in [1, {len(ids) - 1}] (tokens scored at the end), got {tail!r}")
    options = dict(options or {})
    options.setdefault("max_len", len(ids))
    cache = model.new_cache(kind, **options)
    if one_pass is None:
        one_pass = kind in ONE_PASS_PROMPT and not options.get("every_pass")
    prompt = len(ids) - tail if one_pass else 0
    nll = stream_nll(model, ids, cache, chunk, prompt)
    held = getattr(cache, "n_cached", cache.seq_len)
    return {"kind": kind, "options": {k: v for k, v in options.items() if k != "max_len"},
            "ppl": math.exp(float(nll.mean())), "ppl_tail": math.exp(float(nll[-tail:].mean())),
            "bytes": cache.bytes_allocated(), "bytes_per_token": cache.bytes_allocated() / len(ids), "held": held}
