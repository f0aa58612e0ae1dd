"""Quantized linear layers: the packed kernels compute x·dequantize(W)ᵀ; a quantized model still runs everything."""
import pytest
import torch

import labkit
from labkit.quant import QuantLinear, dequantize, has_kernel, model_nbytes, quantize, quantize_model
from tests.kvcache_shared import tiny

needs_kernels = pytest.mark.skipif(not (has_kernel(8) and has_kernel(4)), reason="this torch has no packed CPU kernels")


@needs_kernels
@pytest.mark.parametrize("bits", [8, 4])
def test_packed_kernel_equals_the_reference(bits):
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(96, 128, generator=g), torch.randn(2, 5, 128, generator=g)
    fast, ref = QuantLinear.from_float(w, bits=bits), QuantLinear.from_float(w, bits=bits, reference=True)
    assert not fast.reference and ref.reference
    exact = x @ fast.weight.t()  # float32 product with the dequantized weights
    assert torch.allclose(fast(x), exact, atol=1e-4, rtol=1e-5)  # float32 activations: only summation order differs
    assert torch.allclose(ref(x), exact, atol=1e-5)
    half = QuantLinear.from_float(w, bits=bits, act_dtype=torch.bfloat16)(x)
    assert (half - exact).abs().max() <= 0.02 * exact.abs().max()  # bfloat16 activations: ~3 significant digits


def test_weights_are_the_rtn_codes():
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(QuantLinear.from_float(w, 8).weight, dequantize(quantize(w, 8, "channel")))
    assert torch.equal(QuantLinear.from_float(w, 4, group_size=32).weight, dequantize(quantize(w, 4, 32, symmetric=False)))


def test_a_quantized_model_generates_like_its_dequantized_self():
    model = tiny(d_model=64, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=128, tie_embeddings=True)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(2))
    for bits in (8, 4):
        q = quantize_model(model, bits=bits, group_size=32, act_dtype=torch.float32)
        r = quantize_model(model, bits=bits, group_size=32, reference=True)
        assert q.lm_head is not None and model.lm_head is None  # the tied head got its own quantized copy
        assert torch.allclose(q(ids), r(ids), atol=1e-4)
        cache = q.new_cache(max_len=20)
        stepped = torch.cat([q(ids[:, :8], cache=cache), q(ids[:, 8:], cache=cache)], dim=1)
        assert torch.allclose(stepped, q(ids), atol=1e-4)  # the KV cache works as before
        assert labkit.decode(q, labkit.prefill(q, ids[0].tolist()), 5) == labkit.decode(r, labkit.prefill(r, ids[0].tolist()), 5)
    float_bytes, int4_bytes = model_nbytes(model), model_nbytes(quantize_model(model, bits=4))
    assert int4_bytes < 0.2 * float_bytes  # 4 bits + group scales against 32 bits


def test_bad_input_says_what_is_allowed():
    w = torch.randn(16, 64)
    with pytest.raises(ValueError, match=r"no packed kernel holds 3-bit codes.*reference=True"):
        QuantLinear.from_float(w, bits=3)
    with pytest.raises(ValueError, match=r"bits must be one of \(2, 3, 4, 5, 6, 7, 8\), got 1"):
        QuantLinear.from_float(w, bits=1, reference=True)
    with pytest.raises(ValueError, match="int4 kernel takes asymmetric codes in groups of 32, 64, 128 or 256"):
        QuantLinear.from_float(w, bits=4, group_size=16)
    with pytest.raises(ValueError, match=r"method must be one of \('rtn', 'gptq', 'awq'\), got 'gptq2'"):
        quantize_model(tiny(), method="gptq2")
    with pytest.raises(ValueError, match="group_size=48 does not divide the 64 input features"):
        QuantLinear.from_float(w, bits=4, group_size=48)
    with pytest.raises(ValueError, match="act_dtype must be one of"):
        QuantLinear.from_float(w, bits=8, act_dtype=torch.float16)
    with pytest.raises(ValueError, match="int8 kernel takes per-channel symmetric codes"):
        QuantLinear(quantize(w, 8, 32))


@pytest.mark.parametrize("bits,group_size", [(3, 16), (3, "channel"), (4, "channel"), (2, 32)])
def test_layouts_without_a_kernel_run_as_the_float_reference(bits, group_size):
    w, x = torch.randn(24, 64), torch.randn(5, 64)
    layer = QuantLinear.from_float(w, bits=bits, group_size=group_size, reference=True)
    qt = quantize(w, bits, group_size, symmetric=False)
    assert layer.reference and torch.allclose(layer(x), x @ dequantize(qt).t(), atol=1e-5)
    assert layer.nbytes() == 24 * 64 * bits // 8 + qt.scale.numel() * 4  # codes + a 16-bit scale and minimum per group


def test_quantize_model_at_3_bits_and_per_channel_int4_runs_the_reference_and_loses_more():
    model = tiny().requires_grad_(False)
    ids = torch.randint(0, model.config.vocab_size, (1, 24))
    ref = model(ids)
    err = {}
    for bits, group in [(8, 16), (4, 16), (4, "channel"), (3, 16)]:
        q = quantize_model(model, bits=bits, group_size=group)
        layers = [m for m in q.modules() if isinstance(m, QuantLinear)]
        assert all(m.bits == bits for m in layers)
        # int4 groups of 16, per-channel int4 and 3 bits are layouts no packed kernel takes
        assert ("reference" in q.quantization["kernel"]) == (bits != 8 or not has_kernel(8))
        assert all(m.reference for m in layers if m.bits == 3 or (m.bits == 4 and m.group_size not in (32, 64, 128, 256)))
        err[(bits, group)] = float((q(ids) - ref).pow(2).mean())
    assert err[(8, 16)] < err[(4, 16)] < err[(3, 16)]
    assert err[(4, 16)] < err[(4, "channel")]  # one scale per row spans the row's outliers
    with pytest.raises(ValueError, match=r"bits must be one of \(8, 4, 3\), got 2"):
        quantize_model(model, bits=2)


@pytest.mark.skipif(not (has_kernel(8) and has_kernel(4)), reason="no packed kernels in this torch build")
def test_nbytes_is_what_a_packed_bf16_layer_holds():
    w = torch.randn(64, 128)
    for bits in (8, 4):
        layer = QuantLinear.from_float(w, bits=bits, group_size=32, act_dtype=torch.bfloat16)
        held = sum(b.numel() * b.element_size() for b in layer.buffers())
        assert layer.nbytes() == held
