"""Data parallelism: which replica serves a request. Round robin, or the replica with the least outstanding work.

Several copies of a model (replicas) each run their own engine; a router in front sends every
arriving request to one of them. Round robin ignores what a request costs: two 1,000-token
prompts can land on one replica while the other gets two greetings. The second seed article
(§4.3) allocates by input length instead; here the router sends each request to the replica
whose unfinished requests hold the least work, counted in tokens (prompt + expected reply), as
vLLM's and SGLang's routers balance by queue length or pending tokens. The count is not decremented
as a request progresses: until it finishes, a request counts its whole prompt + max_new_tokens.

    >>> r = Router(2, "least_work")
    >>> r.choose(Request(0, [1] * 100, 10), [0, 0]), r.choose(Request(1, [1] * 10, 10), [110, 0])
    (0, 1)

`replay_replicas(engines, requests, router)` runs a trace through several engines on their own
measured virtual clocks (each replica is a separate machine: the replicas run one after another
here, each clock counting only its own steps) and routes each request when it arrives, seeing
which requests each replica has finished by then.
"""
from __future__ import annotations

from labkit import checks
from labkit.serving.engine.loop import Engine, Replay
from labkit.serving.engine.request import Request

__all__ = ["Router", "ROUTERS", "replay_replicas", "request_work"]

ROUTERS = ("round_robin", "least_work")


def request_work(req: Request, expected_reply: int | None = None) -> int:
    """Tokens a request will cost its replica: its prompt plus the reply expected (default: max_new_tokens)."""
    return len(req.prompt) + (req.max_new_tokens if expected_reply is None else min(expected_reply, req.max_new_tokens))


class Router:
    """Pick a replica for each request: `policy` "round_robin" or "least_work" (ties to the lowest index)."""

    def __init__(self, n_replicas: int, policy: str = "least_work", expected_reply: int | None = None):
        checks.positive_int("n_replicas", n_replicas)
        if policy not in ROUTERS:
            raise ValueError(f"policy must be one of {ROUTERS}, got {policy!r}")
        if expected_reply is not None and (not isinstance(expected_reply, int) or expected_reply < 0):
            raise ValueError(f"expected_reply must be None or an integer >= 0, got {expected_reply!r}")
        self.n_replicas, self.policy, self.expected_reply = n_replicas, policy, expected_reply
        self._next = 0

    def work(self, req: Request) -> int:
        return request_work(req, self.expected_reply)

    def outstanding(self, sent: list[list[Request]], now: float) -> list[int]:
        """Each replica's outstanding work at `now`, in tokens: `sent[i]` lists the requests sent to replica i, and
        each counts its whole `work` until it finishes (one that finished at or before `now` counts nothing)."""
        return [sum(self.work(q) for q in mine if q.finish is None or q.finish > now) for mine in sent]

    def choose(self, req: Request, outstanding: list[int]) -> int:
        """The replica for `req`, given each replica's outstanding work in tokens."""
        if len(outstanding) != self.n_replicas:
            raise ValueError(f"outstanding must hold one number per replica ({self.n_replicas}), got {len(outstanding)}")
        if self.policy == "round_robin":
            chosen, self._next = self._next, (self._next + 1) % self.n_replicas
            return chosen
        return min(range(self.n_replicas), key=lambda i: (outstanding[i], i))


def replay_replicas(engines: list[Engine], requests: list[Request], router: Router,
                    max_steps: int = 100_000) -> tuple[Replay, list[int]]:
    """Serve `requests` on `engines` (one per replica), routed by `router` at each arrival.

    Returns one `Replay` of all requests and steps (for `summarize`: throughput over the wall time
    the replicas take together, TTFT and ITL of every request) and the replica each request went to.
    """
    if len(engines) != router.n_replicas:
        raise ValueError(f"the router has {router.n_replicas} replicas, got {len(engines)} engines")
    pending = sorted(requests, key=lambda r: r.arrival)
    start = pending[0].arrival if pending else 0.0
    clocks = [start] * len(engines)
    first_steps = [len(e.steps) for e in engines]
    assigned: list[list[Request]] = [[] for _ in engines]
    passes = 0

    def advance(i: int, until: float | None) -> None:
        nonlocal passes
        engine = engines[i]
        while engine.scheduler.has_work and (until is None or clocks[i] < until):
            end = engine.step(clocks[i], draining=until is None)
            if end is None:  # static batching waiting for a batch: time passes
                clocks[i] = until if until is not None else clocks[i] + engine.scheduler.max_wait_s
                continue
            clocks[i], passes = end.end, passes + 1
            if passes > max_steps:
                raise RuntimeError(f"replay did not finish within {max_steps} steps")
        if until is not None:
            clocks[i] = max(clocks[i], until)

    route = []
    for req in pending:
        for i in range(len(engines)):
            advance(i, req.arrival)
        i = router.choose(req, router.outstanding(assigned, req.arrival))
        assigned[i].append(req)
        engines[i].add(req)
        route.append(i)
    for i in range(len(engines)):
        advance(i, None)
    steps = [s for e, k in zip(engines, first_steps) for s in e.steps[k:]]
    replay = Replay(engines[0].policy, pending, steps, sum(e.scheduler.preemptions for e in engines))
    order = {id(r): k for k, r in enumerate(pending)}
    return replay, [route[order[id(r)]] for r in requests]
