"""Speculation inside the serving engine: drafts for decoding requests, verified in the engine's packed pass.

Before a pass, every running request that decodes (its prompt cached, one token to run) may take drafted tokens
(`labkit.speculative` drafters: `PromptLookup`, a `DraftModel`, or a drafting head, `MTPDrafter`, `ZeroCopyDrafter`,
`MedusaDrafter`, which drafts from the request's own last verified hidden state: `labkit.serving.engine.heads`).
The scheduler owns every token of the pass: once its rows are planned it asks the budget
(`labkit.serving.engine.budget`) how many go in, with the exact room the plan leaves (`Scheduler._with_drafts`,
which calls `offer` and `keep` here). Prompt lookup drafts first (microseconds; the decision reads how many it
found); a head is asked after the decision (`draft`), for the kept tokens only, since each of its tokens is a step
of its own. Such a request gets a row of 1 + k tokens (its last emitted token, then its k
drafted ones; in the pass, the decoding rows come before any prompt chunk: vLLM v1's order), and the pass keeps the logits of all
k + 1 positions of that row (`PagedBatch.plan(rows, logits=...)`). Verification is
`labkit.speculative.verify`'s: greedy requests accept the drafted tokens the target's argmax
agrees with, sampled ones accept x with probability min(1, p(x)/q(x)) and draw the first
rejected position from the residual, each request with its own sampling parameters, penalties
and seed. Every emitted token is therefore the target's: greedy replies are token for token those
of the engine without drafts (with `Engine(batch_invariant=True)`, where each row of a pass of up
to 16 tokens gets the bits it gets alone), and sampled replies are exact in distribution.
A seeded *sampled* request is exact in distribution but not reproducible under speculation: how many of its
drafts a pass verifies depends on the load (and, under `auto`, on measured times), and verification draws
its random numbers per drafted token, so the same seed can give another reply.

Rejected tokens are rolled back in the one paged store: the request's committed length is cut
to what was verified and the blocks past it go back to the pool (`BlockTables.truncate`); the
prefix cache registers blocks of the request's verified tokens only (its `tokens` never hold a
draft). A request under a format constraint, or one whose next token ends its reply, never drafts, and
a draft ends at its first stop token (nothing after it could be emitted).
"""
from __future__ import annotations

import torch

from labkit.measure.clock import now
from labkit.sampling import process_logits
from labkit.serving.engine.budget import SpecBudget, spec_budget
from labkit.serving.engine.heads import HeadDrafts, is_head
from labkit.speculative.verify import accept_greedy, accept_sampled

__all__ = ["Speculator"]


class Speculator:
    """A `drafter` (an object with `propose(history, gamma, params, generator)`) and a budget (see the module doc)."""

    def __init__(self, drafter, budget: str | SpecBudget = "auto", paged=None):
        if not hasattr(drafter, "propose"):
            raise TypeError(f"drafter must have propose(history, gamma, params, generator) (labkit.speculative."
                            f"PromptLookup(), DraftModel(model)), got {type(drafter).__name__}")
        self.heads = None
        if is_head(drafter):
            if paged is None:
                raise ValueError("a drafting head reads each request's hidden states and blocks: give the engine's "
                                 "cache (paged=)")
            self.heads = HeadDrafts(drafter, paged)
        elif hasattr(drafter, "attach"):
            raise ValueError(f"{type(drafter).__name__} drafts on the target's own cache; the serving engine's "
                             "packed cache is shared by every request: use PromptLookup, a DraftModel or a head")
        self.drafter, self.budget = drafter, spec_budget(budget)
        self.drafted = self.accepted = 0
        self._after = self.heads is not None or getattr(drafter, "drafts_after_budget", False)
        self.pending: list = []  # (request, tokens kept) a head drafts after the plan (`keep`, then `draft`)
        self.offer_s = 0.0  # seconds the drafter spent in `offer` since the engine last set this to 0 (its step)
        self.modelled_s = 0.0  # a modelled drafter's seconds for this step's drafting (`draft_seconds`; set by `draft`)

    @property
    def name(self) -> str:
        """The drafter's name as `labkit serve --speculative` spells it (the label of its /metrics counters)."""
        return self.heads.kind if self.heads is not None else {"PromptLookup": "prompt-lookup"}.get(
            type(self.drafter).__name__, type(self.drafter).__name__)

    def observe(self, rows) -> None:
        """After a pass: [(request, tokens it ran, of which verified, position of its first)] (a head keeps the
        verified hidden states; the other drafters read the tokens alone)."""
        if self.heads is not None and self.budget.gamma_max > 0:
            self.heads.observe(rows)

    def settle(self, scheduler) -> None:
        """After a step: a head drops what it kept for requests that are no longer running."""
        if self.heads is not None:
            self.heads.forget({req.id for req in scheduler.running})

    def offer(self, req) -> int:
        """How many drafted tokens `req` (a decoding row of the pass being planned) could verify: never past its
        reply's end, none under a format constraint. Prompt lookup or a draft model drafts them now, up to the
        budget's `gamma_max` (the decision reads how many it found; the time it takes is `offer_s`, which the
        engine counts as drafting, not scheduling); a head, or a drafter with
        `drafts_after_budget = True` (`specload.ModelledHead`), drafts nothing yet and offers what it could."""
        req.draft, req.draft_q = [], None
        room = min(self.budget.gamma_max, req.max_new_tokens - len(req.output) - 1) if req.constraint is None else 0
        if room <= 0:
            return 0
        if self._after:
            if self.heads is None:
                return room
            return min(room, self.heads.capacity) if self.heads.ready(req) else 0
        start = now()
        tokens, q = self.drafter.propose(req.tokens, room, req.params, req.generator)
        self.offer_s += now() - start
        self._keep(req, list(tokens)[:room], q)
        return len(req.draft)

    def keep(self, req, k: int) -> int:
        """The scheduler kept `k` of `req`'s offered tokens: a draft made already is cut to them; a head drafts them in
        `draft`, after the plan. Returns k."""
        if self._after:
            req.draft, req.draft_q = [], None
            if k:
                self.pending.append((req, k))
        else:
            self._keep(req, req.draft[:k], req.draft_q)
        return k

    def draft(self, rows):
        """After the plan: a head drafts the tokens the scheduler kept (`keep`), each a step of its own, timed for the
        budget (`observe_draft`): it pays for no token thrown away. Returns the rows, each as long as what was
        drafted (a head may stop short, at a stop token or without a state)."""
        pending, self.pending, self.modelled_s = self.pending, [], 0.0
        if not pending:
            return rows
        start, made = now(), 0
        for req, k in pending:
            tokens, q = (self.heads.propose(req, k), None) if self.heads is not None else \
                self.drafter.propose(req.tokens, k, req.params, req.generator)
            self._keep(req, list(tokens)[:k], q)
            made += len(req.draft)
        if made:  # a modelled head says what its drafting would take (the engine's clock adds it); a real one is timed
            seconds = self.drafter.draft_seconds(made) if hasattr(self.drafter, "draft_seconds") else None
            self.modelled_s = seconds or 0.0
            self.budget.observe_draft(made, now() - start if seconds is None else seconds)
        short = {id(req): k - len(req.draft) for req, k in pending}
        return [(req, n - short.get(id(req), 0)) for req, n in rows]

    @staticmethod
    def _keep(req, tokens: list[int], q) -> None:
        """`req`'s draft: `tokens` up to the first stop token (nothing after it could be emitted: the reply ends)."""
        stop = next((i + 1 for i, t in enumerate(tokens) if t in req.stop_ids), len(tokens))
        req.draft = tokens[:stop]
        req.draft_q = None if q is None or not req.draft else q[:len(req.draft)]

    def verify(self, req, logits: torch.Tensor) -> tuple[int, int]:
        """(drafted tokens accepted, the target's token after them) for `req`'s row: logits [k + 1, V]."""
        draft = req.draft
        tokens = torch.tensor(draft, dtype=torch.long)
        if req.params.plain_greedy:  # no processor can move the argmax: the raw rows, as `sample_next` reads them
            if not torch.isfinite(logits.amax(-1)).all():
                raise ValueError("logits contain NaN or +inf, or a row is all -inf; refusing to verify")
            processed = logits
        else:
            history = req.penalty_history
            processed = torch.stack([process_logits(logits[i], history + draft[:i], req.params)
                                     for i in range(len(draft) + 1)])
        if req.params.greedy:
            n, nxt = accept_greedy(processed, tokens)
        else:
            q = None if req.draft_q is None else req.draft_q[:len(draft)]
            n, nxt = accept_sampled(torch.softmax(processed, -1), q, tokens, req.generator)
        req.drafted, req.accepted = req.drafted + len(draft), req.accepted + n
        req.tested += n + (n < len(draft))
        self.drafted, self.accepted = self.drafted + len(draft), self.accepted + n
        self.budget.observe(req, len(draft), n)
        return n, nxt
