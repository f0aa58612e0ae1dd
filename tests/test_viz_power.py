"""Figures and widgets of the cost and power chapters: the numbers they draw are the model's."""
import numpy as np
import plotly.graph_objects as go
import pytest

import labkit.viz
import labkit.widgets
from labkit import power
from labkit.costmodel import ridge_tokens
from labkit.power.kvpressure import kv_sweep
from labkit.power.validation import run_validation
from labkit.viz import _spec
from labkit.viz import power as vp
from labkit.viz import roofline as vr

from tests.costmodel_configs import L2_7B, L2_13B, L32_3B

PHONE = dict(weight_bits=4, act_bits=8)


def test_names_are_collected():
    for name in ("power_timeline_figure", "kv_placement_figure", "roofline_figure", "prefill_share_figure"):
        assert callable(getattr(labkit.viz, name))
    for name in ("power_timeline", "energy_vs_reply", "kv_placement", "dvfs_explorer", "roofline_explorer"):
        assert callable(getattr(labkit.widgets, name))


def test_timeline_figure_draws_the_simulated_watts():
    split = power.simulate(L32_3B, "phone-sd8gen3", 64, 16, switch="handoff", **PHONE)
    mono = power.simulate(L32_3B, "phone-sd8gen3", 64, 16, mode="monolithic", **PHONE)
    fig = vp.power_timeline_figure(split, mono)
    x, y = np.asarray(fig.data[1].x), np.asarray(fig.data[1].y)
    assert x[-1] == pytest.approx(split.t[-1] * 1e3)
    assert np.sum(y[:-1] * np.diff(x) / 1e3) == pytest.approx(split.energy_j, rel=1e-9)   # area = energy
    assert {s["fillcolor"] for s in fig.layout.shapes} >= {vp.PHASE_COLORS["prefill"], vp.PHASE_COLORS["decode"]}
    assert "handoff" in fig.layout.title.text.replace("<br>", " ")


def test_energy_vs_reply_figure_marks_n_star():
    r = power.energy_vs_reply_len(L32_3B, "phone-sd8gen3", 64, 256, switch="handoff", **PHONE)
    fig = vp.energy_vs_reply_figure(r)
    assert fig.data[2].x[0] == pytest.approx(r["n_star"])
    ratio = np.asarray(fig.data[1].y)
    assert np.allclose(ratio, r["split_j"] / r["monolithic_j"])
    n = np.asarray(fig.data[1].x)  # the ratio crosses 1 where the simulation says: above it before, below after
    assert (ratio[n < r["n_cross"]] > 1).all() and (ratio[n >= r["n_cross"]] < 1).all()
    assert list(fig.data[3].x) == [r["n_cross"]] and f"crosses 1 at n = {r['n_cross']}" in fig.layout.title.text.replace("<br>", " ")


def test_kv_placement_stack_adds_up_to_the_energy_per_token():
    ctx = np.array([100, 1000, 10000])
    fig = vp.kv_placement_figure(L32_3B, "phone-sd8gen3", 4, contexts=ctx, **PHONE)
    stacked = sum(np.asarray(t.y) for t in fig.data[:5])
    assert stacked == pytest.approx(kv_sweep(L32_3B, "phone-sd8gen3", ctx, 4, **PHONE)["joules"] * 1e3)
    assert "4 MB of SRAM holds 36 tokens" in fig.layout.title.text.replace("<br>", " ")


def test_dvfs_figure_is_relative_to_the_top_clock():
    fig = vp.dvfs_figure(L32_3B, "phone-sd8gen3", **PHONE)
    assert len(fig.data) == 8
    for trace in fig.data:
        assert trace.y[-1] == pytest.approx(1.0)
    decode_time_core = np.asarray(fig.data[2].y)
    assert np.allclose(decode_time_core, 1.0, atol=0.02)       # decode does not care about the core clock
    assert np.asarray(fig.data[6].y)[0] > 2                    # ... but it does about the memory clock


def test_roofline_figure_places_decode_left_of_the_ridge_and_prefill_right():
    fig = vr.roofline_figure(L2_7B, "h100-sxm", prompt_len=2048, context=2048)
    ridge = fig.data[4].x[0]
    assert fig.data[3].x[0] < ridge < fig.data[2].x[0]
    assert "memory-bound" in fig.data[3].text[0] and "compute-bound" in fig.data[2].text[0]


def test_ridge_figure_marks_the_ridge_in_tokens():
    fig = vr.ridge_figure(L2_7B, "a100-sxm")
    assert fig.data[3].x[0] == pytest.approx(ridge_tokens("a100-sxm"))


def test_prefill_share_grid_matches_the_estimate():
    from labkit.costmodel import estimate

    grid = vr.prefill_share_grid(L2_13B, "a100-sxm", [512, 4096], [32, 16])
    assert grid[0, 0] == pytest.approx(estimate(L2_13B, "a100-sxm", 512, 32).prefill_share)
    assert grid[1, 1] == pytest.approx(estimate(L2_13B, "a100-sxm", 4096, 16).prefill_share)


def test_validation_figure_has_one_bar_per_target():
    checks = run_validation()
    fig = vp.validation_figure(checks)
    assert len(fig.data[0].x) == len(checks)


def test_spec_apply_redraws_in_place_and_checks_trace_count():
    fig = go.Figure(vr.roofline_figure(L2_7B, "h100-sxm", prompt_len=16))
    spec = vr.roofline_spec(L2_7B, "a100-sxm", prompt_len=4096)
    _spec.apply(fig, spec)
    assert fig.data[2].x[0] == pytest.approx(spec["traces"][2]["x"][0])
    assert fig.layout.title.text.startswith("NVIDIA A100")
    with pytest.raises(ValueError, match="spec has 1 traces, the figure has 5"):
        _spec.apply(fig, {"traces": [{}], "title": ""})


def test_widgets_redraw_when_a_control_moves():
    box = labkit.widgets.power_timeline()
    fig = box.figures[0]
    before = np.asarray(fig.data[1].x).copy()
    box.controls["reply"].value = 128
    assert len(fig.data[1].x) > len(before)
    box.controls["hw"].value = "h100-sxm"
    box.controls["switch"].value = "collapse"                   # the H100 profile lists no idle states
    assert "not possible" in box.children[-1].value and "collapse" in box.children[-1].value
    roof = labkit.widgets.roofline_explorer()
    roof.controls["batch"].value = 256
    assert "batch 256" in roof.figures[0].layout.title.text
