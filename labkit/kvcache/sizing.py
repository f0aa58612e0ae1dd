"""Equal bytes: the option each cache kind needs to hold a given share of the full cache at L tokens.

Comparing KV compression fairly means comparing at the *same memory*: a sliding window of
512 tokens and an H2O budget of 512 tokens do not take the same bytes (H2O also keeps each
token's position and accumulated score), and an int4 cache does not hold "a number of
tokens" at all. So the comparison fixes a byte target, a fraction f of what the full
(contiguous) cache of L tokens takes, and asks each kind what it can hold in that much:

    full(L) = bytes/token · L                (kv_bytes_per_token at the cache's dtype)
    target  = f · full(L)

and, counting exactly what each kind's `bytes_allocated()` counts, per layer and KV head:

| kind | bytes at L tokens | the option solved for |
|---|---|---|
| `contiguous` | kv · max_len | (the reference: max_len = L) |
| `sliding` | kv · window (preallocated) | `window` (its `sinks` inside it) |
| `h2o` | (kv + int32 position + float32 score) · min(L, budget) | `budget` |
| `snapkv` | (kv + int32 position) · (min(L − a, prompt_budget) + a) | `prompt_budget`, with `a` tokens appended after the prompt |
| `quantized` | kv(bits, group) · max_len + kv · residual | nothing: its share is what `bits` gives |
| `windowed` | kv / layers · Σ capacity of each layer (`windowed.layer_capacities`) | nothing: its windows are the model's |

(kv: `kv_bytes_per_token` at the cache's float dtype; kv(bits, group): the same for codes plus a
float16 scale and minimum per group, KIVI.) The quantized cache's share cannot be set to f: at
float32 int8 in groups of 32 is 9 / 32 of the full cache, int4 5 / 32, plus its full-precision
residual window. `equal_bytes_options` reports the share it actually reaches, with
`settable=False`. Its key scales round up to whole groups of tokens, less than half a token's
bytes. One batch row throughout (every kind's bytes scale with `batch_size` alike).

    >>> from labkit.model import ModelConfig
    >>> rows = equal_bytes_options(ModelConfig.from_name("smollm2-135m"), 2048, 0.25)
    >>> [(r["name"], r["options"]) for r in rows][:3]
    [('sliding', {'window': 512, 'sinks': 4}), ('h2o', {'budget': 504}), ('snapkv', {'prompt_budget': 508, 'obs_window': 32})]
"""
from __future__ import annotations

import math

import torch

from labkit import checks
from labkit.kvcache.memory import kv_bytes_per_token

__all__ = ["SIZED_KINDS", "held_bytes", "full_bytes", "equal_bytes_options"]

SIZED_KINDS = ("contiguous", "sliding", "h2o", "snapkv", "quantized", "windowed")
BOUND_OPTION = {"sliding": "window", "h2o": "budget", "snapkv": "prompt_budget"}  # the option that sizes each kind
INDEX_BYTES = 4  # one int32 position per kept token, layer and KV head (the eviction kinds)
SCORE_BYTES = 4  # one float32 accumulated score per kept token, layer and KV head (H2O)


def _bits(dtype: torch.dtype) -> int:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype (the cache's keys and values), got {dtype!r}")
    return 8 * torch.empty((), dtype=dtype).element_size()


def _per_token(config, kind: str, dtype: torch.dtype) -> float:
    """Bytes one held token takes in a float kind: its keys and values, plus the eviction kinds' bookkeeping."""
    kv = kv_bytes_per_token(config, bits=_bits(dtype))
    extra = {"h2o": INDEX_BYTES + SCORE_BYTES, "snapkv": INDEX_BYTES}.get(kind, 0)
    return kv + config.n_layers * config.n_kv_heads * extra


def full_bytes(config, length: int, dtype: torch.dtype = torch.float32) -> float:
    """Bytes of the contiguous cache holding `length` tokens (max_len = length): the reference."""
    checks.positive_int("length", length, why="tokens in the sequence")
    return _per_token(config, "contiguous", dtype) * length


def held_bytes(config, kind: str, options: dict, length: int, dtype: torch.dtype = torch.float32,
               appended: int = 0) -> float:
    """What `bytes_allocated()` of a `kind` cache built with `options` reports once it has seen `length` tokens.

    `options` as given to `new_cache` (`max_len` defaults to `length`); `appended`: for SnapKV,
    how many of the `length` tokens came after its prompt (they are kept on top of the budget).
    """
    checks.positive_int("length", length, why="tokens in the sequence")
    if kind not in SIZED_KINDS:
        raise ValueError(f"kind must be one of {SIZED_KINDS}, got {kind!r}")
    per = _per_token(config, kind, dtype)
    bound = BOUND_OPTION.get(kind)
    if bound is not None and bound not in options:
        raise ValueError(f"options of a {kind} cache must give {bound}= (the tokens it holds), got {options!r}")
    if kind == "contiguous":
        return per * options.get("max_len", length)
    if kind == "sliding":
        return per * options["window"]
    if kind == "h2o":
        return per * min(length, options["budget"])
    if kind == "snapkv":
        return per * (min(length - appended, options["prompt_budget"]) + appended)
    if kind == "windowed":
        from labkit.kvcache.windowed import layer_capacities

        caps = layer_capacities(config, options.get("max_len", length), options.get("chunk"))
        return per / config.n_layers * sum(caps)
    bits, group, residual = options.get("bits", 8), options.get("group_size", 32), options.get("residual", 128)
    max_len = options.get("max_len", length)
    codes = kv_bytes_per_token(config, bits=bits, group_size=group) * max_len
    key_rounding = config.n_layers * config.n_kv_heads * config.head_dim * 2 * 2 * (math.ceil(max_len / group) - max_len / group)
    return codes + key_rounding + per * residual


def equal_bytes_options(config, length: int, fraction: float, dtype: torch.dtype = torch.float32, *,
                        sinks: int = 4, appended: int = 0, bits=(8, 4), group_size: int = 32,
                        residual: int = 128) -> list[dict]:
    """The option of each kind that holds `fraction` of the full cache's bytes at `length` tokens.

    Rows {name, kind, options, target_bytes, bytes, fraction, settable}: `bytes` is what
    `held_bytes` (hence `bytes_allocated()`) gives with those options, at most `target_bytes`
    and within one held token of it for the settable kinds; `fraction` is bytes / full(L). The
    quantized rows (one per entry of `bits`) have `settable=False`: their fraction is their own.
    `sinks`: the sliding window's attention sinks (inside the window). `appended`: tokens SnapKV
    appends after its prompt within the `length` (a scored tail, generated tokens).
    """
    checks.positive_int("length", length, why="tokens in the sequence")
    checks.number("fraction", fraction, 0, 1, low_open=True, why="a share of the full cache's bytes")
    checks.integer("appended", appended, 0, length - 1, why="tokens after SnapKV's prompt")
    full = full_bytes(config, length, dtype)
    target = fraction * full
    rows = []

    def add(name, kind, options, settable=True):
        held = held_bytes(config, kind, options, length, dtype, appended if kind == "snapkv" else 0)
        rows.append({"name": name, "kind": kind, "options": options, "target_bytes": target, "bytes": held,
                     "fraction": held / full, "settable": settable})

    for kind in ("sliding", "h2o", "snapkv"):
        tokens = int(target // _per_token(config, kind, dtype))
        if kind == "sliding":
            if tokens <= sinks:
                raise ValueError(f"fraction={fraction} of {length} tokens leaves a window of {tokens} tokens, "
                                 f"not more than sinks={sinks}; raise fraction or length")
            add(kind, kind, {"window": tokens, "sinks": sinks})
        elif kind == "h2o":
            if tokens < 2:
                raise ValueError(f"fraction={fraction} of {length} tokens leaves an H2O budget of {tokens}; need 2")
            add(kind, kind, {"budget": tokens})
        else:
            prompt_budget = tokens - appended
            if prompt_budget < 2:
                raise ValueError(f"fraction={fraction} of {length} tokens with appended={appended} leaves a SnapKV "
                                 f"prompt_budget of {prompt_budget}; need 2 (raise fraction, lower appended)")
            add(kind, kind, {"prompt_budget": prompt_budget, "obs_window": min(32, prompt_budget // 2)})
    for b in bits:
        add(f"int{b}", "quantized", {"bits": b, "group_size": group_size, "residual": residual}, settable=False)
    return rows
