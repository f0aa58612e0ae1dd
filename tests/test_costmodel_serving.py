"""The serving half of the cost model: critical batch, decode throughput, TP x DP plans, price per token."""
import math

import pytest

from labkit.costmodel import (LLAMA3_70B, compare_plans, cost_per_million_tokens, critical_batch, decode_throughput,
                              estimate, hardware, parallel_plan, ridge_tokens)
from labkit.costmodel.workload import ModelShape, decode_work
from labkit.exercises.serving import _reference_critical_batch

from tests.costmodel_configs import L2_7B, SMOL

IDEAL_H100 = hardware("h100-sxm").replace(compute_eff=1.0, mem_eff=1.0)


@pytest.mark.parametrize("cfg, hw, context, settings", [
    (L2_7B, "h100-sxm", 32, {}),
    ("llama-3-8b", "h100-sxm", 256, {}),
    ("llama-3-8b", "a100-sxm", 512, {"weight_bits": 4}),
    (LLAMA3_70B, "h100-sxm", 1024, {"tp": 8}),
    (LLAMA3_70B, "h100-sxm", 1, {}),          # 141 GB of weights on an 80 GB GPU: the spilled search
])
def test_critical_batch_is_where_estimate_flips_to_compute_bound(cfg, hw, context, settings):
    b = critical_batch(cfg, hw, context, **settings)
    assert math.isfinite(b) and b > 1
    below = estimate(cfg, hw, context, 2, batch=math.ceil(b) - 1, **settings)   # one step at `context`
    above = estimate(cfg, hw, context, 2, batch=math.ceil(b), **settings)
    assert below.bound["decode"] == "memory" and above.bound["decode"] == "compute"


def test_critical_batch_is_the_ridge_plus_the_kv_of_the_batch():
    # more context -> more KV bytes per sequence -> a larger batch before compute binds; all above the ridge
    bs = [critical_batch(L2_7B, "h100-sxm", c) for c in (8, 32, 64)]
    assert ridge_tokens("h100-sxm") < bs[0] < bs[1] < bs[2]
    # full multi-head KV at 2k tokens (1 GiB per sequence) costs more time to read than its FLOPs take
    assert critical_batch(L2_7B, "h100-sxm", 2048) == math.inf
    # a 135M model keeps 23 KB of KV per token next to 0.3 GB of weights: never compute-bound on an A100
    assert critical_batch(SMOL, "a100-sxm", 256) == math.inf


def test_critical_batch_agrees_with_the_exercise_reference():
    # fed the roofline's own per-sequence counts, the exercise's closed form gives the same batch
    c = 32
    shape = ModelShape.of(L2_7B)
    w0, w1 = decode_work(shape, c, 0), decode_work(shape, c, 1)
    flops_seq = float(w1.flops)                                   # 2 N + attention, per sequence
    bytes_seq = float(w1.act_bytes + w1.kv_read_bytes + w1.kv_write_bytes)
    ref = _reference_critical_batch(IDEAL_H100.peak_flops("fp16"), IDEAL_H100.mem_bw_gbs * 1e9, w0.weight_bytes,
                                    flops_seq / 2, bytes_seq)
    assert critical_batch(L2_7B, IDEAL_H100, c) == pytest.approx(ref, rel=1e-9)
    assert ref == pytest.approx(554.5, abs=0.1)


def test_decode_throughput_rises_linearly_then_flattens():
    b_star = critical_batch("llama-3-8b", "h100-sxm", 256)           # ~640
    rows = decode_throughput("llama-3-8b", "h100-sxm", [1, 8, 256, 1024, 1536], context=256)
    tps = {r["batch"]: r["tokens_per_s"] for r in rows}
    assert [r["bound"] for r in rows] == ["memory"] * 3 + ["compute"] * 2 and 256 < b_star < 1024
    assert tps[8] / tps[1] == pytest.approx(8, rel=0.1)              # one read of the weights, shared: ~8x
    assert tps[1536] == pytest.approx(tps[1024], rel=0.01)            # above b*: flat
    # The roofline is per operator: the linear layers turn compute-bound near the ridge (~250 tokens here)
    # while attention stays memory-bound, so tokens/s are flat from there on, before the bound label flips at b*.
    assert tps[256] == pytest.approx(tps[1024], rel=0.05) and ridge_tokens("h100-sxm") < 256
    assert all(r["step_s"] > 0 and r.keys() >= {"batch", "step_s", "tokens_per_s", "bound"} for r in rows)


@pytest.fixture(scope="module")
def plans_64():
    return compare_plans(LLAMA3_70B, "h100-sxm", [(8, 1), (4, 2)], batch=64, prompt_len=1024, reply_len=256)


def test_tp8_halves_the_weights_per_gpu(plans_64):
    tp8, tp4 = plans_64
    assert (tp8["plan"], tp4["plan"]) == ("TP8", "TP4xDP2") and tp4["replica_batch"] == 32
    assert tp8["weight_gb_per_gpu"] == pytest.approx(tp4["weight_gb_per_gpu"] / 2)
    assert tp8["weight_gb_per_gpu"] == pytest.approx(ModelShape.of(LLAMA3_70B).n_params * 2 / 8 / 1e9)
    # 8 KV heads: one per GPU at TP8, two at TP4 for half the requests -> the same KV per GPU
    assert tp8["kv_gb_per_gpu"] == pytest.approx(tp4["kv_gb_per_gpu"])
    assert tp8["mem_per_gpu_gb"] < tp4["mem_per_gpu_gb"] < 80 and tp8["fits"] and tp4["fits"]


def test_at_batch_64_tp8_has_the_lower_latency(plans_64):
    # Memory-bound at batch 64: each TP8 GPU reads half the weight bytes a TP4 GPU reads per step. The
    # all-reduces (160 per step, each at least the link's 8 us floor) cost both plans the same 1.3 ms.
    tp8, tp4 = plans_64
    assert tp8["itl_s"] < tp4["itl_s"]
    assert tp8["allreduce_s"] == pytest.approx(160 * max(2 * 7 / 8 * 64 * 8192 * 2 / 450e9, 8e-6), rel=1e-9)
    assert tp8["tokens_per_s"] == pytest.approx(64 / tp8["itl_s"])


def test_at_a_large_batch_tp4xdp2_has_the_throughput():
    # At batch 512 both plans' linear layers are compute-bound (TP4's replicas see 256 tokens, above the ridge),
    # where each GPU does 1/8 of the FLOPs and reads the same KV bytes in either plan: only the all-reduces
    # differ, and TP8 all-reduces twice the rows. So TP4xDP2 must deliver more tokens/s, at a higher ITL.
    tp8, tp4 = compare_plans(LLAMA3_70B, "h100-sxm", batch=512)
    assert tp4["tokens_per_s"] > tp8["tokens_per_s"] and tp4["allreduce_s"] < tp8["allreduce_s"]
    assert tp4["fits"] and tp8["fits"]
    tp8, tp4 = compare_plans(LLAMA3_70B, "h100-sxm", batch=1024)
    assert tp8["fits"] and not tp4["fits"]  # twice the weights per GPU leave no room for that much KV


def test_cost_per_million_tokens():
    assert cost_per_million_tokens(1000, 3.6) == pytest.approx(1.0)    # 3.6 M tokens an hour for $3.60
    assert cost_per_million_tokens(2000, 3.6) == pytest.approx(0.5)
    assert cost_per_million_tokens(10, 0) == 0


@pytest.mark.parametrize("call, message", [
    (lambda: cost_per_million_tokens(0, 3.6), "tokens_per_s must be a positive number, got 0"),
    (lambda: cost_per_million_tokens(100, -1), r"price_per_hour must be a number >= 0 \(dollars per hour\), got -1"),
    (lambda: critical_batch(L2_7B, "h100-sxm", 0), "context must be an integer >= 1, got 0"),
    (lambda: critical_batch(L2_7B, "h100-sxm", 32, kv_sram_mb=8), "critical_batch got the setting 'kv_sram_mb'"),
    (lambda: critical_batch(L2_7B, "h100-sxm", 32, weight_bits=0), r"weight_bits must be a number in \[1, 32\] \(bits per value\), got 0"),
    (lambda: decode_throughput(L2_7B, "h100-sxm", [], 32), r"batches must be a non-empty list of integers >= 1, got \[\]"),
    (lambda: decode_throughput(L2_7B, "h100-sxm", [4, 0], 32), r"batches must be an integer >= 1, got \[4, 0\]"),
    (lambda: parallel_plan(LLAMA3_70B, "h100-sxm", n_gpus=8, tp=3), "tp must divide n_gpus = 8"),
    (lambda: parallel_plan(LLAMA3_70B, "h100-sxm", n_gpus=8, tp=4, batch=63), "batch must be a multiple of dp"),
    (lambda: parallel_plan(LLAMA3_70B, "h100-sxm", n_gpus=0), "n_gpus must be a positive integer, got 0"),
    (lambda: parallel_plan(LLAMA3_70B, "h100-sxm", n_gpus=3, tp=3, batch=3), "tp must divide n_heads = 64, got tp = 3"),
    (lambda: parallel_plan(LLAMA3_70B, "laptop-core-ultra-258v", n_gpus=2, tp=2, batch=2),
     "tp must be 1 on laptop-core-ultra-258v"),
    (lambda: compare_plans(LLAMA3_70B, "h100-sxm", plans=[(8,)]), r"plans must be a non-empty list of \(tp, dp\) pairs"),
    (lambda: compare_plans(LLAMA3_70B, "h100-sxm", plans=[(4, 0)]), "dp must be a positive integer, got 0"),
])
def test_bad_input_names_the_parameter(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_docstring_examples_hold():
    import doctest

    import labkit.costmodel.serving as serving

    result = doctest.testmod(serving)
    assert result.attempted > 0 and result.failed == 0
