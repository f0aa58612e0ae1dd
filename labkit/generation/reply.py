"""A whole reply: `generate` (and `stream`) tokenize, prefill, decode and detokenize, timing each stage.

The metric names follow vLLM's `benchmarks/serve.py`: TTFT (request to first token), ITL
(gaps between consecutive tokens).

    >>> import labkit
    >>> model, tok = labkit.load("smollm2-135m")
    >>> out = generate(model, tok, "What is the capital of France? Answer in one sentence.", max_new_tokens=16)
    >>> "Paris" in out.text, out.finish_reason in ("eos", "length")
    (True, True)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from labkit import checks
from labkit.measure.clock import now as clock_now
from labkit.generation.stages import _params, _sampler, _step, prefill
from labkit.sampling.constrained import make_constraint
from labkit.sampling.pipeline import SamplingParams
from labkit.sampling.stopping import StopStrings

__all__ = ["GenerationOutput", "generate", "stream", "encode_prompt"]


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


def encode_prompt(tok, prompt, chat: bool | None = None) -> list[int]:
    """The ids of a prompt: a str (in the chat template when the tokenizer has one and `chat` is not
    False), chat messages, or token ids used as they are.

    Chat messages go through `tok.encode_chat`, so special-token text that a user typed stays
    text and cannot close their turn; a str outside the template is encoded with `tok.encode`.

        >>> encode_prompt(smol, [{"role": "user", "content": "Hi"}]) == smol.encode(smol.apply_chat_template(
        ...     [{"role": "user", "content": "Hi"}]))                                      # doctest: +SKIP
        True
    """
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.reshape(-1).tolist()
    if isinstance(prompt, (list, tuple)) and prompt and all(checks.is_int(i) for i in prompt):
        if chat:
            raise ValueError("chat=True needs a str or chat messages; token ids go to the model as they are")
        return list(prompt)  # token ids: no chat template
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
        return tok.encode_chat(list(prompt))
    if isinstance(prompt, str):
        use_chat = getattr(tok, "chat_template", None) is not None if chat is None else chat
        return tok.encode_chat([{"role": "user", "content": prompt}]) if use_chat else tok.encode(prompt)
    raise TypeError(f"prompt must be a str, a list of chat messages ({{'role': ..., 'content': ...}}) or a "
                    f"non-empty list of token ids, got {type(prompt).__name__} {str(prompt)[:60]}")


@torch.inference_mode()
def _run(model, tok, prompt, max_new_tokens, seed, stop, cache, chat, params, constraint=None):
    """Yield ("text", piece) while generating, then ("done", GenerationOutput)."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    stops = stop if isinstance(stop, StopStrings) else StopStrings(stop)
    eos = getattr(tok, "eos_id", None)
    t0 = clock_now()
    now = lambda: clock_now() - t0  # noqa: E731
    prompt_ids = encode_prompt(tok, prompt, chat)
    t_tok = now()
    ctx = model.config.max_seq_len
    if len(prompt_ids) >= ctx:
        raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the context window is {ctx} tokens")
    budget = min(max_new_tokens, ctx - len(prompt_ids))
    if isinstance(cache, str):
        cache = model.new_cache(kind=cache, max_len=len(prompt_ids) + budget)
    elif cache is not None and not hasattr(cache, "begin"):
        raise TypeError(f"cache must be a cache kind name, a KV cache or None (no cache), got {type(cache).__name__}")
    stages = [("tokenize", 0.0, t_tok)]
    state = prefill(model, prompt_ids, cache=cache, seed=seed)
    pick = _sampler(state, params, constraint)
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
        d0 = clock_now()
        text += decoder.push(token)
        cut = stops.find(text) if stops else None
        if cut is not None:
            text, reason = text[:cut], "stop"
        safe = stops.safe_len(text) if stops else len(text.rstrip("\ufffd"))
        detok += clock_now() - d0
        if safe > shown:
            yield "text", text[shown:safe]
            shown = safe
        if constraint is not None and constraint.done and not reason:
            reason = "stop"  # the format is complete: no token can extend it
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
             regex: str | None = None, json_schema=None, choices=None, **sampling) -> GenerationOutput:
    """Generate a reply to `prompt` (a str, a list of chat messages, or token ids) and time every stage.

    `chat=None` wraps a str prompt in the tokenizer's chat template when it has one.
    Sampling keywords (temperature=0 is greedy, the default; top_k, top_p, min_p,
    repetition_penalty, ...) go to `labkit.sampling.SamplingParams`. `stop`: stop strings
    (the reply is cut before them). `cache`: a KV cache kind, a cache object, or None
    (no KV cache: each step recomputes the whole sequence). Token ids are used as they
    are, with no chat template. Constrained decoding, one at most: `regex` (the whole reply
    matches it), `json_schema` (a dict, or "json_object"), `choices` (the reply is one of these
    strings); see `labkit.sampling.constrained`.
    """
    out = None
    constraint = make_constraint(tok, regex, json_schema, choices)
    for kind, value in _run(model, tok, prompt, max_new_tokens, seed, stop, cache, chat, _params(params, sampling),
                            constraint):
        if kind == "done":
            out = value
    return out


def stream(model, tok, prompt, max_new_tokens: int = 64, seed: int | None = 0, *, stop=None,
           cache="contiguous", chat: bool | None = None, params: SamplingParams | None = None,
           regex: str | None = None, json_schema=None, choices=None, **sampling):
    """Like `generate`, but yields the reply's text piece by piece as tokens are decoded.

    Text that could still turn into a stop string, or half a UTF-8 character, is held
    back until it is certain; the pieces join to exactly `generate(...).text`.
    """
    constraint = make_constraint(tok, regex, json_schema, choices)
    for kind, value in _run(model, tok, prompt, max_new_tokens, seed, stop, cache, chat, _params(params, sampling),
                            constraint):
        if kind == "text" and value:
            yield value
