"""How many drafted tokens each request may have verified in a pass: the speculation budget, four policies.

A serving engine that speculates (`Engine(model, drafter=PromptLookup(), spec_budget=...)`) asks
its budget, before every pass, how many of each decoding request's drafted tokens go into the
pass. A drafted token takes a slot in the pass like any other token; it pays only if it is
accepted, so what is worth verifying depends on the acceptance and on what a slot costs, which
depends on the load. One interface (`choose`, plus what the engine tells the budget after each
pass: `observe_pass`, `observe`, `observe_draft`), four policies:

- `Off()`: never draft (the engine without speculation);
- `Fixed(gamma)`: every decoding request verifies up to γ drafted tokens, whatever the load;
- `BatchCap(max_batch, gamma)`: vLLM's rule (v0's `speculative_disable_by_batch_size`):
  γ while fewer than `max_batch` requests run, no speculation at all from `max_batch` on;
- `LoadAware(...)`: the rule below, decided per pass from measured inputs only.

The load-aware rule. Inputs, all measured: request i's acceptance α_i, and the pass cost T(n).
α_i is an exponential moving average of the request's verifications: every drafted token the engine
tests (the accepted ones and the first rejected one) moves it toward 1 or 0 by a share 1 − `recency`
(0.5: the last few verifications count most), starting from the acceptance pooled over every request
verified so far (Laplace's rule: one accepted and one rejected token added, so it is never 0). Acceptance comes in runs (a request copying a passage from its prompt keeps being
right; one whose draft was just rejected often is again), so the recent outcome predicts better than
the request's whole history. T(n), the seconds of a pass of n tokens: a least-squares fit to the engine's
recent passes (the last `recent_passes`, 256 by default) whose token counts lie near n (n/2 to 2n + 16), with
the number of sequences in the pass as a second variable wherever the two vary apart (the prompt
chunks riding in a pass count as one sequence; beyond the counts fitted, T is extrapolated linearly). A drafted token
adds a token to the pass, not a sequence, and the keys and values that more sequences read (a large
part of a GPU pass, modelled) are then not charged to it. A cost can also be given beforehand
(`passcost.step_time(passcost.measure_pass_costs(...))`).

The plain pass holds N₀ = b + P tokens (b decoding rows, P prompt tokens riding along) and emits
E = b tokens. The j-th drafted token of request i emits α_i^j more tokens on average (it is
accepted only if the j − 1 before it were) and makes the pass one token longer. Candidates are
taken in order of α_i^j, and one is kept when it raises the pass's rate of emitted tokens:

    keep the token  iff  α_i^j / (T(N + 1) − T(N) + D)  >  E / (T(N) + D·K)

(N and E the pass so far, K its kept drafted tokens, all growing with every kept token; D the measured
seconds drafting one token takes when the drafter drafts after this decision, as a head does: one head step
per token. Prompt lookup drafts before it, in microseconds, and D is 0), and only while the pass has a slot
no prompt token is waiting for (`room`). When prompt tokens fill the token budget, a drafted token
would displace one: the prompt token must still run later, so the work grows by a token for a
saving of α_i^j < 1 token of decoding, a loss whatever T is (the batch capacity DSpark's argument
is about). Where T is flat in n (a memory-bound pass) almost any token with α > 0 is kept; where T
grows in proportion to n (compute-bound) a token is kept only if it is more likely to be accepted
than the pass's average token is to emit (E/N; prompt tokens riding along emit nothing).

With no acceptance measured yet, or T known at fewer than two token counts, every request verifies
one drafted token (a probe); and after `probe_every` consecutive passes in which requests had
drafts but none was kept, the one among them that waited longest verifies one, so that the pooled
α stays measured. A rejected probe doubles the wait before the next (up to 8 × `probe_every`), an
accepted one sets it back: a drafter that is rarely right (a head on text it does not predict) is
probed less and less, since every probe costs a verified token and, for a head, its drafting.
A single request whose α has fallen is not probed while others draft. The pooled acceptance (a new request's
starting α) is a mean over the engine's whole life, never decayed: on a long-running server it moves slowly, while
each request's own average takes over from its first verification.
"""
from __future__ import annotations

import re
from collections import deque

from labkit import checks
from labkit.quant.rows import INVARIANT_MAX_ROWS

__all__ = ["SpecBudget", "Off", "Fixed", "BatchCap", "LoadAware", "spec_budget", "pass_sequences", "GAMMA_LIMIT"]

# the most drafted tokens a request may carry in one pass: its row of 1 + 15 stays within the 16 row-invariant tokens
GAMMA_LIMIT = INVARIANT_MAX_ROWS - 1


def pass_sequences(decoding: int, riding: int) -> int:
    """The sequences a pass counts for its cost: one per decoding row, and one for all the prompt tokens riding
    along (however many requests they belong to). The engine reports its passes this way (`observe_pass`) and the
    load-aware budget predicts them this way."""
    return decoding + (riding > 0)


class SpecBudget:
    """The interface: `gamma_max` (0: the engine does not draft), `choose(...)`, `observe_pass`, `observe`."""

    name = "budget"
    gamma_max = 0

    def choose(self, drafts: list[tuple[object, int]], *, batch: int, riding: int = 0, decoding: int | None = None,
               room: int | None = None, planned: list | None = None) -> list[int]:
        """Per (request, drafted tokens it has), how many to verify this pass; `batch`: requests running,
        `riding`: prompt tokens this pass carries besides the decoding rows, `decoding`: decoding rows (default:
        one per request in `drafts`), `room`: token slots of the pass that no prompt token waits for (None:
        no limit), `planned`: the pass's rows before drafts, [(request, tokens)] (the scheduler's plan: decoding
        rows of one token, the prompt chunks riding along)."""
        return [0 for _ in drafts]

    def observe_pass(self, tokens: int, seconds: float, rows: int | None = None) -> None:
        """A pass of `tokens` tokens in `rows` sequences took `seconds` (the engine's wall time of the pass)."""

    def observe(self, req, drafted: int, accepted: int) -> None:
        """`req` had `drafted` tokens verified this pass, of which the first `accepted` were accepted."""

    def observe_draft(self, tokens: int, seconds: float) -> None:
        """A drafter that drafts after the decision (a head) took `seconds` to draft the `tokens` kept this pass."""

    def __repr__(self) -> str:
        return self.name


class Off(SpecBudget):
    name = "off"


class Fixed(SpecBudget):
    """Up to `gamma` drafted tokens per decoding request in every pass."""

    def __init__(self, gamma: int = 3):
        self.gamma_max = checks.integer("gamma", gamma, 1, GAMMA_LIMIT)
        self.name = f"fixed:{gamma}"

    def choose(self, drafts, *, batch, riding=0, decoding=None, room=None, planned=None):
        return [min(n, self.gamma_max) for _, n in drafts]


class BatchCap(Fixed):
    """vLLM's rule: `gamma` drafted tokens per request while fewer than `max_batch` requests run, none from there on."""

    def __init__(self, max_batch: int, gamma: int = 3):
        super().__init__(gamma)
        self.max_batch = checks.positive_int("max_batch", max_batch)
        self.max_batch, self.name = max_batch, f"vllm:{max_batch}:{gamma}"

    def choose(self, drafts, *, batch, riding=0, decoding=None, room=None, planned=None):
        return [0 for _ in drafts] if batch >= self.max_batch else super().choose(drafts, batch=batch)


class LoadAware(SpecBudget):
    """The measured rule of the module docstring. `cost`: a pass's seconds by its rows (`passcost.step_time(table)`,
    rows [(request, tokens)] -> seconds), or None to learn T(n) from the engine's own passes. A given cost is called
    with the pass's own rows (the scheduler's plan, the kept drafts added to their requests' rows), so it may read
    the requests; called without a plan, the budget makes one: a row of one token per request in `drafts`, and rows
    (None, tokens) for the other decoding rows and for the prompt tokens."""

    name = "auto"

    def __init__(self, cost=None, gamma_max: int = 8, recency: float = 0.5, probe_every: int = 8,
                 recent_passes: int = 256, **renamed):
        if "window" in renamed:
            raise ValueError(f"LoadAware has no window=; it is recent_passes= (how many of the engine's recent passes "
                             f"the pass-cost fit reads), got window={renamed['window']!r}")
        if renamed:
            raise TypeError(f"LoadAware got unexpected argument(s) {sorted(renamed)}")
        self.gamma_max = checks.integer("gamma_max", gamma_max, 1, GAMMA_LIMIT)
        checks.probability("recency", recency, high_open=True)
        checks.positive_int("probe_every", probe_every)
        checks.positive_int("recent_passes", recent_passes)
        if cost is not None and not callable(cost):
            raise TypeError(f"cost must be a callable tokens -> seconds or None, got {type(cost).__name__}")
        self.cost, self.recency, self.probe_every = cost, float(recency), probe_every
        self.probe_gap, self.probing = probe_every, set()  # passes between probes now; the request probed last pass
        self.recent: dict = {}             # request id -> its recency-weighted acceptance
        self.passes: deque = deque(maxlen=recent_passes)  # (tokens, seconds, sequences) of the recent passes
        self.tested = self.accepted = 0    # pooled over every request verified
        self.idle: dict = {}               # request id -> passes since it last verified a drafted token
        self.since = 0                     # passes since any request verified one
        self.drafts: deque = deque(maxlen=64)  # (tokens, seconds) of the recent drafting phases (`observe_draft`)

    # ---- measured inputs -------------------------------------------------------------------

    def observe_pass(self, tokens: int, seconds: float, rows: int | None = None) -> None:
        self.passes.append((tokens, seconds, tokens if rows is None else rows))

    def observe_draft(self, tokens: int, seconds: float) -> None:
        self.drafts.append((tokens, seconds))

    def draft_cost(self) -> float:
        """D: the seconds one kept drafted token's drafting takes, over the recent drafting phases of a drafter that
        drafts after the decision (0 for one that drafts before it, as prompt lookup: that work is done either way)."""
        tokens = sum(t for t, _ in self.drafts)
        return sum(s for _, s in self.drafts) / tokens if tokens else 0.0

    def observe(self, req, drafted: int, accepted: int) -> None:
        if req.id in self.probing:  # a rejected probe doubles the wait for the next (up to 8x); an accepted one resets it
            self.probing.discard(req.id)
            self.probe_gap = self.probe_every if accepted else min(2 * self.probe_gap, 8 * self.probe_every)
        a = self.alpha(req)
        self.tested += accepted + (accepted < drafted)
        self.accepted += accepted
        a = self.pooled() if a is None else a
        for outcome in [1.0] * accepted + [0.0] * (accepted < drafted):
            a = self.recency * a + (1 - self.recency) * outcome
        self.recent.pop(req.id, None)
        self.recent[req.id] = a
        if len(self.recent) > 4096:  # a long-running server: forget the request verified longest ago
            del self.recent[next(iter(self.recent))]

    def alpha(self, req) -> float | None:
        """Request `req`'s recency-weighted acceptance; before its first verification, everyone's pooled
        (None: nothing verified yet)."""
        if req.id in self.recent:
            return self.recent[req.id]
        return self.pooled() if self.tested else None

    def pooled(self) -> float:
        """Everyone's acceptance so far, with one accepted and one rejected token added (Laplace's rule): a few
        early rejections leave it small, not 0, so a drafter's first unlucky tokens do not shut it out for good."""
        return (self.accepted + 1) / (self.tested + 2)

    def line(self, tokens: int, rows: int | None = None):
        """T as a function of a pass's tokens n near `tokens`, its `rows` sequences held fixed: a least-squares fit to
        the recent passes with tokens/2 <= n <= 2·tokens + 16 (all of them if those hold fewer than two token
        counts), slope >= 0; None: fewer than two token counts seen yet. Where the passes' token and sequence counts
        vary apart, the fit is T = a + b·n + c·rows: a drafted token costs b, and the keys and values that more
        sequences read (c) are not charged to it."""
        near = [p for p in self.passes if tokens / 2 <= p[0] <= 2 * tokens + 16]
        pts = near if len({p[0] for p in near}) >= 2 else list(self.passes)
        if len({p[0] for p in pts}) < 2:
            return None
        m = len(pts)
        mx, my, mr = (sum(p[i] for p in pts) / m for i in (0, 1, 2))
        sxx = sum((p[0] - mx) ** 2 for p in pts)
        srr = sum((p[2] - mr) ** 2 for p in pts)
        sxr = sum((p[0] - mx) * (p[2] - mr) for p in pts)
        sxy = sum((p[0] - mx) * (p[1] - my) for p in pts)
        sry = sum((p[2] - mr) * (p[1] - my) for p in pts)
        det = sxx * srr - sxr * sxr
        if rows is not None and det > 0.05 * sxx * srr:  # tokens and rows vary apart (r² < 0.95): two slopes
            b, c = (sxy * srr - sry * sxr) / det, (sry * sxx - sxy * sxr) / det
            b = max(0.0, b)
            return lambda n: max(0.0, my + b * (n - mx) + c * (rows - mr))  # extrapolated: never below 0 s
        slope = max(0.0, sxy / sxx)
        return lambda n: max(0.0, my + slope * (n - mx))

    def pass_cost(self, tokens: int) -> float | None:
        """T(tokens) from `line`, or from the given cost as one row of `tokens` (None: not known yet)."""
        if self.cost is not None:
            return float(self.cost([(None, tokens)]))
        f = self.line(tokens)
        return None if f is None else f(tokens)

    def _pass_time(self, drafts, riding: int, rows: int, planned):
        """ks -> T of the pass with ks[i] drafted tokens added to drafts[i]'s row (None: T not known yet)."""
        if self.cost is None:
            line, base = self.line(rows + riding, rows=pass_sequences(rows, riding)), rows + riding
            return None if line is None else (lambda ks: line(base + sum(ks)))
        others = [(None, rows - len(drafts))] if rows > len(drafts) else []  # decoding rows without drafts
        plan = list(planned) if planned is not None else \
            [(req, 1) for req, _ in drafts] + others + ([(None, riding)] if riding else [])
        at = {id(req): i for i, (req, _) in enumerate(drafts)}
        return lambda ks: float(self.cost([(req, n + (ks[at[id(req)]] if id(req) in at else 0)) for req, n in plan]))

    # ---- the decision ----------------------------------------------------------------------

    def choose(self, drafts, *, batch, riding=0, decoding=None, room=None, planned=None):
        ks, self.probing = [0] * len(drafts), set()
        alphas = [self.alpha(req) for req, _ in drafts]
        rows = len(drafts) if decoding is None else max(decoding, len(drafts))
        room = float("inf") if room is None else room
        pass_time, d = self._pass_time(drafts, riding, rows, planned), self.draft_cost()
        cost = None if pass_time is None else (lambda ks: pass_time(ks) + d * sum(ks))  # the step: pass + drafting
        t_n = None if cost is None else cost(ks)
        if t_n is None or any(a is None for a in alphas):  # nothing to decide from yet: probe one token each
            ks = [min(1, m) for _, m in drafts]
        else:
            emitted = float(rows)
            cands = sorted(((alphas[i] ** j, -j, i) for i, (_, m) in enumerate(drafts) for j in range(1, m + 1)),
                           reverse=True)
            for gain, neg_j, i in cands:
                if ks[i] != -neg_j - 1:
                    continue  # the token before it was not kept
                if room <= 0:
                    break  # every slot left is wanted by a prompt token: a draft would only displace it
                t_next = cost(ks[:i] + [ks[i] + 1] + ks[i + 1:])
                if gain * t_n > emitted * (t_next - t_n):
                    ks[i], emitted, t_n, room = ks[i] + 1, emitted + gain, t_next, room - 1
            if not any(ks) and self.since + 1 >= self.probe_gap:  # a probe: the request that waited longest
                i = max(range(len(drafts)), key=lambda i: (drafts[i][1] > 0, self.idle.get(drafts[i][0].id, 0)))
                ks[i] = min(1, drafts[i][1])
                self.probing = {drafts[i][0].id}
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
