"""What the engine records: one `Step` per forward pass (with the split of its work), a `Replay` of a whole trace,
`PassFailed` when a pass raises; and `run_trace`, the loop that replays a trace on the measured virtual clock."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from labkit.serving.engine.request import Request

__all__ = ["Step", "Replay", "PassFailed", "run_trace"]


class PassFailed(RuntimeError):
    """A forward pass raised: `requests` are the ones it was running, `__cause__` is the error."""

    def __init__(self, requests: list, error: BaseException):
        super().__init__(f"a forward pass over {len(requests)} request(s) failed: {type(error).__name__}: {error}")
        self.requests = requests


def _logprobs(row_logits: torch.Tensor, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The chosen token's log-probability under the model, and the k most likely tokens with theirs."""
    lp = torch.log_softmax(row_logits.float(), dim=-1)
    top = torch.topk(lp, k) if k else None
    return float(lp[token]), ([] if top is None else list(zip(top.indices.tolist(), top.values.tolist())))


@dataclass
class Step:
    """One forward pass: when it ran and which requests it served with how many tokens."""

    index: int
    start: float
    end: float
    rows: list[tuple[object, int]]
    kv_tokens: int          # tokens held in the cache after the step
    kv_slots: int           # slots in allocated blocks (paged)
    kv_reserved: int        # slots a cache that preallocates each running request's exact prompt + reply would hold
    n_running: int = 0      # requests running after the step
    prompt_tokens: int = 0  # their prompts' tokens (with n_running: what reserving prompt + max_tokens each would hold)
    drafted: int = 0        # drafted tokens the pass verified (speculation), of its n_tokens
    accepted: int = 0       # of which accepted
    parts: dict = field(default_factory=dict)  # seconds of each part of the step's work (Engine.step)

    @property
    def n_tokens(self) -> int:
        return sum(n for _, n in self.rows)

    @classmethod
    def after(cls, index: int, start: float, end: float, rows, scheduler) -> "Step":
        """The record of a pass that just ran `rows` [(request, n)], with the scheduler's KV bookkeeping after it."""
        tables = scheduler.blocks
        return cls(index, start, end, [(req.id, n) for req, n in rows], tables.used_tokens(),
                   (tables.num_blocks - tables.n_free) * tables.block_size, sum(r.max_len for r in scheduler.running),
                   len(scheduler.running), sum(len(r.prompt) for r in scheduler.running))


@dataclass
class Replay:
    """What `Engine.replay` returns: the requests (with their times) and every step."""

    policy: str
    requests: list[Request]
    steps: list[Step] = field(default_factory=list)
    preemptions: int = 0


def run_trace(requests: list[Request], add, step, scheduler, max_steps: int = 100_000) -> None:
    """The replay loop: admit what has arrived by `now`, run a pass (`step(now, draining)` -> its end time,
    or None when nothing could run), and when idle jump to the next arrival instead of waiting for it."""
    pending = sorted(requests, key=lambda r: r.arrival)
    now, i, passes = (pending[0].arrival if pending else 0.0), 0, 0
    while i < len(pending) or scheduler.has_work:
        while i < len(pending) and pending[i].arrival <= now:
            add(pending[i])
            i += 1
        end = step(now, i == len(pending))
        if end is not None:
            now, passes = end, passes + 1
        elif i < len(pending):
            now = max(now, pending[i].arrival)  # idle: jump to the next arrival
        elif scheduler.has_work:
            now += scheduler.max_wait_s  # static batching waiting for a batch that cannot fill
        if passes > max_steps:
            raise RuntimeError(f"replay did not finish within {max_steps} steps")


def _bar(progress: bool, total: int, policy: str):
    if not progress:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=f"serving ({policy})", unit="tok", leave=False)
