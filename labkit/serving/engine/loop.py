"""The engine: a scheduler, a packed paged KV cache and a model, stepping together.

Each `step()` asks the scheduler for rows, packs their next tokens into one row of ids, runs the model once over
the `PagedBatch` (`labkit.kvcache.batch`), and gives every request that has caught up its next token (sampled
with its own parameters and seed). Finished requests free their blocks at once, so the next step can admit someone.

`replay(requests)` runs a trace on a *measured virtual clock*: it advances by each step's real wall
time and jumps over idle gaps to the next arrival, so a trace with long pauses runs in seconds.

    engine = Engine(model, policy="chunked", max_batch=8, token_budget=64)
    report = engine.replay(requests)          # the requests, now with their times
"""
from __future__ import annotations

import logging
import warnings
from collections import deque
from contextlib import nullcontext

import torch

from labkit import checks
from labkit.kvcache.batch import PagedBatch
from labkit.measure import Stopwatch
from labkit.model.kernels import batch_invariant as invariant
from labkit.quant.rows import INVARIANT_MAX_ROWS
from labkit.sampling.pipeline import sample_next
from labkit.serving.engine.budget import pass_sequences
from labkit.serving.engine.request import Request, Status
from labkit.serving.engine.scheduler import Scheduler
from labkit.serving.engine.steps import PassFailed, Replay, Step, _bar, _logprobs, run_trace
from labkit.serving.engine.speculate import Speculator

__all__ = ["Engine", "Step", "Replay", "run_trace", "PassFailed"]

log = logging.getLogger("labkit.serving")


class Engine:
    """Serve `model` with a `policy` ("static", "continuous", "orca" or "chunked", see `labkit.serving.engine.scheduler`).

    The KV pool holds `num_blocks` blocks of `block_size` tokens (default: room for `max_batch` requests of the whole
    context). `prefix_cache` (on by default, as in vLLM and nano-vllm): every full block a request computes is kept
    under the hash of its tokens, and a later request that starts with the same blocks reuses them.

    `drafter` (a `labkit.speculative` drafter, e.g. `PromptLookup()`) turns speculation on, with
    `spec_budget` deciding per pass how many drafted tokens each request verifies ("off", "fixed:N",
    "vllm:B[:N]", "auto" or a `labkit.serving.engine.budget.SpecBudget`; see `labkit.serving.engine.speculate`).
    `batch_invariant`: every pass of up to 16 tokens gives each row the bits it gets alone (the model's
    switch, and each query attending alone), so a request's greedy reply does not depend on what shares its
    passes: with drafts or without, under any load.
    `pass_time(rows) -> seconds` (rows [(request, tokens)]): the clock advances by it instead of the pass's wall
    time, and the budget sees it as the pass's cost (`passcost.step_time`, or a GPU's modelled pass); the host's
    work is left out unless `host_time=True` adds this machine's measured rest of the step. Without it the clock
    covers the step's whole work. Every `Step` records the measured parts (`Step.parts`).
    `keep_steps`: how many recent `Step`s `steps` keeps (None: all; `labkit serve`: 1,024); `n_steps` counts all.
    """

    def __init__(self, model, *, policy: str = "continuous", max_batch: int = 8, token_budget: int = 256,
                 block_size: int = 16, num_blocks: int | None = None, max_wait_s: float = 1.0,
                 prefix_cache: bool = True, drafter=None, spec_budget=None, batch_invariant: bool = False,
                 pass_time=None, host_time: bool = False, keep_steps: int | None = None):
        checks.positive_int("block_size", block_size)
        checks.positive_int("max_batch", max_batch)
        if num_blocks is None:
            num_blocks = max_batch * -(-model.config.max_seq_len // block_size)
        self.model = model
        self.cache = PagedBatch(model.config, num_blocks=num_blocks, block_size=block_size, dtype=model.dtype,
                                device=model.device)
        self.scheduler = Scheduler(self.cache.tables, policy=policy, max_batch=max_batch, token_budget=token_budget,
                                   context=model.config.max_seq_len, max_wait_s=max_wait_s, prefix_cache=prefix_cache)
        checks.flag("batch_invariant", batch_invariant)
        if batch_invariant and token_budget > INVARIANT_MAX_ROWS:
            warnings.warn(f"batch_invariant=True with token_budget={token_budget}: only passes of up to "
                          f"{INVARIANT_MAX_ROWS} tokens give each row its bits alone, so a reply is exact by "
                          f"construction only with token_budget <= {INVARIANT_MAX_ROWS}", stacklevel=2)
        if keep_steps is not None:
            checks.positive_int("keep_steps", keep_steps)
        if drafter is None and spec_budget not in (None, "off"):
            raise ValueError(f"spec_budget={spec_budget!r} needs a drafter (drafter=None: the engine does not speculate, "
                             f"so a budget would do nothing); pass drafter=, or leave spec_budget out")
        self.speculator = None if drafter is None else Speculator(
            drafter, "auto" if spec_budget is None else spec_budget, paged=self.cache)
        if self.speculator is not None:
            self.scheduler.speculator = self.speculator  # the scheduler decides every token of a pass
        if pass_time is not None and not callable(pass_time):
            raise ValueError(f"pass_time must be None or a callable rows -> seconds, got {type(pass_time).__name__}")
        self.pass_time = pass_time
        self.host_time = checks.flag("host_time", host_time)
        self.batch_invariant = batch_invariant
        self.steps = [] if keep_steps is None else deque(maxlen=keep_steps)  # the recent passes (`keep_steps`)
        self.n_steps = 0  # passes run, all of them
        self.listeners: dict = {}  # request id -> callable(request, token) (the server streams through it)

    @property
    def policy(self) -> str:
        return self.scheduler.policy

    def add(self, req: Request, listener=None) -> None:
        """Queue `req`; `listener(req, token)` hears each token, then `listener(req, None)` when it ends.

        ValueError, naming it, for a prompt token outside the vocabulary or an id already queued or running."""
        vocab = self.model.config.vocab_size
        bad = next((t for t in req.prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"request {req.id!r}: prompt token id {bad} is outside the vocabulary [0, {vocab})")
        if any(r.id == req.id for r in self.scheduler.running) or any(r.id == req.id for r in self.scheduler.waiting):
            raise ValueError(f"request id {req.id!r} is already queued or running; ids must be unique")
        self.scheduler.add(req)
        if listener is not None:
            self.listeners[req.id] = listener

    @torch.inference_mode()
    def step(self, now: float = 0.0, draining: bool = False, clock=None) -> Step | None:
        """Run one pass at time `now`; return it (None when nothing could run).

        The whole step is timed, in parts (`Step.parts`): scheduling, drafting, the pass, verification and sampling,
        emitting. Its tokens are given at `_end`'s time, or at `clock()` after the work when a clock is given.
        If the pass itself fails, `PassFailed` names its requests (the caller decides their fate); a request whose
        own sampling fails (bad parameters for these logits) ends alone, finish_reason "rejected", and the pass goes
        on for the others.
        """
        sw = Stopwatch()
        with sw.whole():
            if self.speculator is not None:
                self.speculator.offer_s = 0.0
            with sw.part("schedule"):  # every token of the pass: rows, prompt chunks, drafts kept (prompt lookup's)
                rows = self.scheduler.schedule(now, draining)
            if self.speculator is not None and self.speculator.offer_s:  # prompt lookup's drafting, inside the plan
                sw.add("schedule", -self.speculator.offer_s)
                sw.add("draft", self.speculator.offer_s)
            if not rows:
                return None
            try:
                if self.speculator is not None:
                    with sw.part("draft"):  # a head drafts the kept tokens only
                        rows = self._drafted(rows)
                with sw.part("pass"):
                    ids = [t for req, n in rows for t in req.next_tokens(n)]
                    self.cache.plan([(req.id, n) for req, n in rows], logits={req.id: n for req, n in rows if req.draft})
                    with invariant(self.model) if self.batch_invariant else nullcontext():
                        logits = self.model(torch.tensor([ids], device=self.model.device), cache=self.cache,
                                            last_only=True)[0]
                    if torch.isnan(logits).any():
                        raise ValueError("the model produced NaN logits; refusing to sample")
            except Exception as exc:
                for req, _ in rows:  # no draft outlives its pass
                    req.draft, req.draft_q = [], None
                raise PassFailed([req for req, _ in rows], exc) from exc
            pass_s = sw.totals()["pass"] if self.pass_time is None else float(self.pass_time(rows))
            if self.speculator is not None:  # sequences counted as the budget predicts them (`pass_sequences`)
                decoding = [req.decodes_next for req, _ in rows]
                riding = sum(n for (req, n), d in zip(rows, decoding) if not d)
                self.speculator.budget.observe_pass(len(ids), pass_s, rows=pass_sequences(sum(decoding), riding))
            with sw.part("verify and sample"):
                if self.scheduler.prefix_cache:  # the blocks this pass filled, findable by later requests
                    for req, _ in rows:
                        self.cache.tables.register_full(req.id, req.tokens)
                before = [req.n_cached for req, _ in rows]
                out, failed, drafted, accepted = self._choose_rows(rows, logits.float())
                if self.speculator is not None:  # what each row verified (a head drafts from their hidden states)
                    self.speculator.observe([(req, n, req.n_cached - b, b) for (req, n), b in zip(rows, before)])
            end = self._end(now, clock, sw, pass_s)
            with sw.part("emit"):
                for req, message in failed:
                    self.abort(req, "rejected", message, end)
                for req, tokens in out:
                    self._emit(req, tokens, end)
                for req, _ in rows:
                    req.draft, req.draft_q = [], None
                if self.speculator is not None:  # a head forgets the requests that ended
                    self.speculator.settle(self.scheduler)
        step = Step.after(self.n_steps, now, self._end(now, clock, sw, pass_s), rows, self.scheduler)
        step.drafted, step.accepted = drafted, accepted
        step.parts = sw.totals()
        if self.pass_time is not None:
            step.parts["pass (modelled)"] = pass_s
        if self.speculator is not None and self.speculator.modelled_s:
            step.parts["draft (modelled)"] = self.speculator.modelled_s
        self.steps.append(step)
        self.n_steps += 1
        return step

    def _drafted(self, rows):
        """The rows once a head has drafted its kept tokens; a row drafted short gives back the blocks kept for it."""
        drafted, tables = self.speculator.draft(rows), self.cache.tables
        for (req, planned), (_, n) in zip(rows, drafted):
            if n < planned:
                tables.truncate(req.id, tables.lengths[req.id])
                tables.reserve(req.id, n)
        return drafted

    def _end(self, now: float, clock, sw: Stopwatch, pass_s: float) -> float:
        """When this step's tokens are out: `clock()`, or `now` + the work timed so far (the pass's cost in
        place of its wall time when `pass_time` models it; the host's other work only when `host_time`; a modelled
        drafter's seconds, `draft_seconds`, always: the budget learns the pass's cost without them).
        Inside the step the parts so far count; after it, the whole (the gaps between parts included)."""
        if clock is not None:
            return clock()
        wall_pass = sw.totals().get("pass", 0.0)
        done = sw.whole_seconds or sum(sw.totals().values())
        host = done - wall_pass
        drafting = 0.0 if self.speculator is None else self.speculator.modelled_s  # a modelled head's, beside the pass
        return now + pass_s + drafting + (host if (self.pass_time is None or self.host_time) else 0.0)

    def _choose_rows(self, rows, logits):
        """Verify and sample every row of a pass: ([(request, [(token, logits)])], [(request, why it failed)],
        drafted, accepted). Nothing is emitted yet (the step's time must include this work first)."""
        out, failed, at, drafted, accepted = [], [], 0, 0, 0
        for req, n in rows:
            k = len(req.draft)
            row_logits, at = logits[at:at + k + 1], at + k + 1
            if k:  # drafted tokens: verify, keep what was accepted, roll the rest back
                try:
                    n_ok, token = self.speculator.verify(req, row_logits)
                except (ValueError, RuntimeError) as exc:
                    failed.append((req, f"sampling failed: {exc}"))
                    continue
                req.n_cached += 1 + n_ok
                req.steps.append((self.n_steps, n))
                self.cache.tables.truncate(req.id, req.n_cached)
                drafted, accepted = drafted + k, accepted + n_ok
                out.append((req, list(zip(req.draft[:n_ok] + [token], row_logits))))
                continue
            if not req.advance(n, self.n_steps):
                continue  # a prompt chunk: no token yet
            try:
                token = self._choose(req, row_logits[0])
            except (ValueError, RuntimeError) as exc:  # this request's parameters: it fails alone
                failed.append((req, f"sampling failed: {exc}"))
                continue
            out.append((req, [(token, row_logits[0])]))
        return out, failed, drafted, accepted

    def _emit(self, req: Request, tokens: list, end: float) -> None:
        """Give `req` its new tokens [(token, the logits it came from)] until it is done; tell its listener."""
        for token, row_logits in tokens:
            if req.logprobs is not None:
                req.token_logprobs.append(_logprobs(row_logits, token, req.logprobs))
            done = self.scheduler.emit(req, token, end)
            listener = self.listeners.get(req.id)
            if listener is not None:
                try:
                    listener(req, token)
                    if done:
                        self.listeners.pop(req.id)(req, None)
                except Exception as exc:  # a listener's bug fails its own request, and nothing else
                    log.exception("labkit serve: the listener of request %r failed; ending that request", req.id)
                    if done:
                        self.listeners.pop(req.id, None)
                    else:  # the abort tells the listener it ended (guarded), so its owner can let go of it
                        self.abort(req, "error", f"the request's listener failed: {type(exc).__name__}: {exc}", end)
                    return
            if done:
                return

    @staticmethod
    def _choose(req: Request, row_logits: torch.Tensor) -> int:
        if req.constraint is None:
            return sample_next(row_logits, req.penalty_history, req.params, req.generator)
        masked = req.constraint.apply(row_logits)  # the format's mask comes before every other processor
        token = sample_next(masked, req.penalty_history, req.params, req.generator)
        req.constraint.advance(token)
        return token

    def abort(self, req: Request, reason: str = "abort", message: str | None = None, now: float | None = None) -> bool:
        """End `req` now (a client that left, a deadline, a failure): its blocks are freed, its listener told."""
        found = self.scheduler.abort(req, reason, message, now)
        listener = self.listeners.pop(req.id, None)
        if listener is not None:
            try:
                listener(req, None)
            except Exception:  # a listener that fails at the end cannot take the engine with it
                log.exception("labkit serve: the listener of request %r failed when told it ended", req.id)
        return found

    def replay(self, requests: list[Request], progress: bool = False, max_steps: int = 100_000) -> Replay:
        """Serve `requests` (with their `arrival` times) to the end on the measured virtual clock."""
        bar = _bar(progress, sum(r.max_new_tokens for r in requests), self.policy)
        steps = []  # this replay's passes, all of them (the engine keeps `keep_steps`)

        def step(now, draining):
            ran = self.step(now, draining)
            if ran is not None:
                steps.append(ran)
            if ran is not None and bar is not None:  # tokens generated so far, over the most the trace may generate
                bar.n = sum(len(r.output) for r in requests)
                bar.refresh()
            return None if ran is None else ran.end

        run_trace(requests, self.add, step, self.scheduler, max_steps)
        if bar is not None:
            bar.close()
        return Replay(self.policy, list(requests), steps, self.scheduler.preemptions)

    # ---- disaggregated prefill (labkit.serving.studies.disagg) ------------------------------------------

    def hand_off(self, req: Request) -> tuple[torch.Tensor, torch.Tensor]:
        """Let running `req` (with its first token) go on elsewhere: its keys and values (a copy), its blocks freed."""
        if req not in self.scheduler.running or not req.output:
            raise ValueError(f"req {req.id!r} must be running here and have its first token to be handed off")
        keys, values = self.cache.export_kv(req.id)
        self.scheduler.running.remove(req)
        self.cache.tables.free(req.id)
        req.status = Status.WAITING  # in flight
        return keys, values

    def add_prefilled(self, req: Request, keys: torch.Tensor, values: torch.Tensor) -> bool:
        """Take on `req`, prefilled elsewhere: `keys`/`values` [n_layers, n, n_kv_heads, head_dim] of all its tokens
        but the last (`hand_off`'s); it decodes from the next step. False, nothing changed, when there is no room."""
        n = keys.shape[1] if keys.dim() == 4 else -1
        if n != len(req.tokens) - 1:
            raise ValueError(f"keys must hold all of request {req.id!r}'s {len(req.tokens)} tokens but the last, "
                             f"got shape {tuple(keys.shape)}")
        self.scheduler.check(req)
        if len(self.scheduler.running) >= self.scheduler.max_batch or not self.cache.tables.can_reserve(req.id, n):
            return False
        self.cache.import_kv(req.id, keys, values)
        self.scheduler.add_prefilled(req)
        return True
