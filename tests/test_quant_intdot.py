"""Integer activations: Q8_0 / Q8_1 codes, exact integer block sums two ways, block-format layers and models."""
import doctest

import pytest
import torch

from labkit.metrics.protocol import quality
from labkit.quant import ggml, intdot, model_nbytes, quantize_model, sweep
from labkit.quant import blocklinear
from labkit.quant.blocklinear import BlockLinear
from tests.kvcache_shared import tiny

needs_int_mm = pytest.mark.skipif(not intdot.has_int_mm(), reason="this torch has no torch._int_mm on the CPU")


def _data(m=3, n=40, k=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g) * 3, torch.randn(n, k, generator=g)


def test_activation_codes_are_q8_0_and_q8_1():
    x, _ = _data()
    x[1, :32] = 0.0  # an all-zero block: d = 0, codes 0
    q, d, s = intdot.quantize_activations(x, with_sum=True)
    blocks = x.reshape(3, 4, 32)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert torch.equal(d, (blocks.abs().amax(-1) / 127).half().float())  # the fp16 step the block stores
    assert (q.reshape(3, 4, 32).abs().amax(-1)[d > 0] == 127).all()  # the block's largest value is ±127
    assert torch.all((q.float().reshape(3, 4, 32) * d.unsqueeze(-1) - blocks).abs() <= d.unsqueeze(-1) * 0.51 + 1e-6)
    assert d[1, 0] == 0 and not q[1, :32].any() and s[1, 0] == 0
    raw = (blocks.abs().amax(-1) / 127) * q.reshape(3, 4, 32).sum(-1).float()
    assert torch.equal(s, raw.half().float())  # Q8_1: s = d·Σq
    assert intdot.quantize_activations(x)[2] is None
    # llama.cpp rounds halves away from zero; 0.5 and 2.5 steps must go up in magnitude
    half = torch.tensor([[127.0, 0.5, 2.5, -2.5] + [0.0] * 28])
    assert intdot.quantize_activations(half)[0][0, :4].tolist() == [127, 1, 3, -3]


def test_block_sums_are_exact_both_ways():
    x, w = _data()
    qa = intdot.quantize_activations(x)[0]
    qw = torch.randint(-127, 128, w.shape, dtype=torch.int8, generator=torch.Generator().manual_seed(1))
    qw[0] = 127
    qa_ = qa.clone()
    qa_[0] = -127  # the extreme sums: 32·127·127 in one block
    exact = (qa_.double().reshape(3, 1, 4, 32) * qw.double().reshape(1, 40, 4, 32)).sum(-1)
    ref = intdot.block_sums(qa_, qw)
    assert ref.dtype == torch.int32 and torch.equal(ref.double(), exact)
    assert int(ref[0, 0, 0]) == -32 * 127 * 127
    assert torch.equal(intdot.float_block_sums(qa_, qw), ref)  # float32, exact: every partial sum < 2^24
    if intdot.has_int_mm() and intdot.int_mm_exact():  # where it is not, no layer takes it (tested below)
        assert torch.equal(intdot.int_mm_block_sums(qa_, qw.t()), ref)


def test_float_sums_are_exact_where_float32_holds_every_partial_sum_and_refused_beyond():
    """All codes at ±127 in blocks of the largest allowed size: each sum is ±block·127², exact in float32; a block
    one larger could pass 2^24, where float32 starts to round, and is refused."""
    big = intdot.FLOAT_EXACT_BLOCK
    assert big * 127 * 127 < 2**24 <= (big + 1) * 127 * 127
    qa = torch.full((2, 2 * big), 127, dtype=torch.int8)
    qa[1, ::3] = -127
    qw = torch.full((5, 2 * big), -127, dtype=torch.int8)
    qw[2, 1::2] = 126
    assert torch.equal(intdot.float_block_sums(qa, qw, block=big), intdot.block_sums(qa, qw, block=big))
    with pytest.raises(ValueError, match="block must be at most"):
        intdot.float_block_sums(qa[:, :big + 1], qw[:, :big + 1], block=big + 1)
    # the rounding the guard prevents is real: above 2^24 float32 loses odd integers
    assert float(torch.tensor(2**24 + 1, dtype=torch.float32)) != 2**24 + 1


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_1"])
def test_integer_product_equals_a_float_computation_of_the_same_codes(fmt):
    x, w = _data(seed=2)
    ref = BlockLinear(w, fmt, "int8", "reference")
    qa, da, sa = intdot.quantize_activations(x, with_sum=fmt == "Q4_1")
    # the same quantized numbers multiplied in float64: dequantized weights times dequantized inputs
    a = (qa.double().reshape(3, 4, 32) * da.double().unsqueeze(-1)).reshape(3, 128)
    y64 = a @ ref.weight.double().t()
    if fmt == "Q4_1":  # Q8_1's s = d·Σq is stored at fp16: the offset term uses that s, as llama.cpp's does
        exact_s = (qa.double().reshape(3, 4, 32).sum(-1) * da.double())
        y64 = y64 + (sa.double() - exact_s) @ ref.m.double().t()
    y = ref(x)
    assert torch.allclose(y.double(), y64, rtol=1e-5, atol=1e-4 * float(y64.abs().max()))
    assert ref.weight.equal(torch.from_numpy(ggml.dequantize(ggml.quantize(w.numpy(), fmt), fmt, tuple(w.shape))))
    if intdot.has_int_mm() and intdot.int_mm_exact():
        assert torch.equal(BlockLinear(w, fmt, "int8", "int_mm")(x), y)  # identical int32 sums, identical floats
    assert torch.equal(BlockLinear(w, fmt, "int8", "float")(x), y)  # exact float32 block products: the same bits
    assert BlockLinear(w, fmt, "int8").sums == "float"  # "auto"
    # activations quantized cost a little: the result stays close to the float-activation product
    flo = BlockLinear(w, fmt)(x)
    assert float((y - flo).abs().max()) < 0.05 * float(flo.abs().max())


def test_block_layers_store_the_formats_bytes():
    _, w = _data(n=64, k=128)
    for fmt, bits in (("Q8_0", 8.5), ("Q4_1", 5.0)):
        assert BlockLinear(w, fmt).nbytes() == 64 * 128 * bits / 8
    assert doctest.testmod(intdot).failed == 0 and doctest.testmod(blocklinear).failed == 0


def test_block_format_models_run_and_score():
    model = tiny(d_model=64, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=128, tie_embeddings=True)
    model.requires_grad_(False)
    ids = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    ref = model(torch.tensor([ids]))
    for fmt, act in sweep.FORMATS:
        q = quantize_model(model, fmt=fmt, activations=act, sums="reference")
        assert isinstance(q.lm_head, BlockLinear) and q.quantization["fmt"] == fmt
        assert model_nbytes(q) < 0.3 * model_nbytes(model)
        got = q(torch.tensor([ids]))
        assert (got.softmax(-1) - ref.softmax(-1)).abs().max() < 0.2  # still the same model, roughly
        assert quality(q, ids, window=16, stride=8)["tokens"] == len(ids) - 1
        assert sweep.quantize_variant(model, fmt, act).quantization["activations"] == act
    assert sweep.variant_name("Q4_1", "int8") == "Q4_1 W4A8 (int8 activations)"


def test_the_default_is_the_fast_layout():
    model = tiny(d_model=64, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=128)
    assert quantize_model(model, bits=8).quantization["act_dtype"] == "bfloat16"
    assert quantize_model(model, bits=4, act_dtype=torch.float32).quantization["act_dtype"] == "float32"


def test_bad_input_names_the_parameter():
    model = tiny(vocab_size=64)
    _, w = _data()
    with pytest.raises(TypeError, match="model must be a torch module"):
        quantize_model("smollm2-135m", bits=8)
    with pytest.raises(TypeError, match="calib must be token ids.*got a str"):
        quantize_model(model, method="awq", bits=4, calib="some text")
    with pytest.raises(ValueError, match="fmt must be one of"):
        quantize_model(model, fmt="FP4")
    with pytest.raises(ValueError, match="pass fmt or bits/group_size, not both"):
        quantize_model(model, fmt="Q8_0", bits=4)
    with pytest.raises(ValueError, match="method must be 'rtn'"):
        quantize_model(model, method="gptq", fmt="Q8_0")
    with pytest.raises(ValueError, match="activations='int8' multiplies integer codes"):
        BlockLinear(w, "MXFP4", activations="int8")
    with pytest.raises(ValueError, match="needs a block format"):
        quantize_model(model, bits=8, activations="int8")
    with pytest.raises(ValueError, match="x contains NaN or inf"):
        intdot.quantize_activations(torch.tensor([[float("nan")] * 32]))
    with pytest.raises(ValueError, match="multiple of 32"):
        intdot.quantize_activations(torch.ones(2, 40))
    with pytest.raises(TypeError, match="x must be a floating-point"):
        intdot.quantize_activations(torch.ones(2, 32, dtype=torch.long))
    with pytest.raises(TypeError, match="ids must be token ids.*got text"):
        quality(model, "Hello there", window=8, stride=4)
    from labkit.quant import dequantize
    with pytest.raises(TypeError, match="qt must be a QuantizedTensor"):
        dequantize(torch.randn(8, 64))


def test_seed_verdicts():
    assert sweep.seed_verdict([0.0, 0.019], 0.02) == "holds"
    assert sweep.seed_verdict([0.021], 0.02) == "fails"
    assert sweep.seed_verdict([0.01, 0.03], 0.02) == "inconclusive"
    assert sweep.apart([0.1], [0.2, 0.3]) and not sweep.apart([0.1, 0.25], [0.2, 0.3])
    with pytest.raises(ValueError, match="at least one"):
        sweep.seed_verdict([], 0.02)


def test_gguf_agreement_check_and_the_figures():
    import numpy as np

    from labkit.quant import ggml
    from labkit.viz.quant import quality_figure, tradeoff_figure
    from labkit.quant.tradeoff import layer_tradeoff

    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    if ggml.agrees_with_gguf(x, "Q4_1") is not None:  # None: gguf not installed
        assert all(ggml.agrees_with_gguf(x, q) for q in ("Q8_0", "Q4_1", "MXFP4", "NVFP4"))
    rows = [{"name": n, "vs_float32_bytes": b, "kl": k} for n, b, k in
            (("float32", 1, 0), ("int4 RTN g32", 0.16, 0.05), ("MXFP4", 0.14, 0.08), ("Q8_0 W8A8 (int8 activations)", 0.27, 0.01),
             ("int4 GPTQ g32 seed 1", 0.16, 0.02))]
    fig = quality_figure(rows, "t")
    names = {t.name: list(t.hovertext) for t in fig.data if t.hovertext is not None}
    assert names["block format"] == ["MXFP4", "Q8_0 W8A8 (int8 activations)"]
    assert not any("seed" in h for hs in names.values() for h in hs)  # noise-band rows are not extra points
    w, xin = torch.randn(16, 64), torch.randn(32, 64)
    row = [layer_tradeoff(w, xin, 4, 32, "rtn", n_weights=1e7, bandwidth_gb_s=10.0)]
    assert "the Shakespeare target 6 MB" in tradeoff_figure(row, "the Shakespeare target").layout.title.text


def test_measurement_helpers_return_what_they_say():
    from labkit.costmodel.measure import bf16_product_rates, cpu_flags
    from labkit.generation.profile import layer_rates

    flags = cpu_flags()
    assert flags == {} or (set(flags) >= {"avx2", "avx512_bf16"} and all(isinstance(v, bool) for v in flags.values()))
    r = bf16_product_rates(seconds=0.05, out_features=64, in_features=64)
    assert r["bytes"] == 64 * 64 * 4 and r["bf16_vs_f32"] == pytest.approx(r["bfloat16_gb_s"] / r["float32_gb_s"])
    with pytest.raises(ValueError, match="out_features must be a positive integer"):
        bf16_product_rates(out_features=0)
    calls = []
    us = layer_rates({"a": lambda v: calls.append(1), "b": lambda v: v + 1}, torch.ones(2), rounds=2, repeat=3)
    assert set(us) == {"a", "b"} and len(calls) == 3 * 3 and all(v > 0 for v in us.values())  # warm-up round + 2
    with pytest.raises(ValueError, match="rounds and repeat must be positive"):
        layer_rates({}, torch.ones(1), rounds=0)


@pytest.mark.skipif(not intdot.has_int_mm(), reason="this torch has no torch._int_mm on the CPU")
def test_the_per_product_bench_times_every_kernel_on_one_matrix():
    from labkit.benchmarks.quant import products
    from labkit.quant import has_kernel

    if not (has_kernel(8) and has_kernel(4)):
        pytest.skip("no packed kernels in this torch build")
    model = tiny(d_model=64, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=128)
    got = products(model, rounds=1)
    w = model.layers[0].mlp.w_gate_up.weight
    assert got["float32 mm"]["bytes"] == w.numel() * 4 and got["Q8_0 W8A8, reference sums"]["bytes"] == w.numel() * 34 // 32
    assert ("Q8_0 W8A8, int_mm" in got) == intdot.int_mm_exact()  # no row for an int_mm that is inexact here
    assert got["Q8_1 activations alone"]["gb_s"] is None and all(r["us"] > 0 for r in got.values())


def test_int_mm_is_checked_before_it_is_trusted(monkeypatch):
    """A `torch._int_mm` that saturates (as oneDNN's int8 path without VNNI does, pairs summed in int16) is caught
    by the check; an explicit "int_mm" is then refused, naming why ("auto" never takes it)."""
    def saturating(a, b):  # vpmaddubsw: (a + 128) as u8 times b as s8, pairs into int16, then the shift taken off
        u = a.to(torch.int32) + 128
        pairs = (u.unsqueeze(-1) * b.to(torch.int32).unsqueeze(0))  # [M, K, N]
        pairs = pairs.view(a.shape[0], -1, 2, b.shape[1]).sum(2).clamp(-32768, 32767)
        return pairs.sum(1) - 128 * b.to(torch.int32).sum(0)

    exact = lambda a, b: a.to(torch.int32) @ b.to(torch.int32)  # noqa: E731
    assert intdot.int_mm_exact(exact) and not intdot.int_mm_exact(saturating)
    monkeypatch.setattr(intdot, "int_mm_exact", lambda mm=None: False)
    assert intdot.resolve_sums("auto") == "float" and intdot.resolve_sums("int_mm") == "int_mm"
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(2))
    assert BlockLinear(w, "Q8_0", "int8").sums == "float"
    with pytest.raises(ValueError, match="torch._int_mm gives inexact sums on this CPU"):
        BlockLinear(w, "Q8_0", "int8", "int_mm")
