"""Speculation under load: the recorded replay is the engine itself (same passes, drafts, acceptance and times as the
real model's engine), it refuses to invent tokens, and the summary's ITL, TPOT and the budget's inputs are as
derived by hand."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from labkit.kvcache.batch import PagedBatch
from labkit.serving import Engine, Request
from labkit.serving.studies import specload
from labkit.serving.engine.budget import LoadAware
from labkit.serving.engine.loop import Replay, Step
from labkit.serving.studies.recorded import RecordedModel
from labkit.serving.studies.trace import summarize
from labkit.viz.serving import spec_load_figure
from tests.test_serving_speculative import shakespeare  # noqa: F401  (the fixture)

TEXT = ("ROMEO: But soft, what light through yonder window breaks? It is the east, and Juliet is the sun. "
        "Arise, fair sun, and kill the envious moon, who is already sick and pale with grief. ")


def _cost(rows):
    return 0.010 + 0.002 * sum(n for _, n in rows)


@pytest.fixture(scope="module")
def recorded(shakespeare):  # noqa: F811
    model, tok = shakespeare
    prompts = [("grounded", TEXT * 2), ("chat", "JULIET:\n"), ("grounded", TEXT[40:] * 2), ("chat", "HAMLET:\nTo be")]
    return specload.record(model, tok, prompts, max_new_tokens=24, max_batch=4)


@pytest.mark.parametrize("budget", ["off", "fixed:3", "auto"])
def test_the_recorded_replay_is_the_engine_with_the_real_model(shakespeare, recorded, budget):  # noqa: F811
    model, _ = shakespeare
    # the passes alone (host_time=False, the default): the replay must make the engine's passes, so their costs add
    # up alike (a check of the replay's mechanics, not a timing)
    opts = dict(rate=40.0, budget=budget, max_batch=3, token_budget=16)
    real = specload.replay(recorded, model.config, _cost, model=model, **opts)
    replayed = specload.replay(recorded, model.config, _cost, **opts)
    served = {r.id: r for r in real.pop("served")}
    for r in replayed.pop("served"):
        assert r.output == served[r.id].output == recorded["replies"][r.id]
        assert r.token_times == served[r.id].token_times  # the same passes at the same (modelled) times
    assert real.pop("draft_s") >= 0 and replayed.pop("draft_s") >= 0  # the drafting timed on this machine's clock
    assert replayed == real
    assert (real["drafted"] > 0) == (budget != "off")
    # the passes that carried a draft: none without drafts; at most one per drafted token, and no more than passes
    assert (real["draft_passes"] > 0) == (budget != "off")
    assert real["draft_passes"] <= min(real["drafted"], real["steps"])


def test_the_recording_refuses_what_it_did_not_record(shakespeare, recorded):  # noqa: F811
    model, _ = shakespeare
    seqs = {0: recorded["prompts"][0] + recorded["replies"][0]}
    stand_in = RecordedModel(model.config, seqs)
    engine = Engine(stand_in, max_batch=2, token_budget=256, block_size=8, num_blocks=32)
    engine.add(Request(0, list(recorded["prompts"][0][:-1]) + [(recorded["prompts"][0][-1] + 1) % 64], 4))
    with pytest.raises(Exception, match="left its recorded sequence"):
        engine.step()
    longer = Engine(stand_in, max_batch=2, token_budget=256, block_size=8, num_blocks=32)
    longer.add(Request(0, list(recorded["prompts"][0]), len(recorded["replies"][0]) + 1))
    with pytest.raises(Exception, match="past its recorded"):
        for _ in range(40):
            longer.step()
    with pytest.raises(ValueError, match="sequences"):
        RecordedModel(model.config, {0: [model.config.vocab_size]})
    with pytest.raises(ValueError, match="pass_time"):
        Engine(stand_in, pass_time=3.0)


def test_pass_rows_are_known_only_inside_a_pass(shakespeare):  # noqa: F811
    model, _ = shakespeare
    cache = PagedBatch(model.config, num_blocks=8, block_size=8)
    cache.add("a")
    cache.plan([("a", 3)])
    with pytest.raises(RuntimeError, match="between begin"):
        cache.pass_rows()
    cache.begin(3)
    assert cache.pass_rows() == [("a", 0, 3, 1)]


def test_itl_counts_a_pass_s_tokens_as_one_chunk_and_tpot_spreads_them():
    req = Request(0, [1, 2], 5, arrival=0.0)
    for t in (1.0, 1.5, 1.5, 1.5, 2.5):  # a pass at 1.5 s gave three tokens at once
        req.add_token(7, t)
    req.finish = 2.5
    step = Step(0, 0.0, 2.5, [(0, 1)], 0, 0, 0)
    s = summarize(Replay("chunked", [req], [step]))
    assert s["itl_p50_s"] == pytest.approx(0.75)  # the gaps 0.5 and 1.0 s between chunks
    assert s["tpot_mean_s"] == pytest.approx(1.5 / 4)


def _req(i):
    return SimpleNamespace(id=i, accepted=0, tested=0)


def test_the_load_aware_acceptance_follows_the_request_s_recent_outcomes():
    budget = LoadAware(recency=0.5)
    # first verification: starts from the pooled (4 + 1) / (4 + 2) (Laplace's rule), four accepted tokens halve
    # the distance to 1 four times
    budget.observe(_req(1), 4, 4)
    assert budget.alpha(_req(1)) == pytest.approx(1 - (1 / 6) / 16)
    budget.observe(_req(1), 3, 0)  # one rejected token: halfway to 0
    assert budget.alpha(_req(1)) == pytest.approx((1 - (1 / 6) / 16) / 2)
    assert budget.alpha(_req(2)) == pytest.approx(5 / 7)  # a new request: everyone's pooled, 4 accepted of 5 tested
    with pytest.raises(ValueError, match="recency"):
        LoadAware(recency=1.0)


def test_the_load_aware_budget_never_displaces_a_waiting_prompt_token():
    budget = LoadAware(cost=lambda rows: 0.010)  # flat: every draft would pay if a slot were free
    budget.observe(_req(99), 4, 4)
    drafts = [(_req(i), 4) for i in range(3)]
    assert budget.choose(drafts, batch=3, riding=10, decoding=3, room=0) == [0, 0, 0]
    assert sum(budget.choose(drafts, batch=3, riding=10, decoding=3, room=5)) == 5
    assert budget.choose(drafts, batch=3, riding=0, decoding=3) == [4, 4, 4]


def test_the_load_aware_pass_cost_is_a_line_through_nearby_passes():
    budget = LoadAware()
    for n in (1, 2, 4, 8, 64, 128):  # flat to 8 tokens, steep from there: near 4 the line is the flat part
        budget.observe_pass(n, 0.02 if n <= 8 else 0.02 + 0.001 * (n - 8))
    assert budget.pass_cost(4) == pytest.approx(0.02)
    assert budget.pass_cost(96) == pytest.approx(0.02 + 0.088, rel=0.02)


def test_a_drafted_token_is_not_charged_for_the_kv_that_more_sequences_read():
    budget = LoadAware()
    for rows, tokens in ((4, 4), (4, 16), (8, 8), (8, 32), (16, 16), (16, 40), (12, 24), (6, 30)):
        budget.observe_pass(tokens, 0.010 + 0.0001 * tokens + 0.002 * rows, rows=rows)  # each sequence reads its KV
    cost = budget.line(20, rows=8)
    assert cost(21) - cost(20) == pytest.approx(0.0001)  # a token's own cost, not a sequence's
    assert cost(20) == pytest.approx(0.010 + 0.002 + 0.016)
    one = LoadAware()
    for rows, tokens in ((4, 4), (8, 8), (16, 16)):  # decode-only passes: tokens = rows, one slope for both
        one.observe_pass(tokens, 0.010 + 0.0021 * tokens, rows=rows)
    assert one.line(8, rows=8)(9) - one.line(8, rows=8)(8) == pytest.approx(0.0021)


def test_ratios_compare_each_budget_with_no_speculation_at_its_own_load():
    def row(load, budget, tok_s, tpot, drafted=0, accepted=0, tpp=10.0, steps=4):
        return {"load": load, "budget": budget, "throughput_tok_s": tok_s, "tpot_mean_s": tpot, "drafted": drafted,
                "accepted": accepted, "tokens_per_pass": tpp, "steps": steps}

    rows = [row(1, "off", 100.0, 0.020), row(1, "auto", 125.0, 0.010, drafted=20, accepted=15),
            row(2, "off", 50.0, 0.040), row(2, "fixed:3", 40.0, 0.050, drafted=8, accepted=2)]
    got = {(r["load"], r["budget"]): r for r in specload.ratios(rows)}
    assert got[1, "auto"]["throughput"] == pytest.approx(1.25) and got[1, "auto"]["speed"] == pytest.approx(2.0)
    assert got[2, "fixed:3"]["throughput"] == pytest.approx(0.8) and got[2, "fixed:3"]["speed"] == pytest.approx(0.8)
    assert got[1, "auto"]["acceptance"] == 0.75 and got[2, "fixed:3"]["drafted_share"] == pytest.approx(8 / 40)
    assert got[1, "off"]["throughput"] == 1.0 and got[1, "off"]["acceptance"] != got[1, "off"]["acceptance"]  # nan
    fig = spec_load_figure({"here": specload.ratios(rows)})
    assert {t.name for t in fig.data} == {"auto, here", "fixed:3, here"}
    with pytest.raises(ValueError, match="'off' row at load 2"):
        specload.ratios([rows[0], rows[3]])


def test_the_workload_and_trace_check_their_arguments(recorded):
    kinds = [k for k, _ in specload.workload_prompts(2)]
    assert kinds.count("grounded") == kinds.count("chat") > 0
    with pytest.raises(ValueError, match="n_passages"):
        specload.workload_prompts(0)
    with pytest.raises(ValueError, match="rate"):
        specload.trace(recorded, 0.0)
    with pytest.raises(ValueError, match="copies"):
        specload.trace(recorded, 1.0, copies=0)
    burst = specload.trace(recorded, float("inf"), copies=2)
    assert len(burst) == 2 * len(recorded["prompts"]) and {r.arrival for r in burst} == {0.0}
    assert torch.tensor([len(r.prompt) for r in burst]).min() > 0


def test_the_load_aware_budget_names_its_recent_passes_and_refuses_the_old_name():
    assert LoadAware(recent_passes=4).passes.maxlen == 4
    with pytest.raises(ValueError, match="LoadAware has no window=; it is recent_passes=.*got window=8"):
        LoadAware(window=8)
    with pytest.raises(ValueError, match="recent_passes must be a positive integer, got 0"):
        LoadAware(recent_passes=0)


def test_copy_origins_splits_accepted_tokens_by_where_the_match_was_by_hand():
    """Prompt [1..5], reply [3, 4, 5, 6, 3, 4, 5, 6], γ = 8 (worked by hand): no match for the first token; then [3]
    matches in the prompt and its continuation 4, 5 is accepted (3 is not: the reply says 6); after 6 and 3, [3]
    matches latest in the reply, whose 4, 5, 6 are all accepted. 2 copied from the prompt, 3 from the reply."""
    rec = {"kinds": ["grounded"], "prompts": [[1, 2, 3, 4, 5]], "replies": [[3, 4, 5, 6, 3, 4, 5, 6]]}
    assert specload.copy_origins(rec, gamma=8) == {"grounded": {"prompt": 2, "reply": 3, "tokens": 8}}
    assert specload.copy_origins(rec, gamma=1)["grounded"]["prompt"] == 1  # one token a round: 4 from the prompt


def test_the_live_sweep_pairs_each_budget_with_no_speculation_by_seed():
    """`serving_spec_live.compare_rows`: a budget whose TPOT is 0.76-0.84x off's across 6 seeds (median 0.8) is 1.25x
    faster, inside an interval of the paired ratios, with the verdict 'faster'; one equal to off in throughput is 'same
    within margin'. The ratios differ seed by seed while off's times rise: unpaired, the interval would differ."""
    from labkit.benchmarks.serving_spec_live import compare_rows

    rows = []
    for seed in range(6):
        base = {"tpot_mean_s": 0.03 + 0.001 * seed, "s_per_token": 0.01, "ttft_p50_s": 0.5, "drafted": 0, "accepted": 0}
        mine = {**base, "tpot_mean_s": (0.76, 0.78, 0.79, 0.81, 0.82, 0.84)[seed] * base["tpot_mean_s"], "drafted": 10,
                "accepted": 4}
        rows += [{"drafter": "none", "budget": "off", "seed": seed, "live": base},
                 {"drafter": "prompt lookup", "budget": "auto", "seed": seed, "live": mine}]
    (row,) = compare_rows(rows, "live")
    assert row["speed"]["x"] == pytest.approx(1 / 0.8, rel=1e-3) and row["speed"]["verdict"] == "faster"
    assert 1 / 0.84 <= row["speed"]["low"] < 1.25 < row["speed"]["high"] <= 1 / 0.76
    assert row["throughput"]["verdict"] == "same within margin" and row["acceptance"] == pytest.approx(0.4)


def test_a_modelled_heads_drafting_is_on_the_replays_clock(shakespeare, recorded):  # noqa: F811
    """A modelled head drafts after the budget's decision, and each drafted token's `head_step_s` goes on the clock
    beside its pass: with every request there at once (no idle gap), the run takes that much longer per drafted
    token, the summary's drafting seconds are those, and the budget learns the passes' costs without them (F8: it
    is told the drafting once, as D)."""
    model, _ = shakespeare
    opts = dict(rate=float("inf"), budget="fixed:3", max_batch=3, token_budget=16, head=0.5)
    free = specload.replay(recorded, model.config, _cost, **opts)
    paid = specload.replay(recorded, model.config, _cost, head_step_s=0.01, **opts)
    assert paid["drafted"] == free["drafted"] > 0
    assert paid["duration_s"] - free["duration_s"] == pytest.approx(0.01 * paid["drafted"])
    assert paid["draft_s"] == pytest.approx(0.01 * paid["drafted"])
    budget, reqs, m = LoadAware(), specload.trace(recorded, 1.0), len(recorded["prompts"])
    seqs = {r.id: recorded["prompts"][r.id % m] + recorded["replies"][r.id % m] for r in reqs}
    engine = Engine(RecordedModel(model.config, seqs), policy="chunked", max_batch=3, token_budget=16, num_blocks=64,
                    prefix_cache=False, pass_time=_cost, spec_budget=budget,
                    drafter=specload.ModelledHead(recorded, 1.0, step_s=0.01))
    steps = engine.replay(reqs).steps
    assert sum(s.drafted for s in steps) > 0
    assert [s for _, s, _ in budget.passes] == pytest.approx([_cost(s.rows) for s in steps][-len(budget.passes):])
    assert budget.draft_cost() == pytest.approx(0.01)
    for s in steps:  # each step: its pass's modelled cost, then its drafted tokens' head steps, on the clock
        assert s.end - s.start == pytest.approx(_cost(s.rows) + 0.01 * s.drafted)
    with pytest.raises(ValueError, match="step_s"):
        specload.ModelledHead(recorded, 0.5, step_s=-1)


def test_every_seed_carries_its_stated_load(recorded):
    """F3: the trace's gaps are scaled so its span is (n - 1) / rate; seeds differ in order and spacing only."""
    n = len(recorded["prompts"]) * 3
    spans = []
    for seed in range(4):
        arrivals = sorted(r.arrival for r in specload.trace(recorded, 2.0, copies=3, seed=seed))
        assert arrivals[0] == 0.0 and all(b >= a for a, b in zip(arrivals, arrivals[1:]))
        spans.append(arrivals[-1])
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
        assert len(set(round(g, 9) for g in gaps)) > 1  # not a uniform grid
    assert spans == pytest.approx([(n - 1) / 2.0] * 4, rel=1e-12)


def test_the_live_bench_replays_a_head_at_its_fixed_runs_drafting_cost(shakespeare, recorded):  # noqa: F811
    """F8: `serving_spec_live.one_point` runs every live configuration, then replays each; a head's replay takes the
    live run's own acceptance and one drafting cost per point, its fixed budgets' seconds per drafted token (auto's
    own would spread its decisions over few tokens), and every live reply is the recording's."""
    from labkit.benchmarks.serving_spec_live import one_point, rerecord

    model, _ = shakespeare
    rec = rerecord(model, {**recorded, "replies": [r[:12] for r in recorded["replies"]], "max_new_tokens": 12})
    head = specload.ModelledHead(rec, 0.5, step_s=0.0)
    heads = {}
    rows = one_point(model, rec, _cost, 50.0, 1, {"mtp head": head}, heads, budgets=("fixed:3", "auto"))
    assert [(r["drafter"], r["budget"]) for r in rows] == [("none", "off"), ("mtp head", "fixed:3"), ("mtp head", "auto")]
    assert all(r["exact"] for r in rows)
    fixed = rows[1]["live"]
    assert heads["mtp head"] == pytest.approx((fixed["accepted"] / fixed["tested"], fixed["draft_s"] / fixed["drafted"]))
    for r in rows[1:]:  # the replay's head accepts what the live head accepted, per tested token
        live, rep = r["live"], r["replay"]
        assert rep["drafted"] > 0 and abs(rep["accepted"] / rep["tested"] - live["accepted"] / live["tested"]) < 0.35
        assert rep["draft_s"] == pytest.approx(heads["mtp head"][1] * rep["drafted"])
