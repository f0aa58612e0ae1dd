"""A trained variant against the dense target: quality on the held-out plays, KV bytes, decode cost.

The lab trains `shakespeare-csa` (compressed sparse attention, `labkit.model.compressed`) with
the dense target's recipe: the same tokens in the same order, the same steps and learning
rates, parameters within 1 %. `compare_models` puts the two side by side:

- **quality**: validation loss and bits per byte on fixed windows of the held-out plays at each
  context a model can take (`val_metrics`, the windows the training record uses at 256 tokens);
- **KV bytes**: what each model's own cache allocates for one sequence of n tokens
  (`bytes_allocated`: window, entries, index keys and pending rows all counted), per token;
- **decode cost**: the median greedy step at each position, all models and positions
  interleaved step by step (`labkit.generation.latency.time_steps`). A model is timed past its
  context window on a copy with a longer RoPE table: the step's cost is real, its output is not
  meant to be read there.

    >>> out = compare_models({"dense": dense, "csa": csa}, tok, contexts=[256], positions=[256])  # doctest: +SKIP
"""
from __future__ import annotations

import torch

from labkit import checks
from labkit.data import corpus
from labkit.generation.latency import filler_ids, time_steps
from labkit.model.transformer import Transformer
from labkit.train.batches import encode_split
from labkit.train.run import val_metrics

__all__ = ["kv_bytes_at", "stretched", "decode_cost", "compare_models"]

VAL_TOKENS = 8192  # tokens of held-out text scored at every context (32 windows of 256, 8 of 1,024)


def kv_bytes_at(model, n_tokens: int) -> int:
    """Bytes the model's own cache allocates for one sequence of `n_tokens` (a dense model: contiguous)."""
    checks.positive_int("n_tokens", n_tokens)
    return model.new_cache(max_len=n_tokens).bytes_allocated()


def stretched(model, max_seq_len: int):
    """The same weights with a context window of `max_seq_len` (a longer RoPE table): for timing only."""
    if max_seq_len <= model.config.max_seq_len:
        return model
    copy = Transformer(model.config.replace(max_seq_len=max_seq_len)).to(model.dtype)
    copy.load_state_dict(model.state_dict())
    return copy.eval().requires_grad_(False)


@torch.inference_mode()
def decode_cost(models: dict, positions, steps: int = 7, chunk: int = 512) -> list[dict]:
    """Median decode-step seconds of each model at each position, interleaved: rows {name, position, itl_s, stretched}."""
    positions = list(positions)
    if not positions or any(not isinstance(p, int) or p < 1 for p in positions):
        raise ValueError(f"positions must be a non-empty list of positive integers, got {positions!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    runs, meta = [], []
    for name, model in models.items():
        need = max(positions) + steps + 2
        timed = stretched(model, need)
        for p in positions:
            cache = timed.new_cache(max_len=p + steps + 2)
            ids = torch.tensor([filler_ids(p, model.config.vocab_size)])
            for i in range(0, p, chunk):
                logits = timed(ids[:, i:i + chunk], cache=cache, last_only=True)
            token = logits[:, -1].argmax(-1, keepdim=True)
            timed.step(token, cache=cache)  # warm-up
            runs.append([timed, cache, token])
            meta.append((name, p, p + steps + 1 > model.config.max_seq_len))
    times = time_steps(None, runs, steps)
    return [{"name": n, "position": p, "itl_s": t, "stretched": s} for (n, p, s), t in zip(meta, times)]


def compare_models(models: dict, tok, contexts=(256, 512, 1024), positions=(256, 1024, 4096), steps: int = 7,
                   kv_tokens: int = 1024) -> dict:
    """Quality at each context, KV bytes at `kv_tokens`, decode cost by position, for {name: model}.

    Returns {quality: [{name, context, val_loss, val_bits_per_byte}] (contexts past a model's
    window are left out), kv: [{name, n_tokens, bytes, bytes_per_token, share}] (share of the
    first model's bytes), decode: rows of `decode_cost` (none when `positions` is empty)}.
    """
    if not models:
        raise ValueError("models must name at least one model")
    val_ids = encode_split(tok, corpus.load_text("val"))
    quality = []
    for name, model in models.items():
        for n in contexts:
            if n <= model.config.max_seq_len:
                q = val_metrics(model, tok, val_ids, n, VAL_TOKENS // n)
                quality.append({"name": name, "context": n, "val_loss": q["val_loss"],
                                "val_bits_per_byte": q["val_bits_per_byte"]})
    first = None
    kv = []
    for name, model in models.items():
        b = kv_bytes_at(model, kv_tokens)
        first = first or b
        kv.append({"name": name, "n_tokens": kv_tokens, "bytes": b, "bytes_per_token": b / kv_tokens, "share": b / first})
    return {"quality": quality, "kv": kv, "decode": decode_cost(models, positions, steps) if positions else []}
