"""The roofline calibrated on a model's own products: the rows table, the LM head part, the calibration."""
import math

import numpy as np
import pytest

from labkit import costmodel
from labkit.benchmarks.calibrate import calibrate, linear_shapes, product_times
from labkit.costmodel.roofline import phase_time
from labkit.costmodel.workload import ModelShape, prefill_work
from labkit.model import ModelConfig

TINY = ModelConfig(vocab_size=256, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
PI5 = "raspberry-pi-5"


def test_eff_rows_interpolate_in_log_rows_and_hold_at_the_ends():
    hw = costmodel.hardware(PI5).replace(compute_eff_rows=((16, 0.5), (256, 1.0)))
    assert hw.compute_eff_at(64) == pytest.approx(0.75)       # halfway between 16 and 256 in log
    assert hw.compute_eff_at(4) == pytest.approx(0.5)
    assert hw.compute_eff_at(4096) == pytest.approx(1.0)
    assert np.allclose(hw.compute_eff_at([16, 256]), [0.5, 1.0])
    plain = costmodel.hardware(PI5)
    assert plain.compute_eff_at(64) == plain.compute_eff


@pytest.mark.parametrize("table", [((16, 0.5), (16, 0.7)), ((32, 0.5), (16, 0.7)), ((0, 0.5),), ((16, 1.5),),
                                   ((16, 0),), ((16,),), "abc"])
def test_bad_eff_rows_are_refused(table):
    with pytest.raises(ValueError, match="compute_eff_rows"):
        costmodel.hardware(PI5).replace(compute_eff_rows=table)


def test_prefill_takes_the_efficiency_at_its_prompt_length():
    """Llama-2-7B's 64-token prefill on an M4 Max is compute-bound: the blocks' compute time follows the
    table's value at the prompt length (the LM head's one row and attention keep theirs)."""
    hw = costmodel.hardware("apple-m4-max")
    e = hw.compute_eff
    plain = costmodel.estimate("llama-2-7b", hw, 64, 1)
    one = costmodel.estimate("llama-2-7b", hw.replace(compute_eff_rows=((1, e),)), 64, 1)
    assert one.prefill_s == pytest.approx(plain.prefill_s)
    ramp = hw.replace(compute_eff_rows=((1, e), (16, e / 2), (256, e)))     # 64 rows: 3/4 of e
    slow = costmodel.estimate("llama-2-7b", ramp, 64, 1)
    shape = ModelShape.of("llama-2-7b")
    body = 2.0 * (shape.matmul_params - shape.vocab_size * shape.d_model) * 64 / (hw.peak_flops("fp16") * e)
    assert slow.prefill_s - plain.prefill_s == pytest.approx(body * (4 / 3 - 1), rel=1e-6)


def test_the_lm_head_is_its_own_part_of_a_prefill():
    """Prefill runs the LM head on one row: its bytes are paid even when the blocks are compute-bound."""
    hw = costmodel.hardware(PI5)
    shape = ModelShape.of(TINY)
    work = prefill_work(TINY, 512, weight_bits=32, kv_bits=32, act_bits=32)
    pt = phase_time(work, hw, weight_bits=32, kv_bits=32, act_bits=32)
    peak = hw.peak_flops("fp32") * hw.compute_eff
    bw = hw.mem_bw_gbs * 1e9 * hw.mem_eff
    head_flops = 2.0 * shape.vocab_size * shape.d_model
    body_flops = 2.0 * (shape.matmul_params - shape.vocab_size * shape.d_model) * 512
    head_bytes = 4.0 * shape.vocab_size * shape.d_model
    body_bytes = work.weight_bytes - head_bytes + work.act_bytes
    attn = max(work.attn_flops / peak, (work.kv_write_bytes + work.kv_read_bytes) / bw)
    expected = max(body_flops / peak, body_bytes / bw) + max(head_flops / peak, head_bytes / bw) + attn
    assert float(pt.time) == pytest.approx(expected, rel=1e-9)
    assert body_flops / peak > body_bytes / bw and head_bytes / bw > head_flops / peak  # the two parts differ in bound


def test_product_times_cover_every_layer_and_row():
    times = product_times(TINY, rows=(1, 4), seconds=0.01, megabytes=1)
    params = sum(i * o for i, o in linear_shapes(TINY))
    assert params == ModelShape.of(TINY).layer_matmul_params
    assert set(times["rows"]) == {1, 4} and all(t > 0 for t in times["rows"].values())
    assert times["flops"][4] == 2.0 * 4 * params * TINY.n_layers
    assert times["bytes"] == 4.0 * params * TINY.n_layers
    assert times["layers_timed"] == min(TINY.n_layers, math.ceil(2**20 / (4 * params)))


@pytest.mark.parametrize("kw", [dict(rows=()), dict(rows=(0,)), dict(rows=(2.5,)), dict(seconds=0), dict(megabytes=0)])
def test_product_times_refuse_bad_settings(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        product_times(TINY, **kw)


def test_calibrate_turns_times_into_efficiencies():
    hw = costmodel.hardware(PI5)
    peak, bw = hw.peak_flops("fp32"), hw.mem_bw_gbs * 1e9
    times = {"rows": {1: 2e9 / (0.5 * bw), 16: 1.0, 64: 2.0}, "flops": {1: 1.0, 16: 0.25 * peak, 64: 3 * peak},
             "bytes": 2e9, "layers_timed": 1}
    cal = calibrate(TINY, hw, rows=(16, 64), times=times)
    assert cal.mem_eff == pytest.approx(0.5)
    assert cal.compute_eff_rows == ((16.0, 0.25), (64.0, 1.0))   # 1.5 of the peak is held at 1
    assert cal.product_times is times and "calibrated" in cal.name
    assert cal.provenance["compute_eff_rows"][0] == "measured" and hw.provenance["compute_eff_rows"][0] == "assumed"
    with pytest.raises(ValueError, match="one-row"):
        calibrate(TINY, hw, rows=(16,), times={**times, "rows": {16: 1.0}})


def test_calibrate_caps_the_model_input_but_keeps_the_measured_rate():
    """Products that stream faster than the `sum`: mem_eff (a model input) is held at 1, while
    `stream_gb_s` keeps the measured rate, uncapped, for reporting."""
    hw = costmodel.hardware(PI5)
    bw = hw.mem_bw_gbs * 1e9
    times = {"rows": {1: 2e9 / (1.25 * bw), 16: 1.0}, "flops": {1: 1.0, 16: 1.0}, "bytes": 2e9, "layers_timed": 1}
    cal = calibrate(TINY, hw, rows=(16,), times=times)
    assert cal.mem_eff == 1.0
    assert cal.stream_gb_s == pytest.approx(1.25 * hw.mem_bw_gbs)
    assert f"{cal.stream_gb_s:.1f} GB/s" in cal.name


def test_calibrated_smollm2_profile_on_real_products():
    """Measured on this machine: the products of more rows reach a higher efficiency, and a one-row pass
    streams its weights no faster than the read bandwidth allows (both held to (0, 1])."""
    cal = calibrate("smollm2-135m", costmodel.hardware(PI5).replace(peak_tflops={"fp32": 10.0}, mem_bw_gbs=1000),
                    rows=(16, 256), seconds=0.01, megabytes=8)
    (r16, e16), (r256, e256) = cal.compute_eff_rows
    assert (r16, r256) == (16, 256) and 0 < e16 < e256 <= 1
    assert 0 < cal.mem_eff <= 1
