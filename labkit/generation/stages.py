"""The two stages of generation: `prefill` builds the KV cache, `decode` extends it one token a step.

The split follows gpt-fast's `generate.py` (`prefill()`, `decode_one_token()`,
`decode_n_tokens()`), which makes the two stages timeable on their own. Sampling comes
from `labkit.sampling`; the state between the stages, and its file, from
`labkit.generation.state`.

    >>> state = prefill(model, tok.encode("Once upon a time"))                     # doctest: +SKIP
    >>> tok.decode(decode(model, state, 8))                                        # doctest: +SKIP
"""
from __future__ import annotations

from pathlib import Path

import torch

from labkit.generation.state import PrefillState, model_info, save_state
from labkit.sampling.pipeline import SamplingParams, sample_next

__all__ = ["prefill", "decode", "decode_with_checkpoints", "DEFAULT_HEADROOM"]

DEFAULT_HEADROOM = 512  # cache slots `prefill` reserves beyond the prompt when max_len is not given


def _as_ids(ids) -> torch.Tensor:
    if isinstance(ids, torch.Tensor):
        t = ids.reshape(1, -1) if ids.dim() == 1 else ids
    else:
        t = torch.tensor([list(ids)], dtype=torch.long)
    if t.dim() != 2 or t.shape[0] != 1 or t.shape[1] == 0:
        raise ValueError(f"ids must be a non-empty sequence of token ids (batch 1), got shape {tuple(t.shape)}")
    return t.long()


def _params(params: SamplingParams | None, kwargs: dict) -> SamplingParams:
    return SamplingParams.from_kwargs(params, **kwargs)


@torch.inference_mode()
def prefill(model, ids, cache="contiguous", max_len: int | None = None, seed: int | None = 0) -> PrefillState:
    """Stage 1: run the prompt `ids` through the model, filling a KV cache.

    `cache` is a kind name (a new cache of `max_len` slots, default prompt + 512), a
    cache object, or None: no KV cache, so every decode step runs the whole sequence
    again (the cost chapter 04 measures). A cache may ask for the prompt in pieces (`cache.plan_chunks`: a
    sliding window longer prompts than it holds) or reuse cached prefix blocks
    (`cache.reuse_prefix`: the paged cache). Returns the `PrefillState` that `decode`
    continues from.
    """
    x = _as_ids(ids)
    if cache is None:  # no KV cache: every decode step runs the whole sequence again
        logits = model(x.to(model.device), last_only=True)[0, -1].float()
        return _state(model, None, x.shape[1], logits, x[0].tolist(), seed)
    if isinstance(cache, str):
        if max_len is None:
            max_len = min(model.config.max_seq_len, x.shape[1] + DEFAULT_HEADROOM)
        cache = model.new_cache(kind=cache, max_len=max_len)
    prefix = cache.seq_len == 0 and x.shape[0] == 1
    start = cache.reuse_prefix(x[0].tolist()) if prefix else 0
    sizes = cache.plan_chunks(x.shape[1] - start)
    for n in sizes:
        logits = model(x[:, start:start + n], cache=cache, last_only=True)
        start += n
    if prefix:
        cache.register_prefix(x[0].tolist())
    return _state(model, cache, cache.seq_len, logits[0, -1].float(), x[0].tolist(), seed)


def _state(model, cache, position: int, logits: torch.Tensor, history: list[int], seed) -> PrefillState:
    generator = torch.Generator().manual_seed(int(seed)) if seed is not None else None
    return PrefillState(cache=cache, position=position, logits=logits, history=history,
                        rng_state=None if generator is None else generator.get_state(), seed=seed,
                        model_info=model_info(model))


def _check_state(state) -> None:
    if not isinstance(state, PrefillState):
        raise TypeError("decode needs the PrefillState returned by labkit.prefill(model, ids): the KV cache "
                        f"that prefill builds is what every decode step reads (got {type(state).__name__})")
    if state.logits is None or not state.history or (state.cache is not None and state.cache.seq_len == 0):
        raise ValueError("this PrefillState holds no prompt (empty KV cache): run labkit.prefill(model, ids) first")


def _sampler(state: PrefillState, params: SamplingParams, constraint=None):
    """`pick(logits) -> token`: greedy or seeded sampling; a `constraint` (labkit.sampling.constrained) masks the
    tokens its format does not allow before every other processor, and follows the token chosen."""
    generator = None
    if not params.greedy:
        generator = torch.Generator()
        if state.rng_state is not None:
            generator.set_state(state.rng_state)
        elif state.seed is not None:
            generator.manual_seed(int(state.seed))

    def choose(logits: torch.Tensor) -> int:
        token = sample_next(logits, state.history, params, generator)
        if generator is not None:
            state.rng_state = generator.get_state()
        return token

    if constraint is None:
        return choose

    def pick(logits: torch.Tensor) -> int:
        token = choose(constraint.apply(logits))
        constraint.advance(token)
        return token

    return pick


def _step(model, state: PrefillState, token: int) -> None:
    """Feed one token: the cache grows by one, `state.logits` becomes the next distribution."""
    if state.cache is None:  # recompute: the whole sequence (history ends with `token`) in one pass
        x = torch.tensor([state.history], device=model.device)
        state.logits = model(x, last_only=True)[0, -1].float()
        state.position = len(state.history)
        return
    x = torch.tensor([[token]], device=model.device)
    logits = model.step(x, cache=state.cache)[0, -1]  # the token came from the model's own vocabulary: no check
    state.logits = logits if logits.dtype == torch.float32 else logits.float()
    state.position = state.cache.seq_len


@torch.inference_mode()
def decode(model, state: PrefillState, n: int, params: SamplingParams | None = None, eos_id: int | None = None,
           **sampling) -> list[int]:
    """Stage 2: sample `n` tokens, one forward pass each, continuing from `state` (updated in place).

    Stops early after `eos_id` if given. `sampling` keywords: temperature, top_k, top_p, min_p, ...
    """
    _check_state(state)
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    pick = _sampler(state, _params(params, sampling))
    out: list[int] = []
    for _ in range(n):
        token = pick(state.logits)
        out.append(token)
        state.history.append(token)
        _step(model, state, token)
        if eos_id is not None and token == eos_id:
            break
    return out


def decode_with_checkpoints(model, state, n: int, path: str | Path, every: int = 16, **sampling) -> list[int]:
    """`labkit.decode` in stretches of `every` tokens, saving the state to `path` after each.

    If the process dies, `load_state(path, model)` resumes from the last stretch; the
    tokens are the same as an uninterrupted `decode(model, state, n)`.
    """
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be a positive integer, got {every!r}")
    eos_id = sampling.get("eos_id")
    out: list[int] = []
    while len(out) < n:
        out += decode(model, state, min(every, n - len(out)), **sampling)
        save_state(state, path, model)
        if eos_id is not None and out and out[-1] == eos_id:
            break
    return out
