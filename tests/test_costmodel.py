"""The roofline cost model: work counts, roofline times, spill, bad input."""
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from labkit.costmodel import estimate, ridge_tokens
from labkit.costmodel import HARDWARE, hardware
from labkit.costmodel.memlevels import onchip_fraction
from labkit.costmodel.roofline import phase_time
from labkit.costmodel.workload import ModelShape, bits_per_element, decode_work, kv_bytes_per_token, prefill_work


from tests.costmodel_configs import L2_7B, L2_13B, L2_70B, L32_1B, L32_3B, SMOL, Cfg

GPUS = ["a100-sxm", "h100-sxm", "h200-sxm", "mi300x"]
STATIC = [k for k in HARDWARE if k != "this-machine"]


def test_parameter_counts_match_the_published_sizes():
    # Llama-2: 6.74B, 13.0B, 69.0B; Llama-3.2-3B 3.21B; SmolLM2 134.5M (tolerance 0.5 %)
    for cfg, n in [(L2_7B, 6.738e9), (L2_13B, 13.016e9), (L2_70B, 68.98e9), (L32_3B, 3.2127e9), (SMOL, 134.5e6)]:
        assert ModelShape.of(cfg).n_params == pytest.approx(n, rel=5e-3)


def test_accepts_ffn_dim_as_the_swiglu_width():
    @dataclass
    class Other:
        n_layers: int = 30; d_model: int = 576; n_heads: int = 9; n_kv_heads: int = 3; head_dim: int = 64
        ffn_dim: int = 1536; vocab_size: int = 49152; tie_embeddings: bool = True
    assert ModelShape.of(Other()) == ModelShape.of(SMOL)


def test_kv_bytes_per_token_uses_kv_heads_and_head_dim():
    # research note §3.6: 13B 800 KiB, 70B 320 KiB, 3B 112 KiB, 1B 32 KiB (fp16)
    assert kv_bytes_per_token(L2_13B) == 800 * 1024
    assert kv_bytes_per_token(L2_70B) == 320 * 1024
    assert kv_bytes_per_token(L32_3B) == 112 * 1024
    assert kv_bytes_per_token(L32_1B) == 32 * 1024
    # int8 KV with an fp16 scale and minimum per 64 values (labkit's quantized caches): 8.5 / 16 of fp16
    assert kv_bytes_per_token(L2_13B, 8) / kv_bytes_per_token(L2_13B) == pytest.approx(8.5 / 16)
    # one formula: the cost model, the KV-cache memory arithmetic and the config agree, 4-bit groups included
    from labkit import kvcache
    from labkit.model import ModelConfig
    cfg = ModelConfig.from_name("llama-2-7b")
    for bits, group in ((16, None), (8, 64), (4, 64), (4, 32)):
        want = cfg.kv_bytes_per_token(bits / 8, group)
        assert kvcache.kv_bytes_per_token(cfg, bits, group) == want
        assert kv_bytes_per_token(cfg, bits, group or 64) == want
    assert cfg.kv_bytes_per_token(0.5, 64) / cfg.kv_bytes_per_token(2) == 4.5 / 16


def test_group_scales_add_bits():
    assert bits_per_element(4, 64, 16, 16) == 4.5
    assert bits_per_element(4, 32, 16, 16) == 5.0            # GGUF Q4_1: 20 bytes per 32 weights
    assert bits_per_element(8, 32, 16, 0) == 8.5             # GGUF Q8_0: 34 bytes per 32
    with pytest.raises(ValueError, match="bits must be between 1 and 32, got 0"):
        bits_per_element(0)


def test_prefill_flops_follow_2PL_plus_causal_attention():
    L = 512
    w = prefill_work(L2_13B, L)
    s = ModelShape.of(L2_13B)
    head = s.vocab_size * s.d_model                      # logits for the last prompt position only
    assert w.flops == pytest.approx(2 * (s.matmul_params - head) * L + 2 * head + 2 * s.n_layers * s.attn_width * L * (L + 1))
    # llm-analysis counts 13.27 TFLOPs (LM head on every position, attention not causal-halved): within 3 %
    assert float(w.flops) == pytest.approx(13.27e12, rel=0.03)


def test_decode_reads_weights_once_and_the_whole_cache():
    w = decode_work(L2_7B, np.array([0, 1000]), batch=4)
    s = ModelShape.of(L2_7B)
    assert w.weight_bytes == s.streamed_params * 2
    assert w.kv_read_bytes[1] == 1000 * 4 * kv_bytes_per_token(L2_7B)
    assert w.kv_read_bytes[0] == 0


@pytest.mark.parametrize("key", STATIC)
def test_batch1_decode_is_memory_bound_and_long_prefill_compute_bound(key):
    est = estimate(L2_7B, key, prompt_len=4096, reply_len=8)
    assert est.bound == {"prefill": "compute", "decode": "memory"}
    assert est.mfu_decode < 0.05                  # "GPU utilisation < 30 %" is true but loose: it is a few %
    assert est.mbu_decode <= hardware(key).mem_eff + 1e-9


def test_ridge_point_in_tokens():
    # A100 fp16 at equal efficiencies: 312e12 * 2 B / (2 * 2039e9 B/s) = 153 tokens
    assert ridge_tokens("a100-sxm", compute_eff=1, mem_eff=1) == pytest.approx(312e12 * 2 / (2 * 2039e9))
    r = ridge_tokens("a100-sxm")
    hw = hardware("a100-sxm")
    for n, bound in ((int(r / 2), "memory"), (int(2 * r), "compute")):
        # prompt tokens per weight read below / above the ridge (attention is negligible at these lengths)
        pt = phase_time(prefill_work(L2_13B, n), hw)
        assert pt.bound == bound, (n, r)


def test_total_is_prefill_plus_steps_and_steps_grow_with_context():
    est = estimate(L2_13B, "h100-sxm", 1000, 200)
    assert est.total_s == pytest.approx(est.prefill_s + est.decode_step_s.sum())
    assert len(est.decode_step_s) == 199            # the first token comes out of the prefill
    assert np.all(np.diff(est.decode_step_s) > 0)   # each step reads one more KV entry
    assert 0 < est.prefill_share < 1


@settings(max_examples=30, deadline=None)
@given(L=st.integers(1, 20000), n=st.integers(1, 300), b=st.integers(1, 64), key=st.sampled_from(STATIC))
def test_roofline_is_never_faster_than_either_roof(L, n, b, key):
    hw = hardware(key)
    est = estimate(L32_1B, hw, L, n, batch=b, weight_bits=4)
    for phase in (est.prefill, est.decode):
        flops_floor = phase.flops / (hw.peak_flops("fp16") * hw.compute_eff)
        bytes_floor = phase.level_bytes["dram"] / (hw.mem_bw_gbs * 1e9 * hw.mem_eff)
        assert np.all(phase.time >= np.maximum(flops_floor, bytes_floor) * (1 - 1e-9))
        other_levels = (phase.level_bytes["onchip"] / (hw.onchip_bw_gbs * 1e9)
                        + phase.level_bytes["offload"] / (hw.offload_bw_gbs * 1e9))
        ceiling = flops_floor + bytes_floor + other_levels + phase.t_comm
        assert np.all(phase.time <= ceiling * (1 + 1e-9) + 1e-12)
    assert est.mfu_prefill <= hw.compute_eff + 1e-9


@settings(max_examples=20, deadline=None)
@given(L1=st.integers(1, 8000), L2=st.integers(1, 8000))
def test_longer_prompts_never_prefill_faster(L1, L2):
    a, b = sorted((L1, L2))
    assert estimate(L2_7B, "phone-sd8gen3", a, 1).prefill_s <= estimate(L2_7B, "phone-sd8gen3", b, 1).prefill_s


def test_int4_weights_cut_decode_time_by_the_byte_ratio():
    fp16 = estimate(L2_7B, "h100-sxm", 16, 2)
    int4 = estimate(L2_7B, "h100-sxm", 16, 2, weight_bits=4)
    assert int4.decode_s_per_token / fp16.decode_s_per_token == pytest.approx(4.5 / 16, rel=0.03)
    assert int4.weight_bytes / fp16.weight_bytes == pytest.approx(4.5 / 16, rel=1e-3)


def test_tensor_parallel_splits_work_and_adds_communication():
    one = estimate(L2_13B, "h100-sxm", 1024, 16)
    two = estimate(L2_13B, "h100-sxm", 1024, 16, tp=2)
    assert two.prefill_flops == pytest.approx(one.prefill_flops / 2, rel=1e-6)
    assert float(two.prefill.t_comm) > 0 and float(one.prefill.t_comm) == 0
    assert one.prefill_s / 2 < two.prefill_s < one.prefill_s


def test_clock_domains_move_only_their_own_roof():
    hw = hardware("phone-sd8gen3")
    top = estimate(L32_3B, hw, 256, 64, weight_bits=4, act_bits=8)
    low_core = estimate(L32_3B, hw, 256, 64, weight_bits=4, act_bits=8, core_mhz=hw.vf.fmax / 2)
    low_mem = estimate(L32_3B, hw, 256, 64, weight_bits=4, act_bits=8, mem_mhz=hw.fmax_mem / 2)
    assert low_core.prefill_s == pytest.approx(2 * top.prefill_s, rel=0.05)         # compute-bound: 1/f
    assert low_core.decode_s_per_token == pytest.approx(top.decode_s_per_token, rel=0.01)  # decode: free
    assert low_mem.decode_s_per_token == pytest.approx(2 * top.decode_s_per_token, rel=0.05)  # 1/f_mem
    assert low_mem.prefill_s == pytest.approx(top.prefill_s, rel=0.05)


def test_kv_in_sram_takes_the_newest_tokens_off_dram():
    hw = hardware("phone-sd8gen3")
    a = estimate(L32_3B, hw, 2000, 2, weight_bits=4)
    b = estimate(L32_3B, hw, 2000, 2, weight_bits=4, kv_sram_mb=8)
    moved = a.decode.level_bytes["dram"] - b.decode.level_bytes["dram"]
    sram, kv_tok = 8 * 2**20, kv_bytes_per_token(L32_3B)
    # the reads of the newest 8 MiB of cache, plus the on-chip share of the one entry appended
    assert moved[0] == pytest.approx(sram + kv_tok * sram / (2001 * kv_tok), rel=1e-9)
    assert onchip_fraction(2000 * kv_bytes_per_token(L32_3B), 8 * 2**20) == pytest.approx(8 * 2**20 / (2000 * 114688))
    assert b.decode_s_per_token < a.decode_s_per_token


def test_spill_past_dram_capacity_reads_from_the_offload_level():
    hw = hardware("phone-sd8gen3")
    fits = estimate(L2_7B, hw, 1000, 2, weight_bits=4)
    spills = estimate(L2_7B, hw, 8000, 2, weight_bits=4)
    assert fits.spill_bytes == 0 and spills.spill_bytes > 1e9
    off = spills.decode.level_bytes["offload"][0]
    assert off == pytest.approx(spills.spill_bytes, rel=0.01)
    assert spills.decode_s_per_token >= off / (hw.offload_bw_gbs * 1e9)   # the flash read sets the pace
    assert spills.decode_s_per_token > 3 * fits.decode_s_per_token


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompt_len=-1), r"prompt_len must be an integer >= 1, got -1"),
    (dict(prompt_len=0), r"prompt_len must be an integer >= 1, got 0"),
    (dict(reply_len=2.5), r"reply_len must be an integer >= 1, got 2.5"),
    (dict(batch=0), r"batch must be an integer >= 1, got 0"),
    (dict(weight_bits=0), r"weight_bits must be a number in \[1, 32\] \(bits per value\), got 0"),
    (dict(compute_eff=1.5), r"compute_eff must be in \(0, 1\], got 1.5"),
    (dict(kv_sram_mb=100), r"kv_sram_mb must be between 0 and phone-sd8gen3's on-chip 8 MB, got 100"),
    (dict(tp=2), r"tp must be 1 on phone-sd8gen3 \(it has no chip-to-chip link\), got 2"),
    (dict(core_mhz=5000), r"core_mhz must be at most the top of the V-f table \(1300 MHz\), got 5000"),
    (dict(mem_mhz=-1), r"mem_mhz must be in \(0, 4800\] MHz for phone-sd8gen3, got -1"),
])
def test_bad_input_names_the_parameter_the_value_and_what_is_allowed(kwargs, match):
    args = dict(prompt_len=16, reply_len=4) | kwargs
    with pytest.raises(ValueError, match=match):
        estimate(L2_7B, "phone-sd8gen3", **args)


def test_zero_bandwidth_hardware_is_rejected():
    with pytest.raises(ValueError, match="mem_bw_gbs must be a positive number, got 0"):
        estimate(L2_7B, hardware("h100-sxm").replace(mem_bw_gbs=0), 16, 4)


def test_a_config_missing_fields_is_a_type_error():
    with pytest.raises(TypeError, match="missing"):
        estimate(object(), "h100-sxm", 16, 4)
    with pytest.raises(ValueError, match="n_heads must be a multiple of n_kv_heads, got 9 and 4"):
        ModelShape.of(Cfg(30, 576, 9, 4, 64, 1536, 49152))


@pytest.mark.parametrize("module", ["labkit.costmodel.dvfs", "labkit.costmodel.profiles", "labkit.costmodel.workload", "labkit.costmodel.memlevels",
                                    "labkit.costmodel.estimator", "labkit.power.switching", "labkit.power.kvpressure"])
def test_docstring_examples_hold(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
