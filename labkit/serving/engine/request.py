"""A request as the server sees it: its tokens, what is cached, and the times of its life.

A request's `tokens` are its prompt followed by what it has generated so far; `n_cached`
of them have their keys and values in the KV cache. A step runs the model on the next
uncached tokens; when that catches the request up (`n_cached == len(tokens)`) the step's
logits give the next token. So a prefill chunk, a whole prompt, a decode step and the
recomputation of a preempted request are one and the same operation.

Times are seconds on the engine's clock: `arrival`, `first_token` (TTFT = first_token −
arrival), `token_times` (one per generated token; ITL = the gaps), `finish`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from labkit import checks
from labkit.sampling.pipeline import SamplingParams, make_generator

__all__ = ["Request", "Status"]


class Status(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One user's request: `prompt` token ids, up to `max_new_tokens` new ones, sampled with `params`."""

    id: int | str
    prompt: list[int]
    max_new_tokens: int
    arrival: float = 0.0
    params: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = 0
    stop_ids: frozenset = frozenset()
    output: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    n_cached: int = 0
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish: float | None = None
    finish_reason: str | None = None
    preemptions: int = 0
    steps: list[tuple[int, int]] = field(default_factory=list)  # (engine step, tokens run) for a Gantt chart
    penalize_prompt: bool = True   # penalties count prompt + output (labkit.generate's rule); False: output only (OpenAI's)
    logprobs: int | None = None    # None: none; k >= 0: each token's log-probability and the k most likely
    token_logprobs: list = field(default_factory=list)  # (logprob, [(token, logprob)] top k) per generated token
    error: str | None = None       # why the engine failed this request (finish_reason "error")
    constraint: object = None      # a labkit.sampling.constrained.Constraint: the reply's format (None: free text)
    cached_tokens: int = 0         # tokens found in the prefix cache when it was (last) admitted (a preempted
                                   # request readmitted may find its own output there too)
    draft: list = field(default_factory=list)  # drafted tokens this pass verifies after the last one (speculation)
    draft_q: object = None         # their draft probabilities [len(draft), V] (None: proposed deterministically)
    drafted: int = 0               # drafted tokens verified, all passes together
    accepted: int = 0              # of which accepted
    tested: int = 0                # of which looked at: the accepted ones and each pass's first rejected one

    def __post_init__(self):
        if not isinstance(self.prompt, list) or not self.prompt or not all(isinstance(t, int) for t in self.prompt):
            raise ValueError(f"prompt of request {self.id!r} must be a non-empty list of token ids")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens of request {self.id!r} must be a positive integer, got {self.max_new_tokens!r}")
        checks.integer(f"seed of request {self.id!r}", self.seed, none_ok=True)
        if isinstance(self.params, dict):
            self.params = SamplingParams.from_kwargs(**self.params)  # unknown names: a TypeError listing them
        elif not isinstance(self.params, SamplingParams):
            raise TypeError(f"params of request {self.id!r} must be a SamplingParams or a dict of its fields, "
                            f"got {type(self.params).__name__}")
        self.generator = make_generator(self.seed)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def n_uncached(self) -> int:
        return len(self.prompt) + len(self.output) - self.n_cached

    @property
    def max_len(self) -> int:
        """Most tokens this request can hold in the cache: prompt + reply, less the last token (never fed back)."""
        return len(self.prompt) + self.max_new_tokens - 1

    @property
    def decodes_next(self) -> bool:
        """Its next row is a decoding row: the prompt cached and one token to run (then drafts may join it)."""
        return self.prefilled and self.n_uncached == 1

    @property
    def prefilled(self) -> bool:
        """Every prompt token is cached (it decodes from here on)."""
        return self.n_cached >= len(self.prompt)

    def next_tokens(self, n: int) -> list[int]:
        """The n tokens a pass runs for this request: its uncached tokens, then its drafted ones."""
        return (self.tokens + self.draft)[self.n_cached:self.n_cached + n]

    def advance(self, n: int, step: int) -> bool:
        """Pass `step` ran n more of this request's tokens: True when that caught it up (its logits give a token)."""
        self.n_cached += n
        self.steps.append((step, n))
        return self.n_uncached == 0

    def add_token(self, token: int, now: float) -> bool:
        """Append a generated token at time `now`; return True when the request is done."""
        self.output.append(token)
        self.token_times.append(now)
        if self.first_token is None:
            self.first_token = now
        if token in self.stop_ids or (self.constraint is not None and self.constraint.done):
            self.finish_reason = "stop"
        elif len(self.output) >= self.max_new_tokens:
            self.finish_reason = "length"
        return self.finish_reason is not None

    def fail(self, reason: str, message: str | None = None, now: float | None = None) -> None:
        """End the request early: finish_reason `reason` ("abort", "stop", "timeout", "rejected", "error"), with
        `message` saying why."""
        self.status, self.finish_reason, self.error = Status.FINISHED, reason, message
        self.finish = now if now is not None else self.finish

    @property
    def penalty_history(self) -> list[int]:
        """The tokens the frequency, presence and repetition penalties count."""
        return self.tokens if self.penalize_prompt else self.output

    # ---- what the trace reports ---------------------------------------------------------

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def itls(self) -> list[float]:
        """Gaps between consecutive tokens (seconds)."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]
