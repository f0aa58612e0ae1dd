"""The chapter's races: interleaved plain and speculative runs, costs in units of the plain step, a prediction from
another run, a mixed workload's totals, and the bytes a zero-copy head does not store."""
from __future__ import annotations

import math

import pytest
import torch

import labkit
from labkit.speculative import DraftModel, PromptLookup
from labkit.speculative.costs import relative_costs
from labkit.speculative.study import head_cache_bytes, mixed_workload, predict, race


@pytest.fixture(scope="module")
def pair():
    target, tok = labkit.load("shakespeare")
    draft, _ = labkit.load("shakespeare-draft")
    return target.requires_grad_(False), draft.requires_grad_(False), tok


PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?\n"


def test_a_race_checks_every_reply_and_prices_the_rounds_in_plain_steps(pair):
    target, draft, tok = pair
    _, t_rel = relative_costs(target, ks=range(2, 6), repeat=1)
    rows = race(target, tok, PROMPT, {"draft": (lambda: DraftModel(draft), 3), "lookup": (PromptLookup, 4)},
                n=24, rounds=2, t_rel=t_rel)
    assert set(rows) == {"plain", "draft", "lookup"} and rows["plain"]["t1_s"] > 0
    for name in ("draft", "lookup"):
        row = rows[name]
        assert row["same_as_plain"] and len(row["out"].token_ids) == 24
        assert row["overhead"] is not None and math.isfinite(row["overhead"]) and row["speedup"] > 0 and row["decode_speedup"] > 0
        assert 0 <= row["alpha"] <= 1 and row["tokens_per_call"] >= 1
    assert rows["draft"]["c"] > 0 and rows["draft"]["out"].draft_s > 0  # a draft model's steps cost time
    assert rows["lookup"]["c"] < rows["draft"]["c"]  # a lookup in a list costs less than a forward pass


def test_predict_uses_the_calibration_runs_figures_and_needs_its_overhead(pair):
    calibration = {"alpha": 0.6, "c": 0.1, "overhead": 0.2}
    t_rel = {2: 1.1, 3: 1.2, 4: 1.3, 5: 1.4}
    p = predict(calibration, 3, t_rel)
    e = (1 - 0.6 ** 4) / 0.4
    assert p["paper"] == pytest.approx(e / (0.3 + 1)) and p["with T(k)"] == pytest.approx(e / (0.3 + 1.3))
    assert p["with overhead"] == pytest.approx(e / (0.3 + 1.3 + 0.2))
    with pytest.raises(ValueError, match="no overhead"):
        predict({"alpha": 0.6, "c": 0.1, "overhead": None}, 3, t_rel)


def test_a_mixed_workload_totals_decode_time_over_its_kinds(pair):
    target, _, tok = pair
    prompts = {"speech": PROMPT, "repeat": "Say it twice: to be or not to be, to be or not to be, to be or"}
    mix = mixed_workload(target, tok, prompts, PromptLookup, [1, 4, "auto"], n=16)
    assert mix["same_as_plain"] and set(mix["by_kind"]) == set(prompts)
    assert set(mix["best_fixed"].values()) <= {1, 4}
    for g in (1, 4, "auto"):  # the total lies between the kinds' own speed-ups (a harmonic mean of them)
        lo, hi = min(v[g] for v in mix["by_kind"].values()), max(v[g] for v in mix["by_kind"].values())
        assert lo - 1e-9 <= mix["overall"][g] <= hi + 1e-9


def test_head_cache_bytes_is_one_layer_of_keys_and_values():
    cfg = labkit.model.config.ModelConfig.from_name("smollm2-135m")
    assert head_cache_bytes(cfg, 8192) == 2 * cfg.n_kv_heads * cfg.head_dim * 2 * 8192  # 3 KV heads of 64, bf16
    assert head_cache_bytes(cfg, 1000, bytes_per_value=4) == 2 * 3 * 64 * 4 * 1000
    with pytest.raises(ValueError, match="context must be an integer >= 1"):
        head_cache_bytes(cfg, 0)


def test_race_refuses_what_it_cannot_run(pair):
    target, _, tok = pair
    with pytest.raises(ValueError, match="drafters must name at least one"):
        race(target, tok, PROMPT, {})
    with pytest.raises(ValueError, match="rounds must be an integer >= 1"):
        race(target, tok, PROMPT, {"x": (PromptLookup, 2)}, rounds=0)
