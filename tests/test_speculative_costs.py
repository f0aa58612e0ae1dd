"""Chapter 07's pure parts: exactness by sampling, the speed-up formula with measured costs, figures, checkers."""
import pytest

from labkit import measure
import torch

from labkit import exercises
from labkit.speculative import costs
from labkit.viz import speculative as sviz
from tests.kvcache_shared import tiny


def test_verified_draws_follow_the_target_not_the_draft():
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    q = torch.tensor([0.05, 0.1, 0.2, 0.3, 0.35])
    n = 20000
    share = costs.first_token_counts(p, q, n, seed=1).float() / n
    assert (share - p).abs().max() < 4 * (0.25 / n) ** 0.5  # four standard errors at worst
    assert (share - q).abs().max() > 0.3
    with pytest.raises(ValueError, match="q must be a probability distribution"):
        costs.first_token_counts(p, torch.tensor([0.5, 0.5, 0.5, 0.0, 0.0]))


def test_predicted_speedup_uses_the_measured_pass_cost_when_given():
    assert costs.predicted_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8 ** 5) / 0.2 / 1.2)
    assert costs.predicted_speedup(0.8, 4, 0.05, {5: 2.0}) == pytest.approx((1 - 0.8 ** 5) / 0.2 / 2.2)
    with pytest.raises(ValueError, match="c must be >= 0"):
        costs.predicted_speedup(0.5, 2, -0.1)


def test_relative_costs_measure_a_pass_per_k_and_the_draft_share():
    model = tiny().requires_grad_(False)
    c, t_rel = costs.relative_costs(model, layers=1, ks=range(2, 4), repeat=1)
    assert c == 1 / model.config.n_layers and set(t_rel) == {2, 3} and all(v > 0 for v in t_rel.values())
    c, _ = costs.relative_costs(model, draft=model, ks=[2], repeat=1)
    assert c > 0
    assert costs.relative_costs(model, ks=[2], repeat=1)[0] == 0.0
    with pytest.raises(ValueError, match="k must be a positive integer"):
        costs.target_pass_s(model, 0)


def test_verification_costs_are_comparisons_and_the_cheapest_is_judged():
    small, big = tiny().requires_grad_(False), tiny().requires_grad_(False)
    vc = costs.verification_costs({"a": small, "b": big}, ks=[2, 4], rounds=8)
    assert set(vc) == {"a", "b"} and set(vc["a"]) == {2, 4}
    for row in vc.values():
        for k, c in row.items():
            assert c.method.startswith("paired") and c.rounds == 8 and c.low <= c.ratio <= c.high
            assert c.a.name == f"T({k})" and c.b.name == "T(1)"
    name, verdict = costs.cheapest_verifier(vc, 4)
    assert name in ("a", "b") and verdict.verdict in measure.VERDICTS
    assert verdict.verdict != "slower"  # the one ranked cheapest by its median is never measurably dearer
    with pytest.raises(ValueError, match="k must be one of"):
        costs.cheapest_verifier(vc, 3)


def test_figures():
    p, q = torch.tensor([0.7, 0.3]), torch.tensor([0.2, 0.8])
    fig = sviz.exactness_figure(p, q, torch.tensor([70, 30]))
    assert list(fig.data[2].y) == [0.7, 0.3] and "largest gap 0.000" in fig.layout.title.text.replace("<br>", " ")
    with pytest.raises(ValueError, match="no samples"):
        sviz.exactness_figure(p, q, torch.tensor([0, 0]))
    fig = sviz.speedup_figure(0.6, 0.1, {k: 1.0 + 0.1 * k for k in range(2, 10)},
                              [{"gamma": 2, "speedup": 1.2}, {"gamma": "auto", "speedup": 1.3}])
    assert len(fig.data) == 3 and fig.data[2].x == (2,) and len(fig.layout.shapes) == 2
    acc = sviz.acceptance_figure({"draft": [0.6, 0.5, 0.4]})
    assert list(acc.data[0].x) == [1, 2, 3]


def test_bad_arguments_are_named_not_answered_with_zero(tmp_path):
    from labkit.speculative import expected_tokens, generate
    from labkit.speculative.costs import predicted_speedup
    from labkit.speculative.headfile import load_head
    from tests.kvcache_shared import tiny

    with pytest.raises(ValueError, match="gamma must be a non-negative integer"):
        expected_tokens(0.5, -1)
    with pytest.raises(ValueError, match="gamma must be a positive integer"):
        predicted_speedup(0.6, -1, 0.1)
    with pytest.raises(ValueError, match=r"t_rel must hold T\(5\)/T\(1\) for gamma=4.*k = \[1, 2\]"):
        predicted_speedup(0.6, 4, 0.1, t_rel={1: 1.0, 2: 1.1})
    model = tiny()
    for draft in (None, "prompt-lookup"):
        with pytest.raises(TypeError, match="draft must be a draft model .* or a drafter object"):
            generate(model, draft, None, [1, 2, 3])
    bad = tmp_path / "head.safetensors"
    bad.write_text("not a safetensors file")
    with pytest.raises(ValueError, match="is not a safetensors file holding a drafting head"):
        load_head(bad, model)


def test_auto_gamma_estimates_alpha_per_tested_draft():
    from labkit.speculative.decode import _AutoGamma

    auto = _AutoGamma()
    for _ in range(60):  # γ = 4, two drafts accepted, the third rejected, the fourth never tested
        auto.update(proposed=4, accepted=2, draft_s=0.004, target_s=0.02)
    assert auto.alpha == pytest.approx(2 / 3, abs=1e-3)  # accepted / tested; accepted / proposed would read 0.5
    for _ in range(60):  # every draft accepted: all four were tested
        auto.update(proposed=4, accepted=4, draft_s=0.004, target_s=0.02)
    assert auto.alpha == pytest.approx(1.0, abs=1e-3)
    # E(γ) with the per-draft α predicts the round: α = 2/3 at γ = 4 gives 1 + 2/3 + 4/9 + 8/27 + 16/81 tokens
    assert costs.expected_tokens(2 / 3, 4) == pytest.approx(1 + 2 / 3 + 4 / 9 + 8 / 27 + 16 / 81)


def test_round_overhead_and_the_decomposition_by_hand():
    from types import SimpleNamespace

    t_rel = {2: 1.1, 3: 1.2, 5: 1.5}
    # three rounds of gamma 4, 4 and 1, c = 0.1: by the costs 3 * 0.4 ... = (0.4 + 1.5) * 2 + (0.1 + 1.1) = 5.0 steps;
    # the rounds took 6.5 steps of 10 ms: 1.5 steps more, 0.5 a round
    out = SimpleNamespace(gammas=[4, 4, 1], wall_s=0.080, prefill_s=0.015)
    assert costs.round_overhead(out, 0.010, 0.1, t_rel) == pytest.approx(0.5)
    fast = SimpleNamespace(gammas=[4, 4, 1], wall_s=0.060, prefill_s=0.015)  # 4.5 steps: 0.5 fewer than the costs
    assert costs.round_overhead(fast, 0.010, 0.1, t_rel) == pytest.approx(-0.5 / 3)  # signed, not clamped
    assert costs.predicted_speedup(0.5, 4, 0.1, t_rel, overhead=0.5) == pytest.approx(1.9375 / (0.4 + 1.5 + 0.5))
    rows = costs.decomposition(0.5, 4, 0.1, t_rel, 0.5, measured=0.7)
    assert [r["step"] for r in rows][-1] == "measured" and rows[-1]["speedup"] == 0.7
    assert rows[0]["speedup"] > rows[1]["speedup"] > rows[2]["speedup"]  # each cost the paper leaves out lowers it
    with pytest.raises(ValueError, match=r"T\(k\)/T\(1\) for k = \[7\]"):
        costs.round_overhead(SimpleNamespace(gammas=[6], wall_s=1, prefill_s=0), 0.01, 0.1, t_rel)
    with pytest.raises(ValueError, match="overhead must be"):
        costs.predicted_speedup(0.5, 4, 0.1, t_rel, overhead=-1)


def test_conditional_acceptance_separates_decay_from_reach():
    assert costs.conditional_acceptance([0.5, 0.25, 0.125]) == [0.5, 0.5, 0.5]  # independent: alpha at every position
    decaying = costs.conditional_acceptance([0.47, 0.16, 0.02, 0.0])
    assert decaying[0] == 0.47 and decaying[1] == pytest.approx(0.16 / 0.47) and decaying[3] == 0.0
    assert decaying[0] > decaying[1] > decaying[2]


def test_acceptance_by_position_counts_rounds_and_the_verdict_needs_them():
    from types import SimpleNamespace

    from labkit.speculative.costs import acceptance_by_position, decay_verdict

    run = SimpleNamespace(reached=[100, 50, 20], acceptance=[0.5, 0.4, 0.1], proposed=[100, 100, 100])
    rows = acceptance_by_position(run, run)
    assert [(r["reached"], r["accepted"]) for r in rows] == [(200, 100), (100, 80), (40, 20)]
    assert rows[1]["rate"] == 0.8 and decay_verdict(rows) == "no change detected"  # 0.5 at both ends
    falling = [{"reached": 200, "rate": 0.5, "stderr": 0.035}, {"reached": 40, "rate": 0.2, "stderr": 0.063}]
    assert decay_verdict(falling) == "falls"
    assert decay_verdict(falling, min_rounds=50) == "inconclusive"  # one position with enough rounds decides nothing
    assert decay_verdict([{"reached": 30, "rate": 0.3, "stderr": 0.08}, {"reached": 25, "rate": 0.6, "stderr": 0.1}]) == "rises"


def test_invariant_cost_is_a_paired_comparison_of_the_mode():
    model = tiny().requires_grad_(False)
    c = costs.invariant_cost(model, k=3, position=8, rounds=8)
    assert c.a.name == "mode on" and c.b.name == "default" and c.method.startswith("paired") and c.rounds == 8
    assert c.verdict in measure.VERDICTS and c.low <= c.ratio <= c.high
