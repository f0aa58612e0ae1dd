"""Energy, DVFS, switch costs, the two-stage timeline and the KV under pressure."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from labkit import power
from labkit.costmodel import estimate
from labkit.power import COMPONENTS, awake_power, phase_energy, request_energy
from labkit.costmodel import hardware, precision_for
from labkit.power.kvpressure import kv_sweep, max_context, swap_vs_recompute, tokens_that_fit

from tests.costmodel_configs import L2_7B, L2_13B, L2_70B, L32_1B, L32_3B

PHONE = dict(weight_bits=4, act_bits=8)  # the NPU path: INT4 weights, INT8 activations


def test_energy_is_ops_times_e_op_v2_plus_bits_times_e_bit_plus_awake_time():
    hw = hardware("phone-sd8gen3")
    f = 700.0
    est = estimate(L32_3B, hw, 128, 2, core_mhz=f, **PHONE)
    e = phase_energy(hw, est.prefill, precision_for(4, 8), core_mhz=f)
    v = hw.vf.voltage(f) / hw.vf.vmax
    assert e.parts["compute"] == pytest.approx(est.prefill.flops * hw.e_op("int8") * v**2)
    assert e.parts["dram"] == pytest.approx(est.prefill.level_bytes["dram"] * 8 * hw.e_bit("dram"))
    awake = e.parts["static"] + e.parts["clock"] + e.parts["base"]
    assert awake == pytest.approx(awake_power(hw, f) * est.prefill_s)
    assert set(e.parts) == set(COMPONENTS)


def test_prefill_energy_is_arithmetic_and_decode_energy_is_bytes():
    r = request_energy(L32_3B, "phone-sd8gen3", 512, 64, **PHONE)
    pre, dec = r.prefill.total(), r.decode.total()
    assert pre["compute"] / sum(pre.values()) > 0.3
    assert dec["compute"] / sum(dec.values()) < 0.02
    assert dec["dram"] > 20 * dec["compute"]


def test_decode_at_a_low_core_clock_is_free_in_time_and_cheaper_in_energy():
    hw = hardware("phone-sd8gen3")
    f = power.free_decode_mhz(L32_3B, hw, 600, **PHONE)
    assert f < hw.vf.fmax
    top = request_energy(L32_3B, hw, 512, 128, **PHONE)
    low = request_energy(L32_3B, hw, 512, 128, decode_mhz=f, **PHONE)
    assert low.decode_est.itl_s <= 1.02 * top.decode_est.itl_s
    assert low.decode_j < 0.8 * top.decode_j


def test_a_low_memory_clock_is_not_free():
    hw = hardware("phone-sd8gen3")
    top = request_energy(L32_3B, hw, 512, 64, **PHONE)
    slow = request_energy(L32_3B, hw, 512, 64, mem_mhz=hw.mem_mhz[0], **PHONE)
    assert slow.decode_est.itl_s == pytest.approx(top.decode_est.itl_s * hw.fmax_mem / hw.mem_mhz[0], rel=0.05)


def test_prefill_energy_vs_core_clock_critical_speed_and_race_to_idle():
    def joules(key, **kw):
        hw = hardware(key)
        return np.array([request_energy(L32_1B, hw, 512, 1, prefill_mhz=f, **kw).prefill_j for f in hw.vf.grid(16)])

    phone = joules("phone-sd8gen3", **PHONE)
    # a critical speed inside the table: below it static and base power win, above it V^2 does
    assert 0 < int(np.argmin(phone)) < len(phone) - 1
    assert phone[0] > 1.1 * phone.min() and phone[-1] > 1.1 * phone.min()
    # the Pi's 3 W of board power makes racing to idle at the top clock the cheapest
    pi = joules("raspberry-pi-5")
    assert int(np.argmin(pi)) == len(pi) - 1


def test_power_cap_slows_only_the_phase_above_the_cap():
    cap = power.power_cap(L2_70B, "h100-sxm", 1024, 128, cap_w=490, tp=2)
    assert cap["decode"]["watts_uncapped"] < 490 and cap["decode"]["slowdown"] == 1.0
    assert cap["prefill"]["watts_uncapped"] > 490 >= cap["prefill"]["watts"]
    assert cap["prefill"]["slowdown"] > 1.1
    tighter = power.power_cap(L2_70B, "h100-sxm", 1024, 128, cap_w=400, tp=2)
    assert tighter["prefill"]["slowdown"] > cap["prefill"]["slowdown"]
    with pytest.raises(ValueError, match="cap_w must be a positive number of watts, got -3"):
        power.power_cap(L2_70B, "h100-sxm", 1024, 128, cap_w=-3)


def test_switch_costs_rank_dvfs_collapse_handoff():
    hw = hardware("phone-sd8gen3")
    kv = 64 * 114688
    costs = {m: power.switch_cost(hw, m, kv) for m in power.SWITCHES}
    assert costs["dvfs"].total_j < costs["collapse"].total_j < costs["handoff"].total_j
    assert costs["dvfs"].seconds == pytest.approx(40e-6)
    assert costs["collapse"].seconds == pytest.approx((2800 + 4400) * 1e-6)       # sm8650 cluster-sleep-1
    bigger = power.switch_cost(hw, "handoff", 2 * kv)
    assert bigger.parts["dram"] == pytest.approx(2 * costs["handoff"].parts["dram"])
    with pytest.raises(ValueError, match="mechanism must be one of .*got 'teleport'"):
        power.switch_cost(hw, "teleport")
    with pytest.raises(ValueError, match="needs power states; h100-sxm lists none"):
        power.switch_cost("h100-sxm", "collapse")


def test_breakeven_formula():
    assert power.breakeven_tokens(0.03, 0.05, 6.0, 0.05, 3.5) == pytest.approx(0.24)
    assert power.breakeven_tokens(1.0, 0.05, 6.0, 0.2, 3.5) == math.inf       # low level too slow: never split
    assert np.all(np.isinf(power.breakeven_tokens(np.ones(2), 0.05, 1.0, 0.05, np.array([1.0, 2.0]))))


@pytest.mark.parametrize("switch", ["collapse", "handoff"])
def test_simulated_curves_cross_at_the_formula_threshold(switch):
    # with no idle tail both energies differ only by the switch and the per-token gain
    r = power.energy_vs_reply_len(L32_3B, "phone-sd8gen3", 64, 400, switch=switch, hold_ms=0, idle_s=0, **PHONE)
    assert r["n_cross"] is not None
    assert abs(r["n_cross"] - math.ceil(r["n_star"])) <= max(1, 0.05 * r["n_star"])
    assert np.all(np.diff(r["split_j"]) > 0)


def test_short_replies_lose_with_an_engine_handoff():
    r = power.energy_vs_reply_len(L32_3B, "phone-sd8gen3", 64, 300, switch="handoff", **PHONE)
    assert r["n_star"] > 10                                  # tens of tokens: the seed articles' short-reply pitfall
    assert r["split_j"][0] > r["monolithic_j"][0]
    assert r["split_j"][-1] < r["monolithic_j"][-1]


def test_timeline_conserves_energy_and_times_tokens():
    tl = power.simulate(L32_3B, "phone-sd8gen3", 64, 24, switch="handoff", **PHONE)
    assert tl.energy_j == pytest.approx(sum(tl.by_phase.values()), rel=1e-9)
    assert tl.energy_j == pytest.approx(sum(tl.by_component.values()), rel=1e-9)
    assert len(tl.token_times) == 24 and np.all(np.diff(tl.token_times) > 0)
    assert tl.itl_s[0] >= tl.switch.seconds                  # the switch stalls the second token
    assert np.all(np.diff(tl.t) >= 0) and len(tl.watts) == len(tl.t) - 1
    x, y = tl.step_xy()
    assert len(x) == len(y)


def test_prewaking_hides_a_short_switch_behind_the_prefill():
    kw = dict(switch="collapse", **PHONE)
    serial = power.simulate(L32_3B, "phone-sd8gen3", 512, 8, **kw)
    overlap = power.simulate(L32_3B, "phone-sd8gen3", 512, 8, overlap_switch=True, **kw)
    assert serial.itl_s[0] > overlap.itl_s[0] == pytest.approx(overlap.itl_s[1], rel=0.01)
    assert overlap.energy_j == pytest.approx(serial.energy_j, rel=1e-9)   # same work, no stall


def test_split_and_monolithic_share_the_prefill_and_the_split_saves_on_decode():
    split = power.simulate(L32_3B, "phone-sd8gen3", 64, 48, **PHONE)
    mono = power.simulate(L32_3B, "phone-sd8gen3", 64, 48, mode="monolithic", **PHONE)
    assert split.ttft_s == mono.ttft_s and split.by_phase["prefill"] == mono.by_phase["prefill"]
    assert split.by_phase["decode"] < 0.8 * mono.by_phase["decode"]
    assert split.reply_s == pytest.approx(mono.reply_s, rel=0.03)


def test_waking_from_an_idle_state_adds_its_exit_latency_to_ttft():
    cold = power.simulate(L32_3B, "phone-sd8gen3", 64, 8, wake="cluster-sleep-1", **PHONE)
    warm = power.simulate(L32_3B, "phone-sd8gen3", 64, 8, **PHONE)
    assert cold.ttft_s - warm.ttft_s == pytest.approx(4400e-6)


@pytest.mark.parametrize("kwargs, match", [
    (dict(mode="both"), "mode must be 'split' or 'monolithic', got 'both'"),
    (dict(switch="warp"), "mechanism must be one of"),
    (dict(wake="deep"), r"wake must be one of \['cluster-sleep-0', 'cluster-sleep-1', 'cpu-collapse'\]"),
    (dict(decode_mhz="low"), "decode_mhz must be a frequency in MHz, None or 'auto', got 'low'"),
    (dict(reply_len=-2), "reply_len must be an integer >= 1, got -2"),
    (dict(idle_s=-1), "idle_s must be a number of seconds >= 0, got -1"),
])
def test_simulate_rejects_bad_input(kwargs, match):
    args = dict(prompt_len=16, reply_len=4) | kwargs
    with pytest.raises(ValueError, match=match):
        power.simulate(L32_3B, "phone-sd8gen3", **args)


@settings(max_examples=15, deadline=None)
@given(L=st.integers(1, 2000), n=st.integers(1, 200), mode=st.sampled_from(["split", "monolithic"]),
       switch=st.sampled_from(power.SWITCHES))
def test_timeline_energy_is_positive_and_additive(L, n, mode, switch):
    tl = power.simulate(L32_1B, "phone-sd8gen3", L, n, mode=mode, switch=switch, **PHONE)
    assert tl.energy_j > 0 and np.all(tl.watts >= 0)
    assert tl.energy_j == pytest.approx(sum(tl.by_phase.values()), rel=1e-9)


def test_kv_capacity_numbers_of_the_research_note():
    # tokens of fp16 KV that fit in the 8 MB Hexagon VTCM (research note §3.6; it rounds 70B's 25.6 up to 26)
    assert [tokens_that_fit(c, 8) for c in (L2_7B, L2_13B, L2_70B, L32_3B, L32_1B)] == [16, 10, 25, 73, 256]
    assert max_context(L2_7B, "phone-sd8gen3", weight_bits=4) < 8000 < max_context(L32_3B, "phone-sd8gen3", weight_bits=4)


def test_kv_placement_matters_only_at_long_context():
    hw = hardware("phone-sd8gen3")
    ctx = np.array([512, 4096, 32768])
    dram = kv_sweep(L32_3B, hw, ctx, 0, **PHONE)
    sram = kv_sweep(L32_3B, hw, ctx, 8, **PHONE)
    saved = dram["joules"] - sram["joules"]
    assert np.all(saved > 0) and np.all(np.diff(sram["onchip_fraction"]) < 0)
    assert saved[0] / dram["joules"][0] < 0.01          # 8 MB is a sliver of the cache


def test_spill_makes_decode_energy_jump():
    r = kv_sweep(L2_7B, "phone-sd8gen3", np.array([2000, 4000, 8000]), **PHONE)
    assert r["spill_bytes"][0] == 0 and r["spill_bytes"][2] > 0
    assert r["joules"][2] > 3 * r["joules"][1] and r["parts"]["offload"][2] > 0


def test_swap_vs_recompute_turns_with_the_offload_bandwidth():
    n = np.array([100, 1000])
    fast = swap_vs_recompute(L2_7B, "phone-sd8gen3", n, **PHONE)
    assert list(fast["faster"]) == ["swap", "swap"]
    assert fast["swap_s"][1] == pytest.approx(10 * fast["swap_s"][0])
    slow = swap_vs_recompute(L2_7B, hardware("phone-sd8gen3").replace(offload_bw_gbs=0.05), n, **PHONE)
    assert list(slow["faster"]) == ["recompute", "recompute"]
    with pytest.raises(ValueError, match="n_tokens must be an integer >= 1"):
        swap_vs_recompute(L2_7B, "phone-sd8gen3", [0])
