"""Generation in two stages: `prefill` builds the KV cache, `decode` extends it one token a step.

The split follows gpt-fast's `generate.py` (`prefill()`, `decode_one_token()`,
`decode_n_tokens()`), which makes the two stages timeable on their own; the metric
names follow vLLM's `benchmarks/serve.py`: TTFT (request to first token), ITL (gaps
between consecutive tokens). Sampling and stopping come from `labkit.sampling`.

    >>> model, tok = labkit.load("smollm2-135m")                                   # doctest: +SKIP
    >>> out = generate(model, tok, "What is the capital of France? Answer in one sentence.")
    >>> out.text                                                                   # doctest: +SKIP
    'The capital of France is Paris.'
    >>> state = prefill(model, tok.encode("Once upon a time"))                     # doctest: +SKIP
    >>> tok.decode(decode(model, state, 8))                                        # doctest: +SKIP
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from labkit.sampling import SamplingParams, StopStrings, sample_next

__all__ = ["PrefillState", "GenerationOutput", "prefill", "decode", "generate", "stream", "DEFAULT_HEADROOM"]

DEFAULT_HEADROOM = 512  # cache slots `prefill` reserves beyond the prompt when max_len is not given


@dataclass
class PrefillState:
    """Everything decoding needs to continue: the KV cache, the position, the next-token
    logits, the token history (for penalties) and the sampler's RNG state."""

    cache: object
    position: int  # tokens processed so far (the next token's position)
    logits: torch.Tensor  # float32 [vocab_size]: distribution of the next token
    history: list[int] = field(default_factory=list)  # prompt + generated ids
    rng_state: torch.Tensor | None = None  # torch.Generator state; None until seeded
    seed: int | None = 0
    model_info: dict | None = None  # name and weight fingerprint of the model that made it (for load)

    def save(self, path) -> "Path":
        """Write this state to one safetensors file, to resume later (see `labkit.checkpoint`)."""
        from labkit.checkpoint import save_state

        return save_state(self, path)

    @classmethod
    def load(cls, path, model) -> "PrefillState":
        """Read a saved state for `model` (ValueError, naming both, if another model saved it)."""
        from labkit.checkpoint import load_state

        return load_state(path, model)


@dataclass
class GenerationOutput:
    """The reply and how long each stage took (seconds)."""

    text: str
    token_ids: list[int]  # generated ids (an EOS that ended the reply included)
    prompt_ids: list[int]
    finish_reason: str  # "eos", "stop", "length" or "context"
    tokenize_s: float
    prefill_s: float  # prompt forward + first sample
    decode_s: float  # all decode steps
    detokenize_s: float  # ids -> text: the final decode plus the incremental one while streaming
    ttft_s: float  # call to first token: tokenize + prefill
    itl_s: list[float]  # one per token after the first: time since the previous token
    stages: list[tuple[str, float, float]]  # (stage, start, end), seconds since the call

    @property
    def total_s(self) -> float:
        return self.stages[-1][2] if self.stages else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return len(self.itl_s) / self.decode_s if self.decode_s > 0 else float("nan")

    def timings(self) -> list[dict]:
        """The stages as rows for `labkit.viz.reply_timeline`: {stage, start_s, end_s, duration_s}."""
        return [{"stage": s, "start_s": a, "end_s": b, "duration_s": b - a} for s, a, b in self.stages]


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

    `cache` is a kind name (a new cache of `max_len` slots, default prompt + 512) or a
    cache object. A cache may ask for the prompt in pieces (`cache.plan_chunks`: a
    sliding window longer prompts than it holds) or reuse cached prefix blocks
    (`cache.reuse_prefix`: the paged cache). Returns the `PrefillState` that `decode`
    continues from.
    """
    from labkit.checkpoint import model_info

    x = _as_ids(ids)
    if isinstance(cache, str):
        if max_len is None:
            max_len = min(model.config.max_seq_len, x.shape[1] + DEFAULT_HEADROOM)
        cache = model.new_cache(kind=cache, max_len=max_len)
    prefix = hasattr(cache, "reuse_prefix") and cache.seq_len == 0 and x.shape[0] == 1
    start = cache.reuse_prefix(x[0].tolist()) if prefix else 0
    sizes = cache.plan_chunks(x.shape[1] - start) if hasattr(cache, "plan_chunks") else [x.shape[1] - start]
    for n in sizes:
        logits = model(x[:, start:start + n], cache=cache, last_only=True)
        start += n
    if prefix:
        cache.register_prefix(x[0].tolist())
    logits = logits[0, -1].float()  # [vocab_size]
    generator = torch.Generator().manual_seed(int(seed)) if seed is not None else None
    return PrefillState(cache=cache, position=cache.seq_len, logits=logits, history=x[0].tolist(),
                        rng_state=None if generator is None else generator.get_state(), seed=seed,
                        model_info=model_info(model))


def _check_state(state) -> None:
    if not isinstance(state, PrefillState):
        raise TypeError("decode needs the PrefillState returned by labkit.prefill(model, ids): the KV cache "
                        f"that prefill builds is what every decode step reads (got {type(state).__name__})")
    if state.cache is None or state.cache.seq_len == 0 or state.logits is None:
        raise ValueError("this PrefillState holds no prompt (empty KV cache): run labkit.prefill(model, ids) first")


def _sampler(state: PrefillState, params: SamplingParams):
    generator = None
    if not params.greedy:
        generator = torch.Generator()
        if state.rng_state is not None:
            generator.set_state(state.rng_state)
        elif state.seed is not None:
            generator.manual_seed(int(state.seed))

    def pick(logits: torch.Tensor) -> int:
        if params.greedy and params.repetition_penalty == 1.0 and not (params.frequency_penalty or params.presence_penalty):
            if torch.isnan(logits).any():
                raise ValueError("logits contain NaN; refusing to sample")
            return int(torch.argmax(logits))  # lowest id on ties, as sample_next
        token = sample_next(logits, state.history, params, generator)
        if generator is not None:
            state.rng_state = generator.get_state()
        return token

    return pick


def _step(model, state: PrefillState, token: int) -> None:
    """Feed one token: the cache grows by one, `state.logits` becomes the next distribution."""
    x = torch.tensor([[token]], device=model.device)
    state.logits = model(x, cache=state.cache)[0, -1].float()
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


def _prompt_ids(tok, prompt, chat: bool | None) -> list[int]:
    if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], dict):
        text = tok.apply_chat_template(list(prompt))
    elif isinstance(prompt, str):
        use_chat = getattr(tok, "chat_template", None) is not None if chat is None else chat
        text = tok.apply_chat_template([{"role": "user", "content": prompt}]) if use_chat else prompt
    else:
        raise TypeError(f"prompt must be a str or a list of chat messages, got {type(prompt).__name__}")
    return tok.encode(text)


@torch.inference_mode()
def _run(model, tok, prompt, max_new_tokens, seed, stop, cache, chat, params):
    """Yield ("text", piece) while generating, then ("done", GenerationOutput)."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    stops = stop if isinstance(stop, StopStrings) else StopStrings(stop)
    eos = getattr(tok, "eos_id", None)
    t0 = time.perf_counter()
    now = lambda: time.perf_counter() - t0  # noqa: E731
    prompt_ids = _prompt_ids(tok, prompt, chat)
    t_tok = now()
    ctx = model.config.max_seq_len
    if len(prompt_ids) >= ctx:
        raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the context window is {ctx} tokens")
    budget = min(max_new_tokens, ctx - len(prompt_ids))
    if isinstance(cache, str):
        cache = model.new_cache(kind=cache, max_len=len(prompt_ids) + budget)
    stages = [("tokenize", 0.0, t_tok)]
    state = prefill(model, prompt_ids, cache=cache, seed=seed)
    pick = _sampler(state, params)
    token = pick(state.logits)
    t_first = now()
    stages.append(("prefill", t_tok, t_first))
    ids, times = [token], [t_first]
    decoder = tok.stream_decoder()  # incremental text, for stop strings and streaming
    text, shown, detok = "", 0, 0.0
    reason = None
    while True:
        if token == eos:
            reason = "eos"
            break
        d0 = time.perf_counter()
        text += decoder.push(token)
        cut = stops.find(text) if stops else None
        if cut is not None:
            text, reason = text[:cut], "stop"
        safe = stops.safe_len(text) if stops else len(text.rstrip("\ufffd"))
        detok += time.perf_counter() - d0
        if safe > shown:
            yield "text", text[shown:safe]
            shown = safe
        if reason:
            break
        if len(ids) >= budget:
            reason = "length" if budget == max_new_tokens else "context"
            break
        start = now()
        state.history.append(token)
        _step(model, state, token)
        token = pick(state.logits)
        times.append(now())
        stages.append((f"decode {len(ids)}", start, times[-1]))
        ids.append(token)
    d0 = now()
    final = tok.decode([i for i in ids if i != eos])  # the whole reply, from its ids at once
    final = stops.cut(final) if stops else final
    end = now()
    stages.append(("detokenize", d0, end))
    if len(final) > shown:
        yield "text", final[shown:]  # what was held back: a last partial character, a stop prefix
    decode_s = sum(b - a for s, a, b in stages if s.startswith("decode"))
    yield "done", GenerationOutput(
        text=final, token_ids=ids, prompt_ids=prompt_ids, finish_reason=reason,
        tokenize_s=t_tok, prefill_s=t_first - t_tok, decode_s=decode_s, detokenize_s=end - d0 + detok,
        ttft_s=t_first, itl_s=[b - a for a, b in zip(times, times[1:])], stages=stages,
    )


def generate(model, tok, prompt, max_new_tokens: int = 64, seed: int | None = 0, *, stop=None,
             cache="contiguous", chat: bool | None = None, params: SamplingParams | None = None,
             **sampling) -> GenerationOutput:
    """Generate a reply to `prompt` (a str, or a list of chat messages) and time every stage.

    `chat=None` wraps a str prompt in the tokenizer's chat template when it has one.
    Sampling keywords (temperature=0 is greedy, the default; top_k, top_p, min_p,
    repetition_penalty, ...) go to `labkit.sampling.SamplingParams`. `stop`: stop strings
    (the reply is cut before them). `cache`: a KV cache kind or object.
    """
    out = None
    for kind, value in _run(model, tok, prompt, max_new_tokens, seed, stop, cache, chat, _params(params, sampling)):
        if kind == "done":
            out = value
    return out


def stream(model, tok, prompt, max_new_tokens: int = 64, seed: int | None = 0, *, stop=None,
           cache="contiguous", chat: bool | None = None, params: SamplingParams | None = None, **sampling):
    """Like `generate`, but yields the reply's text piece by piece as tokens are decoded.

    Text that could still turn into a stop string, or half a UTF-8 character, is held
    back until it is certain; the pieces join to exactly `generate(...).text`.
    """
    for kind, value in _run(model, tok, prompt, max_new_tokens, seed, stop, cache, chat, _params(params, sampling)):
        if kind == "text" and value:
            yield value
