"""How many drafted tokens each request may have verified in a pass: the speculation budget, four policies.

A serving engine that speculates (`Engine(model, drafter=PromptLookup(), spec_budget=...)`) asks
its budget, before every pass, how many of each decoding request's drafted tokens go into the
pass. A drafted token takes a slot in the pass like any other token; it pays only if it is
accepted, so what is worth verifying depends on the acceptance and on what a slot costs, which
depends on the load. One interface (`choose`, plus what the engine tells the budget after each
pass: `observe_pass`, `observe`), four policies:

- `Off()`: never draft (the engine without speculation);
- `Fixed(gamma)`: every decoding request verifies up to γ drafted tokens, whatever the load;
- `BatchCap(max_batch, gamma)`: vLLM's rule (v0's `speculative_disable_by_batch_size`):
  γ while fewer than `max_batch` requests run, no speculation at all from `max_batch` on;
- `LoadAware(...)`: the rule below, decided per pass from measured inputs only.

The load-aware rule. Inputs, all measured: request i's acceptance α_i (its verified drafted
tokens: accepted / tested, tested counting the first rejected one; pooled with the acceptance
of every request the engine has verified, weighted as `prior` tokens, so a new request starts
from what the others showed), and the pass cost T(n) of a pass of n tokens (the engine's own
passes, timed and kept per token count, read linearly between the counts seen; or a table
measured beforehand, `passcost.step_time(passcost.measure_pass_costs(...))`). The plain pass
holds N₀ = b + P tokens (b decoding rows, P prompt tokens riding along) and emits E = b
tokens. The j-th drafted token of request i emits α_i^j more tokens on average (it is accepted
only if the j − 1 before it were), and makes the pass one token longer: a prompt token it
displaces from the budget still has to run in a later pass, so the work grows by one token
either way. Candidates are taken in order of α_i^j, and one is kept when it raises the pass's
rate of emitted tokens per second:

    keep the token  iff  α_i^j / (T(N + 1) − T(N))  >  E / T(N)

(N and E the pass so far, both growing with every kept token). Where T is flat in n (a
memory-bound pass) almost any token with α > 0 is kept; where T grows in proportion to n
(compute-bound, a loaded machine) a token is kept only if it is more likely to be accepted than
the pass's average row is to emit. With no acceptance measured yet, or T known at fewer than
two token counts, every request verifies one drafted token (a probe); and after `probe_every`
passes in which nobody drafted, the request that waited longest verifies one, so that α stays
measured (at most one token every `probe_every` passes).
"""
from __future__ import annotations

import re

__all__ = ["SpecBudget", "Off", "Fixed", "BatchCap", "LoadAware", "spec_budget", "GAMMA_LIMIT"]

GAMMA_LIMIT = 16  # the most drafted tokens a request may carry in one pass (a pass's rows stay row-invariant up to 16)


def _gamma(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= GAMMA_LIMIT:
        raise ValueError(f"{name} must be an integer in [1, {GAMMA_LIMIT}], got {value!r}")
    return value


class SpecBudget:
    """The interface: `gamma_max` (0: the engine does not draft), `choose(...)`, `observe_pass`, `observe`."""

    name = "budget"
    gamma_max = 0

    def choose(self, drafts: list[tuple[object, int]], *, batch: int, riding: int = 0) -> list[int]:
        """Per (request, drafted tokens it has), how many to verify this pass; `batch`: requests running,
        `riding`: prompt tokens this pass carries besides the decoding rows."""
        return [0 for _ in drafts]

    def observe_pass(self, tokens: int, seconds: float) -> None:
        """A pass of `tokens` tokens took `seconds` (the engine's wall time of the forward pass)."""

    def observe(self, req, drafted: int, accepted: int) -> None:
        """`req` had `drafted` tokens verified this pass, of which the first `accepted` were accepted."""

    def __repr__(self) -> str:
        return self.name


class Off(SpecBudget):
    name = "off"


class Fixed(SpecBudget):
    """Up to `gamma` drafted tokens per decoding request in every pass."""

    def __init__(self, gamma: int = 3):
        self.gamma_max = _gamma("gamma", gamma)
        self.name = f"fixed:{gamma}"

    def choose(self, drafts, *, batch, riding=0):
        return [min(n, self.gamma_max) for _, n in drafts]


class BatchCap(Fixed):
    """vLLM's rule: `gamma` drafted tokens per request while fewer than `max_batch` requests run, none from there on."""

    def __init__(self, max_batch: int, gamma: int = 3):
        super().__init__(gamma)
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
        self.max_batch, self.name = max_batch, f"vllm:{max_batch}:{gamma}"

    def choose(self, drafts, *, batch, riding=0):
        return [0 for _ in drafts] if batch >= self.max_batch else super().choose(drafts, batch=batch)


class LoadAware(SpecBudget):
    """The measured rule of the module docstring. `cost`: a pass's seconds by its rows (`passcost.step_time(table)`,
    rows [(request, tokens)] -> seconds), or None to learn T(n) from the engine's own passes."""

    name = "auto"

    def __init__(self, cost=None, gamma_max: int = 8, prior: float = 4.0, probe_every: int = 8, decay: float = 0.8):
        self.gamma_max = _gamma("gamma_max", gamma_max)
        if not (isinstance(prior, (int, float)) and prior > 0):
            raise ValueError(f"prior must be a positive number of tokens, got {prior!r}")
        if not isinstance(probe_every, int) or probe_every < 1:
            raise ValueError(f"probe_every must be a positive integer, got {probe_every!r}")
        if cost is not None and not callable(cost):
            raise TypeError(f"cost must be a callable tokens -> seconds or None, got {type(cost).__name__}")
        self.cost, self.prior, self.probe_every, self.decay = cost, float(prior), probe_every, decay
        self.seen: dict[int, float] = {}   # tokens in a pass -> seconds (an EMA of the engine's passes)
        self.tested = self.accepted = 0    # pooled over every request verified
        self.idle: dict = {}               # request id -> passes since it last verified a drafted token
        self.since = 0                     # passes since any request verified one

    # ---- measured inputs -------------------------------------------------------------------

    def observe_pass(self, tokens: int, seconds: float) -> None:
        old = self.seen.get(tokens)
        self.seen[tokens] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds

    def observe(self, req, drafted: int, accepted: int) -> None:
        self.tested += accepted + (accepted < drafted)
        self.accepted += accepted

    def alpha(self, req) -> float | None:
        """Request `req`'s acceptance, pooled with everyone's (None: nothing verified yet)."""
        if not self.tested:
            return None
        pooled = self.accepted / self.tested
        return (req.accepted + self.prior * pooled) / (req.tested + self.prior)

    def pass_cost(self, tokens: int) -> float | None:
        """T(tokens): the given cost, else linear between the token counts seen (beyond them, the end slope)."""
        if self.cost is not None:
            return float(self.cost([(None, tokens)]))
        pts = sorted(self.seen.items())
        if len(pts) < 2:
            return None
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if tokens <= x1 or (x1, y1) == pts[-1]:
                return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
        return None  # not reached

    # ---- the decision ----------------------------------------------------------------------

    def choose(self, drafts, *, batch, riding=0):
        ks = [0] * len(drafts)
        alphas = [self.alpha(req) for req, _ in drafts]
        n = sum(1 for _ in drafts) + riding
        t_n = self.pass_cost(n)
        if t_n is None or any(a is None for a in alphas):  # nothing to decide from yet: probe one token each
            ks = [min(1, m) for _, m in drafts]
        else:
            emitted = float(len(drafts))
            cands = sorted(((alphas[i] ** j, -j, i) for i, (_, m) in enumerate(drafts) for j in range(1, m + 1)),
                           reverse=True)
            for gain, neg_j, i in cands:
                if ks[i] != -neg_j - 1:
                    continue  # the token before it was not kept
                t_next = self.pass_cost(n + 1)
                if gain * t_n > emitted * (t_next - t_n):
                    ks[i], n, emitted, t_n = ks[i] + 1, n + 1, emitted + gain, t_next
            if not any(ks) and self.since + 1 >= self.probe_every:  # a probe: the request that waited longest
                i = max(range(len(drafts)), key=lambda i: (drafts[i][1] > 0, self.idle.get(drafts[i][0].id, 0)))
                ks[i] = min(1, drafts[i][1])
        self.idle = {req.id: 0 if k else self.idle.get(req.id, 0) + 1 for (req, _), k in zip(drafts, ks)}
        self.since = 0 if any(ks) else self.since + 1
        return ks


def spec_budget(spec: str | SpecBudget | None) -> SpecBudget:
    """A budget from its name: "off", "fixed:N", "vllm:B" or "vllm:B:N" (off from B running requests), "auto"."""
    if isinstance(spec, SpecBudget):
        return spec
    if spec is None or spec == "off":
        return Off()
    if spec == "auto":
        return LoadAware()
    m = re.fullmatch(r"fixed:(\d+)|vllm:(\d+)(?::(\d+))?", spec) if isinstance(spec, str) else None
    if m is None:
        raise ValueError(f"spec_budget must be 'off', 'fixed:N' (N drafted tokens, 1..{GAMMA_LIMIT}), 'vllm:B' or "
                         f"'vllm:B:N' (off from B running requests) or 'auto', got {spec!r}")
    if m.group(1):
        return Fixed(int(m.group(1)))
    return BatchCap(int(m.group(2)), int(m.group(3)) if m.group(3) else 3)
