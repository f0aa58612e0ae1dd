"""Speculation inside the serving engine: greedy replies equal the engine's without drafts under every budget;
sampled replies are exact in distribution (and a wrong verifier is caught); rolled-back drafts leak no block and
never reach the prefix cache; the budget policies decide as derived."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import labkit
from labkit.kvcache.blocks import BlockTables, hash_block
from labkit.model import ModelConfig
from labkit.model.transformer import Transformer
from labkit.serving import Engine, Request
from labkit.serving.engine.budget import BatchCap, Fixed, LoadAware, Off, spec_budget
from labkit.speculative import DraftModel, PromptLookup
from tests.test_serving import block_invariants

CFG = ModelConfig(vocab_size=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=128)


def _peaked(seed: int) -> Transformer:
    """A random tiny model whose next-token distributions are far from uniform (its LM head scaled up), so that
    drafts are sometimes accepted and a biased verifier shows."""
    torch.manual_seed(seed)
    model = Transformer(CFG).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    return model


@pytest.fixture(scope="module")
def tiny():
    return _peaked(0)


@pytest.fixture(scope="module")
def shakespeare():
    return labkit.load("shakespeare")


def _requests(tok):
    text = ("ROMEO: But soft, what light through yonder window breaks? It is the east, and Juliet is the sun. "
            "Arise, fair sun, and kill the envious moon, who is already sick and pale with grief. ") * 3
    src = tok.encode(text)
    return [Request(i, src[i * 7: i * 7 + 30 + 5 * i], 24, arrival=0.01 * i) for i in range(5)]


# ---- greedy: token for token the engine without drafts ---------------------------------------------------


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
def test_greedy_replies_equal_the_engine_without_drafts_under_every_budget(shakespeare, policy):
    model, tok = shakespeare
    kw = dict(policy=policy, max_batch=4, token_budget=16 if policy == "chunked" else 96, batch_invariant=True)
    plain = Engine(model, **kw).replay(_requests(tok))
    want = [r.output for r in plain.requests]
    flat = LoadAware(cost=lambda rows: 1.0)  # a flat pass cost: the load-aware budget drafts everything it can
    for budget in ("off", "fixed:3", "vllm:3", "auto", flat):
        engine = Engine(model, drafter=PromptLookup(), spec_budget=budget, **kw)
        replay = engine.replay(_requests(tok))
        assert [r.output for r in replay.requests] == want, budget
        assert engine.cache.tables.n_free == engine.cache.tables.num_blocks, f"{budget}: a block leaked"
        drafted = sum(s.drafted for s in replay.steps)
        assert (drafted == 0) == (budget == "off"), budget
        assert drafted == sum(r.drafted for r in replay.requests)
        assert sum(s.accepted for s in replay.steps) == sum(r.accepted for r in replay.requests) <= drafted
    assert sum(r.accepted for r in replay.requests) > 0, "the trace must accept some drafts to test anything"


# ---- rollback: no block leaked, the prefix cache holds verified tokens only ------------------------------


class RandomDrafter:
    """Drafts random tokens (almost all rejected): the rollback path taken at nearly every pass."""

    def __init__(self, seed: int):
        self.g = torch.Generator().manual_seed(seed)

    def propose(self, history, gamma, params=None, generator=None):
        n = int(torch.randint(0, gamma + 1, (), generator=self.g))
        return torch.randint(0, CFG.vocab_size, (n,), generator=self.g).tolist(), None


def _books_match_the_requests(engine: Engine) -> None:
    tables = engine.cache.tables
    block_invariants(engine.scheduler)
    for req in engine.scheduler.running:  # nothing drafted stays: each holds its verified tokens' blocks only
        if req.n_cached:
            assert tables.lengths[req.id] == req.n_cached
            held, bs = len(tables.tables[req.id]), tables.block_size
            if engine.policy == "static":  # the whole reply is reserved up front, drafts never go past it
                assert held <= -(-req.max_len // bs)
            else:
                assert held == -(-req.n_cached // bs), "a rolled-back block is held"


@settings(max_examples=25, deadline=None)
@given(policy=st.sampled_from(["static", "continuous", "orca", "chunked"]), num_blocks=st.integers(10, 30),
       max_batch=st.integers(1, 5), gamma=st.integers(1, 6), seed=st.integers(0, 1000),
       lengths=st.lists(st.tuples(st.integers(1, 20), st.integers(1, 12)), min_size=1, max_size=7))
def test_drafted_and_rolled_back_tokens_leak_no_block(tiny, policy, num_blocks, max_batch, gamma, seed, lengths):
    src = [t % CFG.vocab_size for t in range(3, 40)]
    reqs = [Request(i, src[i:i + p], r, arrival=0.001 * i) for i, (p, r) in enumerate(lengths)]
    drafter = RandomDrafter(seed) if seed % 2 else PromptLookup()
    engine = Engine(tiny, policy=policy, max_batch=max_batch, token_budget=32, block_size=4, num_blocks=num_blocks,
                    drafter=drafter, spec_budget=f"fixed:{gamma}")
    if any(-(-r.max_len // 4) > num_blocks for r in reqs):
        return
    step = engine.step

    def checked(now=0.0, draining=False, clock=None):
        ran = step(now, draining, clock)
        _books_match_the_requests(engine)
        return ran

    engine.step = checked
    replay = engine.replay(reqs)
    assert engine.cache.tables.n_free == num_blocks and not engine.cache.tables.tables
    assert all(len(r.output) == r.max_new_tokens for r in reqs)
    assert max(s.n_tokens for s in replay.steps) <= 32, "a pass ran over its token budget"


def test_the_prefix_cache_registers_verified_tokens_only(tiny):
    src = [t % CFG.vocab_size for t in range(3, 60)]
    reqs = [Request(i, src[:20 + i], 14) for i in range(4)]
    engine = Engine(tiny, policy="chunked", max_batch=4, token_budget=32, block_size=4, num_blocks=40,
                    drafter=RandomDrafter(1), spec_budget="fixed:5")
    engine.replay(reqs)
    assert sum(r.drafted - r.accepted for r in reqs) > 20  # plenty was rolled back
    verified = set()
    for r in reqs:  # every chained block hash of every request's verified tokens
        parent = b""
        for i in range(len(r.tokens) // 4):
            parent = hash_block(parent, r.tokens[4 * i: 4 * i + 4])
            verified.add(parent)
    registered = set(engine.cache.tables.manager.hash_to_block)
    assert registered and registered <= verified


def test_truncate_gives_blocks_back_and_refuses_to_cut_registered_blocks():
    tables = BlockTables(8, 4)
    tables.add("a")
    tables.reserve("a", 10)
    tables.commit("a", 10)
    tables.register_full("a", list(range(10)))  # blocks 0 and 1 are full and registered
    tables.truncate("a", 9)
    assert len(tables.tables["a"]) == 3 and tables.n_free == 5
    tables.truncate("a", 8)
    assert len(tables.tables["a"]) == 2 and tables.n_free == 6 and tables.lengths["a"] == 8
    with pytest.raises(ValueError, match=r"length must be an integer in \[8, 8\]"):
        tables.truncate("a", 7)


# ---- sampled: exact in distribution ---------------------------------------------------------------------


def _marginals(model, prompt: list[int], steps: int) -> list[torch.Tensor]:
    """The exact distribution of each of the first `steps` tokens sampled at temperature 1 (all paths enumerated)."""
    V = CFG.vocab_size
    seqs, weights, out = [list(prompt)], torch.ones(1), []
    with torch.inference_mode():
        for _ in range(steps):
            p = torch.softmax(model(torch.tensor(seqs))[:, -1].double(), -1)  # [paths, V]
            joint = weights[:, None] * p
            out.append(joint.sum(0))
            seqs = [s + [x] for s in seqs for x in range(V)]
            weights = joint.reshape(-1)
    return out


def _sampled_counts(model, drafter, prompt, n=2500, steps=3):
    # a budget the prompts of 64 requests never fill: every pass leaves drafts their room (prompts come first)
    engine = Engine(model, policy="chunked", max_batch=64, token_budget=1280, block_size=8, num_blocks=400,
                    drafter=drafter, spec_budget="fixed:2")
    reqs = [Request(i, list(prompt), steps, seed=1000 + i, params={"temperature": 1.0}) for i in range(n)]
    engine.replay(reqs)
    counts = torch.zeros(steps, CFG.vocab_size, dtype=torch.float64)
    for r in reqs:
        for j, t in enumerate(r.output):
            counts[j, t] += 1
    return counts, sum(r.accepted for r in reqs), sum(r.drafted for r in reqs)


def _chi2(counts: torch.Tensor, p: torch.Tensor) -> tuple[float, int]:
    """χ² of counts against p, bins with fewer than 5 expected merged into one; (statistic, degrees of freedom)."""
    expected = p * counts.sum()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


CHI2_999 = {d: q for d, q in zip(range(1, 17), (10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88,
                                                  29.59, 31.26, 32.91, 34.53, 36.12, 37.70, 39.25))}


@pytest.fixture(scope="module")
def draft_tiny():
    return _peaked(1)


def _own_prompt(model) -> list[int]:
    """The model's own greedy text from token 1: it repeats itself, so prompt lookup's drafts are often accepted."""
    seq = [1]
    with torch.inference_mode():
        for _ in range(15):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    return seq


@pytest.mark.parametrize("kind", ["prompt-lookup", "draft-model"])
def test_sampled_replies_are_exact_in_distribution(tiny, draft_tiny, kind):
    prompt = _own_prompt(tiny)
    drafter = PromptLookup() if kind == "prompt-lookup" else DraftModel(draft_tiny)
    counts, accepted, drafted = _sampled_counts(tiny, drafter, prompt)
    assert drafted > 100 and 0 < accepted < drafted  # drafts accepted and rejected: both paths taken
    for j, p in enumerate(_marginals(tiny, prompt, counts.shape[0])):
        stat, dof = _chi2(counts[j], p)
        assert stat < CHI2_999[dof], (j, stat, dof)


def test_the_chi2_test_catches_a_verifier_that_forgets_the_residual(tiny, draft_tiny, monkeypatch):
    import labkit.serving.engine.speculate as speculate

    def wrong(p, q, draft, generator):  # after a rejection, draw from p itself: biased towards the drafted token
        for i in range(draft.numel()):
            x = int(draft[i])
            qx = 1.0 if q is None else float(q[i, x])
            if float(torch.rand((), generator=generator)) >= min(1.0, float(p[i, x]) / qx):
                return i, int(torch.multinomial(p[i], 1, generator=generator))
        return draft.numel(), int(torch.multinomial(p[draft.numel()], 1, generator=generator))

    monkeypatch.setattr(speculate, "accept_sampled", wrong)
    prompt = _own_prompt(tiny)
    counts, _, _ = _sampled_counts(tiny, PromptLookup(), prompt)
    stats = [_chi2(counts[j], p) for j, p in enumerate(_marginals(tiny, prompt, counts.shape[0]))]
    assert max(stat / CHI2_999[dof] for stat, dof in stats[1:]) > 3, stats


# ---- the budget policies ------------------------------------------------------------------------------------


def _req(i, accepted=0, tested=0):
    return SimpleNamespace(id=i, accepted=accepted, tested=tested)


def _measured(budget, alphas: dict):
    """The budget as if it had verified drafts already: request id -> its recency-weighted acceptance."""
    budget.observe(_req(99), 10, 6)
    budget.recent.update(alphas)
    return budget


def test_the_load_aware_budget_drafts_where_the_pass_is_flat_and_not_where_it_is_steep():
    drafts = [(_req(i), 4) for i in range(8)]  # α = 0.6 each, 4 drafted tokens each
    flat = _measured(LoadAware(cost=lambda rows: 0.010), {i: 0.6 for i in range(8)})
    assert flat.choose(drafts, batch=8) == [4] * 8
    steep = _measured(LoadAware(cost=lambda rows: 0.001 * sum(n for _, n in rows)), {i: 0.6 for i in range(8)})
    assert steep.choose(drafts, batch=8) == [0] * 8  # T(n) ∝ n: compute-bound
    # T(n) = 10 ms + 1 ms per token: at 8 rows a token's 1 ms buys α^j tokens where the pass makes 8 per 18 ms
    mild = _measured(LoadAware(cost=lambda rows: 0.010 + 0.001 * sum(n for _, n in rows)), {i: 0.6 for i in range(8)})
    ks = mild.choose(drafts, batch=8)
    assert ks == [1] * 8  # by hand: 0.6·18 > 8·1 keeps every first token; then 0.36·26 < 12.8·1 stops


def test_the_load_aware_budget_charges_a_heads_drafting_to_the_tokens_it_keeps():
    """D, the measured seconds of drafting one token after the decision (a head's step), is part of a kept token's
    cost. Flat 10 ms passes, 8 requests at α = 0.6: with D = 0 every drafted token is kept; with D = 0.5 ms each
    first token is (0.6·T > E·D while T ≤ 14 ms, E ≤ 12.8), no second one (0.36·14 < 12.8·0.5); with D = 10 ms none."""
    drafts = [(_req(i), 4) for i in range(8)]
    for seconds, want in ((0.0, [4] * 8), (0.0005, [1] * 8), (0.010, [0] * 8)):
        budget = _measured(LoadAware(cost=lambda rows: 0.010), {i: 0.6 for i in range(8)})
        if seconds:
            budget.observe_draft(4, 4 * seconds)
        assert budget.draft_cost() == pytest.approx(seconds)
        assert budget.choose(drafts, batch=8) == want, seconds


def test_rejected_probes_back_off_and_an_accepted_one_resets_the_wait():
    """With drafts never worth keeping, a probe comes after 8 idle passes; each rejected probe doubles the wait
    (8, 16, 32, 64, then 64: at most 8x), and an accepted probe sets it back to 8."""
    budget = _measured(LoadAware(cost=lambda rows: 0.001 * sum(n for _, n in rows)), {0: 0.3, 1: 0.3})
    gaps, last, outcomes = [], 0, iter([0] * 5 + [1, 0])
    for n in range(1, 400):
        ks = budget.choose([(_req(0), 4), (_req(1), 4)], batch=2)
        if any(ks):
            assert sorted(ks) == [0, 1]  # one token, one request
            gaps.append(n - last)
            last = n
            budget.observe(_req(ks.index(1)), 1, next(outcomes, 0))
        if len(gaps) == 8:
            break
    assert gaps == [8, 16, 32, 64, 64, 64, 8, 16], gaps


def test_the_load_aware_budget_favours_the_request_that_is_accepted():
    budget = _measured(LoadAware(cost=lambda rows: 0.010 + 0.0015 * sum(n for _, n in rows)), {0: 0.95, 1: 0.05})
    ks = budget.choose([(_req(0), 4), (_req(1), 4)], batch=2)
    assert ks[0] > 0 and ks[1] == 0


def test_the_load_aware_budget_learns_t_from_passes_and_probes_before_it_knows():
    budget = LoadAware()
    assert budget.choose([(_req(0), 5), (_req(1), 0)], batch=2) == [1, 0]  # nothing measured: a probe
    for n in (1, 8, 32):
        budget.observe_pass(n, 0.01 * n)
    assert budget.pass_cost(16) == pytest.approx(0.16) and budget.pass_cost(64) == pytest.approx(0.64)


def test_fixed_off_and_vllm_rules():
    drafts = [(_req(i), 5) for i in range(4)]
    assert Off().choose(drafts, batch=4) == [0] * 4 and Off().gamma_max == 0
    assert Fixed(3).choose(drafts, batch=4) == [3] * 4
    assert BatchCap(4, 2).choose(drafts, batch=3) == [2] * 4 and BatchCap(4, 2).choose(drafts, batch=4) == [0] * 4
    assert repr(spec_budget("vllm:8")) == "vllm:8:3" and repr(spec_budget("fixed:2")) == "fixed:2"
    assert isinstance(spec_budget("auto"), LoadAware) and isinstance(spec_budget("off"), Off)
    for bad in ("fixed:0", "fixed:x", "sometimes", "fixed:99"):
        with pytest.raises(ValueError, match="must be"):
            spec_budget(bad)


def test_add_rejects_a_token_outside_the_vocabulary_and_a_duplicate_id(tiny):
    engine = Engine(tiny, max_batch=2, block_size=4, num_blocks=20, token_budget=32)
    with pytest.raises(ValueError, match=f"prompt token id {CFG.vocab_size} is outside the vocabulary"):
        engine.add(Request("x", [1, CFG.vocab_size], 3))
    engine.add(Request("y", [1, 2], 3))
    with pytest.raises(ValueError, match="request id 'y' is already queued"):
        engine.add(Request("y", [3], 3))


# ---- the server: flags, usage and /metrics ----------------------------------------------------------------


def test_serve_refuses_a_bad_spec_budget_naming_the_flag(capsys):
    from labkit.cli import main

    for bad in ("fixed:x", "sometimes"):
        with pytest.raises(SystemExit) as exit_:
            main(["serve", "--speculative", "prompt-lookup", "--spec-budget", bad])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "--spec-budget" in err and "fixed:N" in err and repr(bad) in err


def test_serve_refuses_a_taken_port_before_loading_the_model_and_a_head_made_for_another(capsys, monkeypatch):
    import socket

    import labkit
    from labkit.cli import main

    real_load = labkit.load
    monkeypatch.setattr(labkit, "load", lambda *a, **k: pytest.fail("the model was loaded before the check"))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is taken" in err and "--port N" in err and "Traceback" not in err
    monkeypatch.setattr(labkit, "load", real_load)  # the heads in data/ were trained for SmolLM2, not this model
    assert main(["serve", "--model", "shakespeare", "--speculative", "medusa", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--speculative medusa:" in err and "does not fit this backbone" in err and "Traceback" not in err


def test_a_speculating_server_reports_accepted_and_drafted_tokens(shakespeare):
    import urllib.request

    import openai

    from labkit.serving.http.server import Server

    model, tok = shakespeare
    text = "But soft, what light through yonder window breaks? " * 4
    with Server(model, tok, "shakespeare", policy="chunked", max_batch=4, token_budget=64, num_blocks=64,
                drafter=PromptLookup(), spec_budget="fixed:3") as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
        reply = client.completions.create(model="shakespeare", prompt=text, max_tokens=16)
        spec = reply.usage.model_extra["speculation"]
        assert spec["drafted_tokens"] > 0 and reply.usage.completion_tokens_details is None
        assert reply.usage.completion_tokens == 16
        metrics = urllib.request.urlopen(srv.url + "/metrics", timeout=30).read().decode()
    counts = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith("labkit:spec_decode")}
    label = '{drafter="prompt-lookup"}'
    assert counts["labkit:spec_decode_num_accepted_tokens_total" + label] == spec["accepted_tokens"]
    assert counts["labkit:spec_decode_num_draft_tokens_total" + label] == spec["drafted_tokens"]


class _SlowLookup(PromptLookup):
    """Prompt lookup that spends a known extra time drafting (a busy wait, so it is real work on the clock)."""

    def propose(self, history, gamma, params=None, generator=None):
        from labkit.measure import now
        start = now()
        while now() - start < 0.004:
            pass
        return super().propose(history, gamma, params, generator)


@pytest.mark.parametrize("host_time", [True, False])
def test_the_engine_clock_covers_drafting_and_verification(tiny, host_time):
    """The whole step is timed: with a modelled pass cost, the drafting (4 ms here) moves the clock too, unless
    host_time=False asks for the passes alone; every step says how its time split."""
    engine = Engine(tiny, max_batch=2, token_budget=32, drafter=_SlowLookup(), spec_budget="fixed:2",
                    pass_time=lambda rows: 0.001, host_time=host_time)
    engine.add(Request(0, [1, 2, 3, 1, 2, 3, 1, 2], max_new_tokens=6))
    now, drafted = 0.0, 0
    while engine.scheduler.has_work:
        step = engine.step(now)
        drafted += step.drafted
        parts = step.parts
        assert {"draft", "schedule", "pass", "verify and sample", "emit"} <= set(parts)
        assert parts["pass (modelled)"] == 0.001
        took = step.end - step.start
        if host_time:
            assert took >= 0.001 + parts["draft"] + parts["verify and sample"]
            assert parts["draft"] >= 0.004 or not step.drafted
        else:
            assert took == pytest.approx(0.001)
        now = step.end
    assert drafted > 0


def test_a_budget_without_a_drafter_is_refused(capsys):
    """A budget with nothing to draft did nothing, silently; now the engine and the server say so."""
    from labkit.cli import main
    from labkit.model import ModelConfig, Transformer

    model = Transformer(ModelConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, ffn_dim=32, max_seq_len=64))
    with pytest.raises(ValueError, match="spec_budget='fixed:3' needs a drafter"):
        Engine(model, spec_budget="fixed:3")
    assert Engine(model, spec_budget="off").speculator is None  # "off" with no drafter says what happens
    assert main(["serve", "--spec-budget", "fixed:3"]) == 2
    assert "--spec-budget fixed:3 needs --speculative" in capsys.readouterr().err


# ---- one owner of a pass's tokens: the scheduler asks the budget; rows counted one way ------------------------------


def test_the_engine_reports_a_passs_sequences_as_the_budget_predicts_them(tiny):
    """Prompt chunks riding in a pass count as one sequence, in what the engine reports and in what the budget fits."""
    seen = []

    class Spy(LoadAware):
        def observe_pass(self, tokens, seconds, rows=None):
            seen.append(rows)
            super().observe_pass(tokens, seconds, rows)

    src = [t % CFG.vocab_size for t in range(3, 60)]
    reqs = [Request(i, src[i:i + 10], 8, arrival=0.0 if i < 2 else 0.05) for i in range(6)]  # 4 arrive together
    engine = Engine(tiny, policy="chunked", max_batch=6, token_budget=24, block_size=4, num_blocks=80,
                    drafter=PromptLookup(), spec_budget=Spy())
    engine.replay(reqs)
    prompt, done, mixed = {r.id: len(r.prompt) for r in reqs}, {r.id: 0 for r in reqs}, 0
    assert len(seen) == len(engine.steps)
    for step, rows in zip(engine.steps, seen):
        chunks = [n for rid, n in step.rows if done[rid] < prompt[rid]]
        decoding = len(step.rows) - len(chunks)
        assert rows == decoding + (len(chunks) > 0), (step.rows, rows)
        mixed += decoding > 0 and len(chunks) >= 2
        for rid, n in step.rows:
            done[rid] += n
    assert mixed  # passes where counting each chunk as a sequence would have differed


def test_a_given_cost_is_called_with_the_passs_own_requests(tiny):
    """`LoadAware(cost=...)` gets the scheduler's rows (requests, not None), the kept drafts added to their rows."""
    calls = []

    def cost(rows):
        calls.append(rows)
        return 0.01 + 1e-4 * sum(n + req.n_cached for req, n in rows)  # reads each row's request

    src = [t % CFG.vocab_size for t in range(3, 60)]
    reqs = lambda: [Request(i, src[i:i + 10], 8, arrival=0.01 * i) for i in range(4)]
    kw = dict(policy="chunked", max_batch=4, token_budget=16, block_size=4, num_blocks=60)
    plain = Engine(tiny, **kw).replay(reqs())
    spec = Engine(tiny, drafter=PromptLookup(), spec_budget=_measured(LoadAware(cost=cost), {}), **kw).replay(reqs())
    assert calls and all(req is not None for rows in calls for req, _ in rows)
    assert [r.output for r in spec.requests] == [r.output for r in plain.requests]
