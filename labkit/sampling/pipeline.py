"""Choosing the next token: the sampling pipeline, greedy decoding and seeded sampling.

The knobs follow their published definitions (see `labkit.sampling.processors`) and are
chained in one of two documented orders:

* ``order="hf"`` (Hugging Face `generate`, `_get_logits_processor`):
  repetition penalty -> frequency/presence penalty -> temperature -> top-k -> top-p
  -> min-p -> typical-p. Thresholds are computed on the temperature-scaled distribution.
* ``order="llama.cpp"`` (llama.cpp's default sampler chain, `common/common.h`):
  penalties -> top-k -> typical-p -> top-p -> min-p -> temperature. Temperature comes
  last, so the truncation thresholds are computed on the T = 1 distribution.

Hugging Face has no frequency/presence penalty; labkit applies them right after the
repetition penalty, as llama.cpp does. All penalties count the tokens of the `history` they
are given: `labkit.generate` passes prompt + output (HF's rule for the repetition penalty;
OpenAI and vLLM count only the output for frequency/presence, llama.cpp the last 64 tokens). ``temperature=0`` means greedy: the penalties are
applied, the truncation filters are skipped (as in HF's ``do_sample=False``) and only the
argmax survives, ties going to the lowest token id.

    >>> import torch
    >>> l = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    >>> process_logits(l, [], temperature=1.0, top_k=2).isfinite().tolist()
    [True, True, False, False]
    >>> sample_next(l, [], SamplingParams())        # temperature 0: greedy
    0
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from labkit import checks
from labkit.sampling.processors import apply_frequency_presence_penalty, apply_repetition_penalty, apply_temperature, greedy_filter, min_p_filter, token_counts, top_k_filter, top_p_filter, typical_filter

__all__ = [
    "SamplingParams",
    "ORDERS",
    "build_pipeline",
    "process_logits",
    "process_stages",
    "sample_next",
    "make_generator",
]

ORDERS = {
    "hf": ("repetition_penalty", "frequency_presence", "temperature", "top_k", "top_p", "min_p", "typical_p"),
    "llama.cpp": ("repetition_penalty", "frequency_presence", "top_k", "typical_p", "top_p", "min_p", "temperature"),
}


@dataclass(frozen=True)
class SamplingParams:
    """Every sampling knob, validated. The defaults change nothing, and temperature 0 is greedy.

    >>> SamplingParams(temperature=0.7, top_p=0.9).order
    'hf'
    >>> SamplingParams(top_p=1.5)
    Traceback (most recent call last):
    ...
    ValueError: top_p must be in (0, 1], got 1.5
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    order: str = "hf"

    def __post_init__(self):
        for name in ("temperature", "top_p", "min_p", "typical_p", "repetition_penalty",
                     "frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not checks.is_number(value):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        checks.integer("top_k", self.top_k, error=TypeError)
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 means off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 < self.typical_p <= 1:
            raise ValueError(f"typical_p must be in (0, 1], got {self.typical_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 means off), got {self.repetition_penalty}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {sorted(ORDERS)}, got {self.order!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with no penalty: the raw logits' argmax (no processor can change it)."""
        return self.greedy and self.repetition_penalty == 1.0 and not (self.frequency_penalty or self.presence_penalty)

    @classmethod
    def from_kwargs(cls, params: "SamplingParams | None" = None, **kwargs) -> "SamplingParams":
        """Build from keyword arguments; None means "the default" (or the value in `params`).

        >>> SamplingParams.from_kwargs(temperature=0.8, top_k=None).top_k
        0
        """
        unknown = set(kwargs) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown sampling parameter(s): {sorted(unknown)}")
        base = params if params is not None else cls()
        given = {k: v for k, v in kwargs.items() if v is not None}
        return dataclasses.replace(base, **given) if given else base


Stage = tuple[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]


def build_pipeline(params: SamplingParams) -> list[Stage]:
    """The active stages, in order: a list of `(name, fn(logits [B,V], counts [B,V]) -> logits)`.

    A stage whose knob is at its neutral value is left out (like HF's `generate`).

    >>> [name for name, _ in build_pipeline(SamplingParams(temperature=0.5, top_p=0.9, order="llama.cpp"))]
    ['top_p', 'temperature']
    """
    p = params
    stages: dict[str, Stage] = {}
    if p.repetition_penalty != 1.0:
        stages["repetition_penalty"] = ("repetition_penalty", lambda l, c: apply_repetition_penalty(l, c, p.repetition_penalty))
    if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
        stages["frequency_presence"] = (
            "frequency_presence",
            lambda l, c: apply_frequency_presence_penalty(l, c, p.frequency_penalty, p.presence_penalty),
        )
    if p.greedy:  # HF's do_sample=False: penalties, then argmax
        return [stages[n] for n in ORDERS[p.order] if n in stages] + [("greedy", lambda l, c: greedy_filter(l))]
    if p.temperature != 1.0:
        stages["temperature"] = ("temperature", lambda l, c: apply_temperature(l, p.temperature))
    if p.top_k != 0:
        stages["top_k"] = ("top_k", lambda l, c: top_k_filter(l, p.top_k))
    if p.top_p != 1.0:
        stages["top_p"] = ("top_p", lambda l, c: top_p_filter(l, p.top_p))
    if p.min_p != 0.0:
        stages["min_p"] = ("min_p", lambda l, c: min_p_filter(l, p.min_p))
    if p.typical_p != 1.0:
        stages["typical_p"] = ("typical_p", lambda l, c: typical_filter(l, p.typical_p))
    return [stages[n] for n in ORDERS[p.order] if n in stages]


def _check_logits(logits: torch.Tensor, what: str = "logits") -> None:
    if torch.isnan(logits).any():
        raise ValueError(f"{what} contain NaN; refusing to sample")
    if torch.isposinf(logits).any():
        raise ValueError(f"{what} contain +inf; refusing to sample")
    if torch.isneginf(logits).all(dim=-1).any():
        raise ValueError(f"{what}: every token of a row is -inf; there is nothing to sample")


def _prepare(logits, history) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """-> logits [B, V] (float32 or float64), history [B, T] (long, -1 = padding), was-1-D flag."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    if logits.dim() not in (1, 2):
        raise ValueError(f"logits must have shape [V] or [B, V], got {tuple(logits.shape)}")
    squeeze = logits.dim() == 1
    x = logits.unsqueeze(0) if squeeze else logits
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    _check_logits(x)
    B, V = x.shape
    if history is None:
        return x, torch.zeros(B, 0, dtype=torch.long, device=x.device), squeeze
    if isinstance(history, torch.Tensor):
        h = history.long()
    elif len(history) and not (isinstance(history[0], int) or (torch.is_tensor(history[0]) and history[0].dim() == 0)):
        rows = [[int(v) for v in r] for r in history]
        width = max(len(r) for r in rows)  # ragged rows: pad with -1
        h = torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.long).reshape(len(rows), width)
    else:
        h = torch.as_tensor(history, dtype=torch.long)
    if h.numel() == 0:
        h = torch.zeros(B, 0, dtype=torch.long)
    elif h.dim() == 1 and B == 1:
        h = h.unsqueeze(0)
    elif not (h.dim() == 2 and h.shape[0] == B):
        raise ValueError(f"history of shape {tuple(h.shape)} does not match logits of shape {tuple(logits.shape)}")
    if h.numel() and int(h.max()) >= V:
        raise ValueError(f"history holds token id {int(h.max())} >= vocab size {V}")
    return x, h.to(x.device), squeeze


def process_stages(logits, history=None, params: SamplingParams | None = None, **kwargs) -> list[tuple[str, torch.Tensor]]:
    """The logits after each stage, starting with `("input", logits)`; same shapes as the input.

    This is what the chapter's widget plots: which tokens survive each stage, in order.
    """
    params = SamplingParams.from_kwargs(params, **kwargs)
    x, hist, squeeze = _prepare(logits, history)
    counts = token_counts(hist, x.shape[-1])
    out = [("input", x)]
    for name, fn in build_pipeline(params):
        x = fn(x, counts)
        out.append((name, x))
    if torch.isnan(x).any() or torch.isposinf(x).any():
        raise ValueError(f"processed logits overflowed (temperature={params.temperature} is too small "
                         "for these logits; use temperature=0 for greedy)")
    return [(name, t.squeeze(0) if squeeze else t) for name, t in out]


def process_logits(logits, history=None, params: SamplingParams | None = None, **kwargs) -> torch.Tensor:
    """Run the whole pipeline: logits `[V]` or `[B, V]` -> processed logits, removed tokens at -inf.

    `history` is the token ids seen so far (list, LongTensor `[T]` or `[B, T]`; negative
    ids are padding); the penalties count over all of it. Knobs come from `params` and/or
    keyword arguments (keywords win).

    >>> l = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    >>> process_logits(l, None, temperature=1.0, top_p=0.9).isfinite().tolist()
    [True, True, True, False]
    """
    return process_stages(logits, history, params, **kwargs)[-1][1]


def make_generator(seed: int | None) -> torch.Generator | None:
    """A CPU `torch.Generator` seeded with `seed` (None -> None, i.e. torch's global RNG)."""
    if seed is None:
        return None
    return torch.Generator().manual_seed(int(seed))


def sample_next(logits, history=None, params: SamplingParams | None = None, generator: torch.Generator | None = None,
                return_probs: bool = False, **kwargs):
    """Pick the next token: argmax (lowest id on ties) when temperature == 0, otherwise a draw
    from the softmax of the processed logits with `torch.multinomial(generator=generator)`.

    Returns an int for logits `[V]`, a LongTensor `[B]` for logits `[B, V]`; with
    `return_probs`, `(token, probs)` where probs is the distribution drawn from (None when
    greedy): what a speculative drafter hands to verification. The one token chooser of the
    lab: decoding, the serving engine, speculative decoding and its drafters all call it.
    Plain greedy on one row is one `max` and one read back (a decode step's whole choice).

    >>> l = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    >>> sample_next(l, [], temperature=1.0, top_k=1, generator=make_generator(0))
    0
    """
    params = SamplingParams.from_kwargs(params, **kwargs)
    if params.plain_greedy and isinstance(logits, torch.Tensor) and logits.dim() == 1 and logits.is_floating_point():
        value, index = logits.max(0)  # the first maximum: lowest id on ties; NaN wins if there is one
        if not -math.inf < value.item() < math.inf:
            _check_logits(logits)  # raises, naming NaN, +inf or an all -inf row
        return (index.item(), None) if return_probs else index.item()
    processed = process_logits(logits, history, params)
    x = processed.unsqueeze(0) if processed.dim() == 1 else processed
    probs = None
    if params.greedy:
        ids = torch.argmax(x, dim=-1)
    else:
        probs = torch.softmax(x, dim=-1)
        draw = probs if generator is None or generator.device == probs.device else probs.to(generator.device)
        ids = torch.multinomial(draw, 1, generator=generator).squeeze(-1).to(x.device)
    token = int(ids[0]) if processed.dim() == 1 else ids
    if not return_probs:
        return token
    return token, (None if probs is None else probs[0] if processed.dim() == 1 else probs)
