"""What a server that runs for weeks needs from the engine: a pass never over its token budget (drafts counted), a
bounded step history, and a failure that stays with its own request (a listener, a command the engine refuses)."""
from __future__ import annotations

import asyncio
import threading
import warnings

import pytest
import torch

from labkit.model import ModelConfig
from labkit.model.transformer import Transformer
from labkit.serving import Engine, Request
from labkit.serving.engine.budget import GAMMA_LIMIT, spec_budget
from labkit.serving.engine.runtime import EngineThread
from labkit.speculative import PromptLookup

CFG = ModelConfig(vocab_size=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=128)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return Transformer(CFG).eval()


def _repeating(i: int, n: int = 24) -> list[int]:
    return [(3 + i + t % 5) % CFG.vocab_size for t in range(n)]  # prompt lookup finds drafts in a repeating prompt


class FullDrafter:
    """Always drafts `gamma` tokens (the next ids in turn): decoding rows that fill their share of every pass."""

    def propose(self, history, gamma, params=None, generator=None):
        return [(history[-1] + 1 + j) % CFG.vocab_size for j in range(gamma)], None


def test_orca_counts_drafted_tokens_against_the_budget(tiny):
    """The recorded defect (a 42-token pass under a budget of 32): orca admitted prompts with `token_budget - len(rows)`
    while decoding rows already carried their drafts. Drafts are now planned after the prompt rows, from the exact
    room left, so no pass can exceed the budget whatever a policy admits (and orca counts tokens too): this case,
    decoding rows that would draft 8 each while prompts of 20 arrive, checks the property, not one line."""
    reqs = [Request(i, _repeating(i, 6), 24) for i in range(2)]  # decoding, 8 drafts each: 18 tokens a pass
    reqs += [Request(i, _repeating(i, 20), 10, arrival=0.05) for i in range(2, 4)]  # prompts of 20 to admit
    engine = Engine(tiny, policy="orca", max_batch=4, token_budget=32, block_size=4, num_blocks=80,
                    drafter=FullDrafter(), spec_budget="fixed:8", pass_time=lambda rows: 0.01)  # the prompts come
    replay = engine.replay(reqs)  # at pass 5 on a modelled clock, whatever this machine's speed
    assert any(s.drafted and len(s.rows) > 2 for s in replay.steps), "no prompt rode with drafting rows"
    assert max(s.n_tokens for s in replay.steps) <= 32
    assert engine.cache.tables.n_free == engine.cache.tables.num_blocks


def test_the_engine_keeps_a_bounded_window_of_its_passes_and_a_replay_keeps_all(tiny):
    reqs = [Request(i, _repeating(i, 8), 12, arrival=0.001 * i) for i in range(3)]
    engine = Engine(tiny, policy="chunked", max_batch=2, token_budget=16, block_size=4, num_blocks=40, keep_steps=5)
    replay = engine.replay(reqs)
    assert engine.n_steps == len(replay.steps) > 5
    assert len(engine.steps) == 5 and [s.index for s in engine.steps] == [s.index for s in replay.steps[-5:]]
    assert [s.index for s in replay.steps] == list(range(engine.n_steps))
    assert {i for r in reqs for i, _ in r.steps} <= set(range(engine.n_steps))
    with pytest.raises(ValueError, match="keep_steps"):
        Engine(tiny, keep_steps=0)


def test_a_listener_that_fails_ends_its_own_request_only(tiny):
    reqs = [Request(i, _repeating(i, 8), 10) for i in range(3)]
    engine = Engine(tiny, policy="continuous", max_batch=3, token_budget=64, block_size=4, num_blocks=40)
    heard = {r.id: [] for r in reqs}

    def listener(req, token):
        if req.id == 1 and len(heard[1]) == 3:
            raise RuntimeError("a client's bug")
        heard[req.id].append(token)

    for r in reqs:
        engine.add(r, listener)
    while engine.scheduler.has_work:
        engine.step()
    assert reqs[1].finish_reason == "error" and "a client's bug" in reqs[1].error
    assert [r.finish_reason for r in (reqs[0], reqs[2])] == ["length", "length"]
    assert heard[0][-1] is None and heard[2][-1] is None and len(heard[0]) == 11
    assert engine.cache.tables.n_free == engine.cache.tables.num_blocks and not engine.listeners


def test_a_command_the_engine_refuses_fails_that_request_alone(tiny):
    """A prompt token outside the vocabulary passes the caller's check and is refused in the engine thread: before,
    that failed every request in flight and left this one's client waiting for ever."""
    engine = Engine(tiny, policy="chunked", max_batch=2, token_budget=16, block_size=4, num_blocks=40)
    thread = EngineThread(engine, request_timeout=30)
    ended = {}
    done = threading.Event()

    def sink(req, token):
        if token is None:
            ended[req.id] = req.finish_reason
            if len(ended) == 2:
                done.set()

    thread.start()
    try:
        thread.submit(Request("good", _repeating(0, 8), 20), sink)
        thread.submit(Request("bad", [1, 2, CFG.vocab_size + 5], 4), sink)
        assert done.wait(30), f"a request never ended: {ended}"
    finally:
        thread.stop()
    assert ended == {"good": "length", "bad": "error"}
    assert not thread.live and engine.cache.tables.n_free == engine.cache.tables.num_blocks


def test_drafts_stay_within_the_row_invariant_pass_and_a_larger_budget_is_flagged(tiny):
    assert GAMMA_LIMIT == 15  # a row of 1 + 15 tokens: the 16 that stay row-invariant
    with pytest.raises(ValueError, match="spec_budget|gamma"):
        spec_budget("fixed:16")
    with pytest.warns(UserWarning, match="token_budget <= 16"):
        Engine(tiny, token_budget=32, batch_invariant=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Engine(tiny, token_budget=16, batch_invariant=True, block_size=4)


def test_stream_logprobs_are_read_up_to_the_tokens_delivered():
    """The engine thread appends a token's logprob before its event reaches the handler: reading up to
    len(req.token_logprobs) took an entry whose token was not yet delivered, and it was lost for good."""
    from labkit.serving.http.app import _Run

    class Job:
        kind, logprobs, stop = "chat", 1, None

    class Tok:
        def token_bytes(self, i):
            return bytes([97 + i])

    req = Request(0, [1, 2], 4)

    async def go():
        run = _Run.__new__(_Run)
        run.job, run.seen, run.heard, run.reqs = Job(), {0: 0}, {0: 0}, [req]
        run.srv = type("Srv", (), {"tok": Tok()})()
        req.output.append(5)
        req.token_logprobs.append((-0.1, [(5, -0.1)]))
        run.heard[0] += 1  # the first token's event was taken
        req.token_logprobs.append((-0.2, [(6, -0.2)]))  # the engine is ahead: the second token's event still queued
        first = run.logprobs(req)
        req.output.append(6)
        run.heard[0] += 1
        return first, run.logprobs(req)

    first, second = asyncio.run(go())
    assert len(first) == 1 and len(second) == 1, "an entry was skipped or read twice"
    assert second[0]["logprob"] == pytest.approx(-0.2)


class CountingHead:
    """Drafts after the budget's decision, as a head does, counting every token it drafts."""

    drafts_after_budget = True

    def __init__(self):
        self.drafted = 0

    def propose(self, history, gamma, params=None, generator=None):
        self.drafted += gamma
        return [(history[-1] + 1 + j) % CFG.vocab_size for j in range(gamma)], None


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=30, deadline=None)
@given(policy=st.sampled_from(["static", "continuous", "orca", "chunked"]),
       budget=st.sampled_from(["fixed:3", "fixed:8", "fixed:15", "vllm:2:4", "auto"]), token_budget=st.sampled_from([16, 32]),
       max_batch=st.integers(1, 5), lengths=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12), st.floats(0, 0.02)),
                                                     min_size=1, max_size=7))
def test_every_policy_keeps_its_budget_and_verifies_every_drafted_token(tiny, policy, budget, token_budget, max_batch,
                                                                         lengths):
    """Over random traces: no pass over its token budget, every token a head drafts verified (none thrown away after
    it was drafted), every block given back."""
    reqs = [Request(i, _repeating(i, p), r, arrival=a) for i, (p, r, a) in enumerate(lengths)]
    if policy != "chunked" and any(r.max_len > token_budget for r in reqs):
        return
    head = CountingHead()
    engine = Engine(tiny, policy=policy, max_batch=max_batch, token_budget=token_budget, block_size=4, num_blocks=40,
                    drafter=head, spec_budget=budget)
    replay = engine.replay(reqs)
    assert max(s.n_tokens for s in replay.steps) <= token_budget
    assert head.drafted == sum(r.drafted for r in reqs) == sum(s.drafted for s in replay.steps)
    assert engine.cache.tables.n_free == engine.cache.tables.num_blocks and not engine.cache.tables.tables
    assert all(r.finish_reason == "length" for r in reqs)


def test_stopping_the_server_takes_a_drafters_hooks_off_the_model(tiny):
    from labkit.serving.http.server import Server

    class Closing(PromptLookup):
        closed = 0

        def close(self):
            self.closed += 1

    drafter = Closing()
    server = Server(tiny, None, "tiny", policy="chunked", max_batch=2, token_budget=16, block_size=4, num_blocks=16,
                    drafter=drafter)
    assert server.engine.engine.steps.maxlen == 1024  # a server keeps a bounded window of its passes
    server.stop()
    assert drafter.closed == 1


def _thread_run(tiny, submit):
    """Start an engine thread, let `submit(thread, sink)` queue requests, wait until each has ended: (ends, thread)."""
    engine = Engine(tiny, policy="chunked", max_batch=3, token_budget=16, block_size=4, num_blocks=40)
    thread = EngineThread(engine, request_timeout=30)
    ended, done = {}, threading.Event()
    expected = []

    def sink(req, token):
        if token is None:
            ended[id(req)] = req.finish_reason
            if len(ended) == len(expected):
                done.set()
        elif getattr(req, "explode_at", None) == len(req.output):
            raise RuntimeError("the client's event loop is closed")

    thread.start()
    try:
        expected.extend(submit(thread, sink))
        assert done.wait(30), f"a request never ended: {ended}"
    finally:
        thread.stop()
    return [ended[id(r)] for r in expected], thread


def test_a_sink_that_fails_ends_its_request_and_frees_its_place(tiny):
    def submit(thread, sink):
        good, bad = Request("good", _repeating(0, 8), 12), Request("bad", _repeating(1, 8), 12)
        bad.explode_at = 3
        for r in (good, bad):
            thread.submit(r, sink)
        return [good, bad]

    ends, thread = _thread_run(tiny, submit)
    assert ends == ["length", "error"]
    assert not thread.live, "the failed request still counts as waiting: enough of them and every submit gets 429"
    assert thread.engine.cache.tables.n_free == thread.engine.cache.tables.num_blocks


def test_a_second_request_with_a_running_id_fails_alone(tiny):
    def submit(thread, sink):
        first, second = Request("same", _repeating(0, 8), 20), Request("same", _repeating(1, 8), 4)
        thread.submit(first, sink)
        thread.submit(second, sink)
        return [first, second]

    ends, _ = _thread_run(tiny, submit)
    assert ends == ["length", "error"]  # the first runs to its end; only the duplicate is refused


class ShortHead(CountingHead):
    """A head that drafts one token fewer than it is asked for (none when asked for one)."""

    def propose(self, history, gamma, params=None, generator=None):
        tokens, q = super().propose(history, gamma, params, generator)
        self.drafted -= 1
        return tokens[:-1], q


def test_a_head_that_drafts_short_gives_back_the_blocks_kept_for_it(tiny):
    engine = Engine(tiny, policy="chunked", max_batch=3, token_budget=32, block_size=4, num_blocks=60,
                    drafter=ShortHead(), spec_budget="fixed:6")
    step, tables = engine.step, engine.cache.tables

    def checked(*args, **kwargs):
        ran = step(*args, **kwargs)
        for req in engine.scheduler.running:  # each holds the blocks of its verified tokens, no more
            assert len(tables.tables[req.id]) == -(-tables.lengths[req.id] // 4), req.id
        return ran

    engine.step = checked
    reqs = [Request(i, _repeating(i, 8), 16) for i in range(3)]
    engine.replay(reqs)
    assert sum(r.drafted for r in reqs) == engine.speculator.drafter.drafted > 0
    assert tables.n_free == tables.num_blocks


def test_a_failed_pass_leaves_no_draft_behind(tiny):
    from labkit.serving.engine.steps import PassFailed

    engine = Engine(tiny, policy="chunked", max_batch=2, token_budget=32, block_size=4, num_blocks=40,
                    drafter=CountingHead(), spec_budget="fixed:3")
    reqs = [Request(i, _repeating(i, 8), 16) for i in range(2)]
    for r in reqs:
        engine.add(r)
    engine.step()  # the prompts
    real = engine.model.forward
    engine.model.forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
    with pytest.raises(PassFailed):
        engine.step()
    engine.model.forward = real
    assert all(r.draft == [] and r.draft_q is None for r in reqs)
