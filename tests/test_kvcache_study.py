"""Chapters 03 and 04's tools: the memory calculator, timings, perplexity through a window, figures, widgets, exercises."""
import pytest
import torch

import labkit
from labkit import metrics
from labkit.kvcache import evaluate as kveval
from labkit.kvcache import memory as kvmemory
from labkit.model import ModelConfig
from labkit.generation import latency
from labkit.viz.kvcache import (block_size_figure, cache_speedup_figure, kv_memory_figure, kv_quant_figure,
                                sliding_slots_figure, window_perplexity_figure)
from labkit.viz.prefill_decode import reply_time_figure, ttft_itl_figure
from tests.kvcache_shared import ids, run_pieces, tiny

TTFT = [{"prompt_len": 16, "ttft_s": 0.05}, {"prompt_len": 256, "ttft_s": 0.65}]
ITL = [{"position": 16, "itl_s": 0.040}, {"position": 1024, "itl_s": 0.050}]


def test_13b_mha_is_0_82_mb_per_token_and_gqa_divides_by_the_group():
    rows = {r["model"]: r for r in kvmemory.memory_rows([ModelConfig.from_name(n) for n in ("llama-2-13b", "llama-3-8b", "smollm2-135m")], context=4096)}
    assert rows["llama-2-13b"]["bytes_per_token"] == 819_200 and round(rows["llama-2-13b"]["cache_bytes"] / 1e9, 2) == 3.36
    assert rows["llama-3-8b"]["bytes_per_token"] == 131_072 and rows["llama-3-8b"]["gqa_saving"] == 4
    assert rows["llama-3-8b"]["mha_bytes_per_token"] == 4 * 131_072
    assert kvmemory.kv_bytes_per_token(ModelConfig.from_name("smollm2-135m"), bits=32) == tiny_cache_bytes("smollm2-135m")
    assert kvmemory.kv_bytes_per_token(ModelConfig.from_name("llama-2-7b"), bits=8, group_size=32) == 32 * 32 * 128 * 2 * (1 + 4 / 32)


def tiny_cache_bytes(name):
    cache = labkit.kvcache.new_cache("contiguous", labkit.model.ModelConfig.from_name(name), max_len=1)
    return cache.bytes_allocated()


def test_paged_fragmentation_matches_the_paged_cache():
    model = tiny()
    for block_size in (1, 4, 7, 16):
        cache = model.new_cache("paged", max_len=64, block_size=block_size)
        run_pieces(model, ids(23), cache, [23])
        assert cache.fragmentation() == pytest.approx(kvmemory.paged_fragmentation([23], block_size))
    assert kvmemory.contiguous_fragmentation([10, 30], 40) == 0.5
    with pytest.raises(ValueError, match="block_size must be a positive integer, got 0"):
        kvmemory.paged_slots([3], 0)


def test_generation_without_a_cache_gives_the_same_tokens_and_the_speedup_rows_add_up():
    model = tiny()
    prompt = ids(12)[0].tolist()
    assert latency.generate_without_cache(model, prompt, 10) == latency.generate_with_cache(model, prompt, 10)
    rows = latency.speedup_run(model, prompt, 6, repeat=2)
    assert [r["new_tokens"] for r in rows] == list(range(1, 7))
    assert all(r["speedup"] == pytest.approx(r["uncached_s"] / r["cached_s"]) for r in rows)
    assert all(a["cached_s"] <= b["cached_s"] for a, b in zip(rows, rows[1:]))  # cumulative
    ttft = latency.ttft_sweep(model, [4, 8], repeat=1)
    itl = latency.itl_sweep(model, [4, 8], steps=2)
    assert [r["prompt_len"] for r in ttft] == [4, 8] and all(r["ttft_s"] > 0 for r in ttft)
    assert [r["position"] for r in itl] == [4, 8] and all(r["itl_s"] > 0 for r in itl)
    by_kind = latency.itl_sweep(model, [6], steps=2, cache=["paged", "sliding"])
    assert [r["cache"] for r in by_kind] == ["paged", "sliding"]
    with pytest.raises(ValueError, match="prompt_lens must be a non-empty list of positive integers"):
        latency.ttft_sweep(model, [0])


def test_predicted_speedup_comes_from_the_calibration_sweeps():
    P = 30
    ttft = [{"prompt_len": 10, "ttft_s": 0.04}, {"prompt_len": 1000, "ttft_s": 4.0}]  # 4 ms per token in a pass
    itl = [{"position": 10, "itl_s": 0.040}, {"position": 1000, "itl_s": 0.040}]  # a flat 40 ms decode step
    predicted = dict(latency.predict_speedup(ttft, itl, P, [1, 12, 200]))
    assert predicted[1] == pytest.approx(1.0)  # one token: both are the prefill
    for n in (12, 200):
        expected = sum(0.004 * (P + i) for i in range(n)) / (0.004 * P + 0.040 * (n - 1))
        assert predicted[n] == pytest.approx(expected)
    assert latency.crossing([{"n": n, "s": s} for n, s in latency.predict_speedup(ttft, itl, P, range(1, 200))],
                            "n", "s", 5.0) > 12
    with pytest.raises(ValueError, match="need ttft_rows and itl_rows"):
        latency.predict_speedup([], itl, P, [4])
    assert "kvcache" in __import__("labkit.commands.bench", fromlist=["available"]).available()


def test_reply_estimate_sums_the_steps_after_the_first_token():
    est = latency.reply_estimate(TTFT, ITL, prompt_len=136, reply_len=5)
    assert est["ttft_s"] == pytest.approx(0.35)
    assert est["steps_s"] == pytest.approx([0.040 + 0.010 * (136 + i - 16) / 1008 for i in range(1, 5)])
    assert est["prefill_share"] == pytest.approx(0.35 / (0.35 + sum(est["steps_s"])))
    assert latency.reply_estimate(TTFT, ITL, 16, 1)["decode_s"] == 0
    with pytest.raises(ValueError, match="reply_len must be a positive integer, got 0"):
        latency.reply_estimate(TTFT, ITL, 16, 0)


def test_window_covering_the_text_has_the_full_perplexity_and_a_tiny_window_does_not():
    model = tiny()
    text = ids(60, seed=3)[0].tolist()
    full = metrics.perplexity(model, text)
    covering = metrics.perplexity(model, text, model.new_cache("sliding", window=64, sinks=4), chunk=16)
    assert covering == pytest.approx(full, rel=1e-5)
    rows = kveval.window_perplexities(model, text, [8], sinks=(0, 2))
    assert [(r["window"], r["sinks"]) for r in rows] == [(8, 0), (8, 2)]
    assert all(abs(r["ppl"] - full) > 1e-3 for r in rows)


def test_quantized_error_rows_order_memory_and_error():
    model = tiny(d_model=96, n_heads=6, n_kv_heads=2)
    rows = kveval.quantized_error_rows(model, ids(48)[0].tolist(), n_prompt=24, group_size=8, residual=8)
    assert [r["bits"] for r in rows] == [32, 8, 4]
    assert rows[0]["bytes_used"] > rows[1]["bytes_used"] > rows[2]["bytes_used"]
    assert 0 < rows[1]["kl"] < rows[2]["kl"] and rows[1]["max_abs_err"] < rows[2]["max_abs_err"]
    assert len(kv_quant_figure(rows).data[0].x) == 3


def test_figures_say_what_they_show():
    assert "4,096 tokens, 16-bit" in kv_memory_figure(["llama-2-13b"], 4096).layout.title.text
    assert kv_memory_figure(["llama-2-13b"], 4096).data[0].y[0] == pytest.approx(3.3554432)
    rows = [{"new_tokens": n, "speedup": s} for n, s in ((1, 1.0), (10, 3.0), (20, 7.0))]
    assert "crosses 5x at about 15 new tokens" in cache_speedup_figure(rows).layout.title.text
    short = rows[:2]
    title = cache_speedup_figure(short, predicted=[(1, 1.0), (10, 3.0), (20, 7.0)]).layout.title.text
    assert "stays below 5x up to 10 tokens; predicted to cross at about 15" in title
    fig = window_perplexity_figure([{"window": 8, "sinks": 0, "ppl": 90.0}, {"window": 8, "sinks": 4, "ppl": 30.0}], 20.0)
    assert [t.name for t in fig.data] == ["no sinks (plain window)", "4 sink tokens", "full cache 20.0"]
    fig = window_perplexity_figure([{"window": 8, "sinks": 0, "ppl": 90.0}, {"window": 32, "sinks": 0, "ppl": 30.0}], 20.0, 16)
    assert list(fig.data[1].y) == [20.0, 20.0] and list(fig.data[2].x) == [16, 16] and list(fig.data[2].y) == [20.0, 90.0]
    assert not fig.layout.shapes   # a shape on the log axes would take log10 coordinates
    assert "15.6% of reserved slots empty" in block_size_figure([27], 32, 64).layout.title.text
    kept = sliding_slots_figure(30, 10, 2).data[0].x
    assert list(kept) == [0, 1] + list(range(22, 30))
    assert len(ttft_itl_figure(TTFT, ITL).data) == 2
    from labkit.costmodel import this_machine
    from labkit.costmodel.estimator import sweep_estimates
    from labkit.model import ModelConfig

    cfg = ModelConfig.from_name("smollm2-135m")
    m_ttft, m_itl = sweep_estimates(cfg, this_machine(), [r["prompt_len"] for r in TTFT], [r["position"] for r in ITL])
    assert [r["ttft_s"] for r in m_ttft] == sorted(r["ttft_s"] for r in m_ttft)  # prefill grows with the prompt
    assert m_ttft[-1]["ttft_s"] > 2 * m_itl[-1]["itl_s"]  # a long prompt costs more than one decode step
    fig = ttft_itl_figure(TTFT, ITL, modelled=(m_ttft, m_itl))
    assert len(fig.data) == 4 and fig.data[2].name == "cost model (roofline)"
    two = ttft_itl_figure(TTFT, ITL, modelled={"peaks": (m_ttft, m_itl), "calibrated": (m_ttft[:1], m_itl[:1])})
    assert [t.name for t in two.data[2:]] == ["peaks", "peaks", "calibrated", "calibrated"]
    assert len(two.data[4].x) == 1 and two.data[2].line.dash != two.data[4].line.dash
    assert "prefill 100% of it" in reply_time_figure(TTFT, ITL, 16, 1).layout.title.text
    with pytest.raises(ValueError, match="window must be larger than sinks"):
        sliding_slots_figure(30, 4, 4)


def test_sliding_slots_figure_agrees_with_the_cache():
    model = tiny()
    cache = model.new_cache("sliding", window=10, sinks=3)
    run_pieces(model, ids(25), cache, [10] + [1] * 15)
    assert list(sliding_slots_figure(25, 10, 3).data[0].x) == cache.kept_positions().tolist()


def test_widgets_redraw_in_place_when_a_slider_moves():
    memory = labkit.widgets.kv_memory_calculator(["llama-2-7b"])
    bits = memory.children[0].children[1]
    bits.value = 4
    assert "4-bit" in memory.children[1].layout.title.text
    blocks = labkit.widgets.block_size_explorer([5, 17, 30], max_len=64)
    blocks.children[0].children[0].value = 64
    assert blocks.children[1].layout.title.text.startswith("Block size 64")
    reply = labkit.widgets.reply_time_explorer(TTFT, ITL)
    reply.children[0].children[0].value = 1024
    assert reply.children[1].layout.title.text.startswith("1024-token prompt")
    model = tiny()
    rows = []
    window = labkit.widgets.window_explorer(model, ids(40)[0].tolist(), rows, full_ppl=50.0, window=16)
    window.children[0].children[0].value = 32
    assert sorted((r["window"], r["sinks"]) for r in rows) == [(16, 0), (16, 4), (32, 0), (32, 4)]


@pytest.mark.parametrize("name,solution,wrong", [
    ("mixed_cache_bytes", lambda w, n, h, d, b: 2 * h * d * b * sum(n if x == 0 else min(n, x) for x in w),
     lambda w, n, h, d, b: 2 * h * d * b * n * len(w)),  # every layer counted as global
    ("streaming_keep", None, lambda n, k, w, s: list(range(n))[-(w - k):]),
    ("asym_quantize", None, lambda x, b: x.round()),
    ("csa_layer_values", lambda n, b, w, kv, ix: min(n, w - 1) * 2 * kv + n // b * (kv + ix) + n % b * (2 * kv + ix),
     lambda n, b, w, kv, ix: min(n, w) * 2 * kv + n // b * (kv + ix)),  # the window one too long, no pending rows
])
def test_exercises_pass_the_solution_and_fail_a_wrong_answer(name, solution, wrong, capsys):
    from labkit.exercises import kvcache as ex

    check = getattr(labkit.exercises, f"check_{name}")
    reference = {"streaming_keep": ex._keep, "asym_quantize": ex._asym}.get(name, solution)
    assert check(reference)
    assert not check(wrong)
    assert "[FAIL]" in capsys.readouterr().out
    if name == "csa_layer_values":  # each part on its own is needed: drop any one and a case fails
        for broken in (lambda n, b, w, kv, ix: min(n, w - 1) * 2 * kv + n // b * (kv + ix),
                       lambda n, b, w, kv, ix: min(n, w - 1) * 2 * kv + n // b * kv + n % b * (2 * kv + ix),
                       lambda n, b, w, kv, ix: min(n, w - 1) * kv + n // b * (kv + ix) + n % b * (2 * kv + ix),
                       lambda n, b, w, kv, ix: min(n, w - 1) * 2 * kv + n // b * (kv + ix) + n % b * 2 * kv):
            assert not check(broken)
