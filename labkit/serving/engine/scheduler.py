"""Which requests run in the next step, and how many of their tokens: four batching policies.

In the spirit of nano-vllm's `Scheduler` and vLLM's: a queue of waiting requests, a list of running ones, and KV
blocks (`labkit.kvcache.blocks.BlockTables`) that every running request holds. Each step `schedule()` returns rows
`(request, n_tokens)` for one batched forward pass, under two limits: `max_batch` running requests and
`token_budget` tokens per pass, drafted tokens included. One place decides every token of a pass: `schedule`
plans the decoding rows and the prompt rows, then (in a speculating engine) asks the budget how many drafted
tokens each decoding row verifies, with the exact room the plan leaves (`_with_drafts`); a head drafts after
that, for the kept tokens only (`Speculator.draft`). Prompt tokens therefore come before drafted ones: speculation
takes only what the plan leaves, none under a backlog of prompts that fills the budget (vLLM v1 schedules a running
request's speculative tokens with it, before waiting prompts; here a draft never delays anyone's first token).

- **static**: wait for a full batch (or `max_wait_s`, or the end of the trace), reserve KV for every request's whole
  reply up front, run the batch until its last request ends. Nothing joins a batch in flight: a short reply's slot
  idles until the longest is done.
- **continuous** (vLLM v0's and nano-vllm's order): admit waiting requests whenever a
  slot, the blocks for the prompt and the budget allow; a step with new prompts is a
  *prefill-only* step (prefill has priority), otherwise every running request decodes one
  token. The running requests wait out every new prompt's pass.
- **orca** (Yu et al. 2022, "Orca", iteration-level scheduling with selective batching):
  every running request decodes one token *and* waiting requests are admitted with their
  whole prompt in the same pass, while the budget allows. No pass leaves the decoders out,
  but a long prompt makes that pass long.
- **chunked** (Agrawal et al. 2024, "Sarathi-Serve"; vLLM v1): every running request decodes first, then prompt
  chunks fill what is left of the budget, so a long prompt is prefilled a piece per step and never stalls the
  others' next tokens for long.

With `prefix_cache` (the engine's default), a request is admitted on the KV blocks an earlier request already
computed for the same first tokens (`BlockTables.cached_prefix`): a shared system prompt is prefilled once, and
later requests run only what follows it.

When a running request needs a block and none is free, the scheduler *preempts* the most recently admitted request
by recomputation (vLLM's default): its blocks are freed, it goes back to the front of the queue, and when readmitted
its prompt and the tokens it already produced are prefilled again. Nothing is swapped out to host memory.
"""
from __future__ import annotations

from collections import deque

from labkit import checks
from labkit.kvcache.blocks import BlockTables
from labkit.serving.engine.request import Request, Status

__all__ = ["Scheduler", "POLICIES"]

POLICIES = ("static", "continuous", "orca", "chunked")


class Scheduler:
    """Plan each step's rows over `blocks` (the KV block tables the engine's cache uses)."""

    def __init__(self, blocks: BlockTables, *, policy: str = "continuous", max_batch: int = 8,
                 token_budget: int = 256, context: int | None = None, max_wait_s: float = 1.0,
                 prefix_cache: bool = False):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        checks.positive_int("max_batch", max_batch)
        if not isinstance(token_budget, int) or token_budget < blocks.block_size:
            raise ValueError(f"token_budget must be an integer of at least one block ({blocks.block_size} tokens), "
                             f"got {token_budget!r}")
        if not (isinstance(max_wait_s, (int, float)) and max_wait_s >= 0):
            raise ValueError(f"max_wait_s must be a number >= 0, got {max_wait_s!r}")
        checks.flag("prefix_cache", prefix_cache)
        self.blocks, self.policy, self.prefix_cache = blocks, policy, prefix_cache
        self.max_batch, self.token_budget, self.context, self.max_wait_s = max_batch, token_budget, context, max_wait_s
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0
        self._hashes: dict = {}  # request id -> (tokens hashed, the chained hashes of its full blocks) while it waits
        self.speculator = None  # a speculating engine's `Speculator`: `_with_drafts` asks it and its budget

    # ---- requests ------------------------------------------------------------------------

    def add(self, req: Request) -> None:
        """Queue a request; ValueError if it could never run under these limits."""
        self.check(req)
        req.status = Status.WAITING
        self.waiting.append(req)

    def check(self, req: Request) -> None:
        """Raise ValueError if `req` could never run under these limits (it is not queued)."""
        bs = self.blocks.block_size
        if self.context is not None and req.max_len > self.context:
            raise ValueError(f"request {req.id!r}: prompt of {len(req.prompt)} tokens + max_new_tokens "
                             f"{req.max_new_tokens} exceeds the context of {self.context} tokens")
        if -(-req.max_len // bs) > self.blocks.num_blocks:
            raise ValueError(f"request {req.id!r} needs {-(-req.max_len // bs)} KV blocks, the cache has "
                             f"{self.blocks.num_blocks}; give the engine more num_blocks")
        if self.policy != "chunked" and req.max_len > self.token_budget:
            raise ValueError(f"request {req.id!r} may need {req.max_len} tokens in one prefill, above token_budget="
                             f"{self.token_budget}; use policy='chunked' or a larger token_budget")

    def finish(self, req: Request) -> None:
        """A request is done: free its blocks."""
        self.running.remove(req)
        self.blocks.free(req.id)
        req.status = Status.FINISHED

    def emit(self, req: Request, token: int, now: float) -> bool:
        """`req` produced `token` at `now`; a request that is done finishes (its blocks freed). Returns done."""
        done = req.add_token(token, now)
        if done:
            req.finish = now
            self.finish(req)
        return done

    def abort(self, req: Request, reason: str = "abort", message: str | None = None, now: float | None = None) -> bool:
        """Take `req` out wherever it is (waiting or running), free its blocks; False if it was not here."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        else:
            return False
        self._hashes.pop(req.id, None)
        if req.id in self.blocks.tables:
            self.blocks.free(req.id)
        req.fail(reason, message, now)
        return True

    def preempt(self, req: Request) -> None:
        """Recompute-preemption: free the blocks, back to the front of the queue."""
        self.running.remove(req)
        self.blocks.free(req.id)
        req.n_cached, req.status, req.draft, req.draft_q = 0, Status.WAITING, [], None
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step --------------------------------------------------------------------------

    def schedule(self, now: float = 0.0, draining: bool = False) -> list[tuple[Request, int]]:
        """Rows for the next pass: [(request, n_tokens)]; [] when nothing can run now.

        `now`: the clock (static batching waits up to `max_wait_s` for a full batch);
        `draining`: no more requests will arrive (static batching stops waiting).
        """
        if self.policy == "static":
            rows = self._static(now, draining)
        elif self.policy == "continuous":
            rows = self._continuous()
        elif self.policy == "orca":
            rows = self._orca()
        else:
            rows = self._chunked()
        return rows if self.speculator is None else self._with_drafts(rows)

    def _with_drafts(self, rows: list[tuple[Request, int]]) -> list[tuple[Request, int]]:
        """The planned rows with each decoding row's drafted tokens added: as many as the budget keeps, given the pass
        as planned (its decoding rows and the prompt rows riding along) and the exact room it leaves, cut further if
        the blocks for them are not free (a draft never preempts anyone). Prompt lookup has drafted by now (the
        decision reads what it found: `Speculator.offer`); a head drafts the kept tokens after this."""
        spec, budget = self.speculator, self.speculator.budget
        decode = [req for req, n in rows if n == 1 and req.decodes_next]
        offers = [(req, spec.offer(req)) for req in decode]
        offers = [(req, n) for req, n in offers if n > 0]
        if not offers:
            return rows
        room = self.token_budget - sum(n for _, n in rows)
        riding = sum(n for req, n in rows if not (n == 1 and req.decodes_next))
        ks = budget.choose(offers, batch=len(self.running), riding=riding, decoding=len(decode), planned=list(rows),
                           room=room)
        kept = {}
        for (req, n), k in zip(offers, ks):
            k = max(0, min(k, n, room))
            while k and not self.blocks.can_reserve(req.id, 1 + k):
                k -= 1
            if k:
                self.blocks.reserve(req.id, 1 + k)
                room -= k
            kept[id(req)] = spec.keep(req, k)
        return [(req, n + kept.get(id(req), 0)) for req, n in rows]

    def _cached(self, req: Request) -> list[int]:
        """Cached blocks the waiting request at the head of the queue can start on ([] without prefix caching).

        Its blocks' hashes are computed once and kept while it waits (they change only when a preempted
        request has produced more tokens), so a request waiting many steps is not hashed again at each.
        """
        if not self.prefix_cache or self.blocks.tables.get(req.id):
            return []
        n, hashes = self._hashes.get(req.id, (-1, None))
        if n != len(req.tokens):
            hashes = self.blocks.prefix_hashes(req.tokens)
            self._hashes[req.id] = (len(req.tokens), hashes)
        return self.blocks.cached_prefix(req.tokens, hashes)

    def _fits(self, req: Request, cached: list[int], n: int) -> bool:
        return self.blocks.fits_after(cached, n) if cached else self.blocks.can_reserve(req.id, n)

    def _admit(self, req: Request, n_reserve: int, cached: list[int] = ()) -> None:
        self.waiting.popleft()
        self._hashes.pop(req.id, None)
        if req.id not in self.blocks.tables:
            self.blocks.add(req.id)
        if cached:  # the prefix's keys and values are there already: the request starts after them
            req.n_cached = req.cached_tokens = self.blocks.adopt(req.id, cached)
        self.blocks.reserve(req.id, n_reserve)
        req.status = Status.RUNNING
        self.running.append(req)

    def _static(self, now: float, draining: bool) -> list[tuple[Request, int]]:
        if not self.running and self.waiting:
            full = len(self.waiting) >= self.max_batch
            if full or draining or now - self.waiting[0].arrival >= self.max_wait_s:
                while self.waiting and len(self.running) < self.max_batch:
                    req = self.waiting[0]
                    cached = self._cached(req)
                    n = req.max_len - len(cached) * self.blocks.block_size  # the whole reply, reserved up front
                    if not self._fits(req, cached, n):
                        break
                    self._admit(req, n, cached)
        rows, budget = [], self.token_budget
        for req in self.running:
            n = req.n_uncached
            if n > budget:
                break
            rows.append((req, n))
            budget -= n
        return rows

    def _admit_whole(self, budget: int) -> list[tuple[Request, int]]:
        """Admit waiting requests with their whole (uncached) prompt while a slot, the blocks and `budget` allow."""
        rows = []
        while self.waiting and len(self.running) < self.max_batch:
            req = self.waiting[0]
            cached = self._cached(req)
            n = req.n_uncached - len(cached) * self.blocks.block_size
            if n > budget or not self._fits(req, cached, n):
                break
            self._admit(req, n, cached)
            rows.append((req, n))
            budget -= n
        return rows

    def _continuous(self) -> list[tuple[Request, int]]:
        rows = self._admit_whole(self.token_budget)
        if rows:
            return rows  # prefill has priority: this step runs the new prompts only
        return self._decode_running(self.token_budget)

    def _orca(self) -> list[tuple[Request, int]]:
        rows = self._decode_running(self.token_budget)  # the running requests decode in every pass
        return rows + self._admit_whole(self.token_budget - sum(n for _, n in rows))  # tokens left, drafts counted

    def _chunked(self) -> list[tuple[Request, int]]:
        budget = self.token_budget
        rows = self._decode_running(budget)
        budget -= sum(n for _, n in rows)
        decoding = {id(req) for req, _ in rows}
        for req in list(self.running):  # requests part-way through their prompt: the next chunk
            if id(req) in decoding or budget == 0 or req not in self.running:
                continue
            n = min(req.n_uncached, budget)
            if not self._make_room(req, n):
                continue
            rows.append((req, n))
            budget -= n
        while self.waiting and len(self.running) < self.max_batch and budget > 0:
            req = self.waiting[0]
            cached = self._cached(req)
            n = min(req.n_uncached - len(cached) * self.blocks.block_size, budget)
            if not self._fits(req, cached, n):
                break
            self._admit(req, n, cached)
            rows.append((req, n))
            budget -= n
        return rows

    def _decode_running(self, budget: int) -> list[tuple[Request, int]]:
        """One token for every running request that has its whole prompt cached (oldest first), while the budget and
        the blocks allow (preempting the newest requests for a block); drafts are added once the pass is planned."""
        rows = []
        for req in list(self.running):
            if req not in self.running or not req.prefilled or req.n_uncached != 1 or budget == 0:
                continue
            if self._make_room(req, 1):
                rows.append((req, 1))
                budget -= 1
        return [(req, n) for req, n in rows if req in self.running]

    def _make_room(self, req: Request, n: int) -> bool:
        """Reserve blocks for n more tokens of `req`, preempting the newest requests if needed."""
        while not self.blocks.can_reserve(req.id, n):
            victim = self.running[-1]
            self.preempt(victim)
            if victim is req:
                return False
        self.blocks.reserve(req.id, n)
        return True

    # ---- disaggregated prefill ---------------------------------------------------------------------

    def add_prefilled(self, req: Request) -> None:
        """Run `req` from the next step on, never queued: its blocks here already hold the keys and values of
        all its tokens but the last (imported from a prefill instance), so it decodes."""
        if req.id not in self.blocks.tables:
            raise ValueError(f"request {req.id!r} holds no blocks here; import its keys and values first")
        if len(self.running) >= self.max_batch:
            raise ValueError(f"max_batch={self.max_batch} requests are running already; request {req.id!r} must wait")
        req.n_cached, req.status = self.blocks.lengths[req.id], Status.RUNNING
        self.running.append(req)
