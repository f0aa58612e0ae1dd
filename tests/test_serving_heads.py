"""The drafting heads inside the serving engine: each request drafts from its own last verified hidden state.

A head in the engine drafts, request by request, exactly what it drafts alone (`labkit.speculative.generate`):
the same drafted and accepted counts and the same reply, with a prompt prefilled in chunks over several passes.
Under load, with the prefix cache giving a later request its first blocks (so its head starts past position 0),
greedy replies equal the engine's without drafts and no block leaks; the server takes `--speculative mtp` and
counts drafted and accepted tokens under the drafter's name.
"""
from __future__ import annotations

import pytest

from labkit.serving import Engine, Request
from labkit.speculative import generate
from labkit.speculative.heads import MedusaDrafter, ZeroCopyDrafter
from labkit.speculative.mtp import MTPDrafter
from tests.smollm2_shared import smollm2

HEADS = [MTPDrafter, ZeroCopyDrafter, MedusaDrafter]
PROMPTS = ["Explain what a KV cache is in one paragraph.", "Write a Python function that reverses a string.",
           "List three primary colours.", "What is the capital of France?"]


def _chat(tok, text):
    return tok.encode_chat([{"role": "user", "content": text}])


@pytest.fixture(params=HEADS, ids=["mtp", "zero-copy", "medusa"])
def head(request):
    model, _ = smollm2()
    drafter = request.param.from_file(model)
    yield drafter
    drafter.close()


def test_a_head_drafts_in_the_engine_what_it_drafts_alone(head):
    model, tok = smollm2()
    alone = generate(model, head, tok, PROMPTS[0], gamma=3, max_new_tokens=24, chat=True)
    engine = Engine(model, drafter=head, spec_budget="fixed:3", policy="chunked", max_batch=2, token_budget=16,
                    batch_invariant=True)  # the prompt's 40-odd tokens prefill in chunks of 16: three passes
    req = engine.replay([Request(0, _chat(tok, PROMPTS[0]), 24)]).requests[0]
    assert req.output == alone.token_ids
    assert (req.drafted, req.accepted) == (sum(alone.proposed), alone.accepted)
    assert req.drafted > 0 and engine.speculator.heads.steps > 0


def test_greedy_replies_with_a_head_equal_the_engine_without_drafts_under_load(head):
    model, tok = smollm2()
    kw = dict(policy="chunked", max_batch=3, token_budget=48, batch_invariant=True)
    reqs = lambda: [Request(i, _chat(tok, p), 20, arrival=0.05 * i) for i, p in enumerate(PROMPTS)]  # noqa: E731
    want = [r.output for r in Engine(model, **kw).replay(reqs()).requests]
    engine = Engine(model, drafter=head, spec_budget="fixed:4", **kw)
    replay = engine.replay(reqs())
    assert [r.output for r in replay.requests] == want
    assert any(r.cached_tokens for r in replay.requests), "the shared chat prefix must come from the prefix cache"
    assert engine.cache.tables.n_free == engine.cache.tables.num_blocks, "a block leaked"
    assert sum(r.drafted for r in replay.requests) > 0
    assert not engine.speculator.heads.states or set(engine.speculator.heads.states) <= {r.id for r in replay.requests}


def test_under_auto_a_head_drafts_only_the_tokens_the_budget_keeps():
    """The budget decides before the head drafts: every head step makes a token that is verified (none is drafted
    and thrown away), and what drafting took reaches the budget as its per-token cost."""
    model, tok = smollm2()
    drafter = MTPDrafter.from_file(model)
    try:
        engine = Engine(model, drafter=drafter, spec_budget="auto", policy="chunked", max_batch=3, token_budget=48,
                        batch_invariant=True)
        replay = engine.replay([Request(i, _chat(tok, p), 16, arrival=0.05 * i) for i, p in enumerate(PROMPTS)])
    finally:
        drafter.close()
    drafted = sum(r.drafted for r in replay.requests)
    assert drafted > 0 and engine.speculator.heads.steps == drafted
    assert engine.speculator.budget.draft_cost() > 0


def test_a_server_drafts_with_a_head_and_counts_it_by_name():
    import urllib.request

    import openai

    from labkit.serving.http.server import Server

    model, tok = smollm2()
    drafter = MTPDrafter.from_file(model)
    try:
        with Server(model, tok, "smollm2-135m", max_batch=2, token_budget=64, num_blocks=64, drafter=drafter,
                    spec_budget="fixed:3") as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
            reply = client.completions.create(model="smollm2-135m", prompt="One, two, three, four,", max_tokens=12)
            metrics = urllib.request.urlopen(srv.url + "/metrics", timeout=30).read().decode()
    finally:
        drafter.close()
    spec = reply.usage.model_extra["speculation"]
    counts = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith("labkit:spec_decode")}
    assert spec["drafted_tokens"] > 0 and reply.usage.completion_tokens_details is None  # not OpenAI's field
    assert counts['labkit:spec_decode_num_draft_tokens_total{drafter="mtp"}'] == spec["drafted_tokens"]
    assert counts['labkit:spec_decode_num_accepted_tokens_total{drafter="mtp"}'] == spec["accepted_tokens"]


def test_under_load_each_request_drafts_what_it_drafts_alone():
    """Passes of at most 16 tokens (the batch-invariant mode's guarantee) and no prefix cache: every request's hidden
    states are the bits it gets alone, so at every position where the head drafts for a request under load, it drafts
    what it drafts for that request served alone from the same position (a chained greedy head: the shorter draft is a
    prefix of the longer). Rows routed to the wrong request would change the tokens. How many tokens a request drafts
    does depend on the load (prompt tokens come before drafted ones in a pass). Nothing is kept once requests end."""
    model, tok = smollm2()
    drafter = MTPDrafter.from_file(model)
    kw = dict(policy="chunked", max_batch=3, token_budget=16, batch_invariant=True, prefix_cache=False,
              drafter=drafter, spec_budget="fixed:4")

    def served(reqs):
        engine, seen = Engine(model, **kw), {}
        propose = engine.speculator.heads.propose

        def recording(req, gamma):
            tokens = propose(req, gamma)
            seen[(req.id, len(req.tokens))] = tokens
            return tokens

        engine.speculator.heads.propose = recording
        out = {r.id: r.output for r in engine.replay(reqs).requests}
        assert not engine.speculator.heads.states, "the head kept state for requests that ended"
        return out, seen

    try:
        together, under_load = served([Request(i, _chat(tok, p), 16, arrival=0.02 * i) for i, p in enumerate(PROMPTS)])
        compared = 0
        for i, p in enumerate(PROMPTS):
            out, alone = served([Request(i, _chat(tok, p), 16)])
            assert together[i] == out[i], i
            for key, tokens in under_load.items():
                if key[0] == i and key in alone:
                    n = min(len(tokens), len(alone[key]))
                    assert tokens[:n] == alone[key][:n], key
                    compared += n > 0
        assert compared >= 5, "too few positions drafted both ways to compare"
    finally:
        drafter.close()


def test_a_request_that_misses_a_pass_drafts_again_from_its_last_state():
    """Continuous batching runs a newcomer's prefill in a pass of its own, which the decoding request misses: the MTP
    head must draft again from the state it kept, not fail the step."""
    model, tok = smollm2()
    drafter = MTPDrafter.from_file(model)
    try:
        reqs = lambda: [Request(0, _chat(tok, PROMPTS[0]), 20), Request(1, _chat(tok, PROMPTS[1]), 8, arrival=1e-3)]  # noqa: E731
        kw = dict(policy="continuous", max_batch=2, token_budget=256, batch_invariant=True)
        want = [r.output for r in Engine(model, **kw).replay(reqs()).requests]
        engine = Engine(model, drafter=drafter, spec_budget="fixed:3", **kw)
        replay = engine.replay(reqs())
        assert [r.output for r in replay.requests] == want
        assert any(len(s.rows) == 1 and s.rows[0][0] == 1 for s in replay.steps), "no prefill-only pass happened"
    finally:
        drafter.close()
