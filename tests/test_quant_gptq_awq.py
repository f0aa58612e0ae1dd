"""GPTQ and AWQ: what each promises, checked against RTN on the same weights."""
import copy

import pytest
import torch

from labkit.quant import dequantize, quantize, quantize_model
from labkit.quant.awq import awq_search
from labkit.quant.calibrate import awq_blocks
from labkit.quant.gptq import gptq_quantize, hessian, layer_error
from tests.kvcache_shared import tiny


def _layer(seed=0, out=32, n_in=64, n=256):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, n_in, generator=g)
    x = torch.randn(n, n_in, generator=g) @ torch.randn(n_in, n_in, generator=g)  # correlated inputs
    return w, x


@pytest.mark.parametrize("group", [16, "channel"])
def test_gptq_is_rtn_when_the_hessian_is_diagonal(group):
    w, _ = _layer()
    H = torch.diag(torch.rand(64, generator=torch.Generator().manual_seed(5)) + 0.5).double()
    for symmetric in (False, True):
        got = gptq_quantize(w, H, bits=4, group_size=group, symmetric=symmetric)
        want = quantize(w, 4, group, symmetric=symmetric)
        assert torch.equal(got.codes, want.codes) and torch.allclose(got.scale, want.scale)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("bits,group,act_order", [(4, 16, False), (4, "channel", False), (3, "channel", True), (4, 16, True)])
def test_gptq_never_does_worse_than_rtn_on_the_layer_output(seed, bits, group, act_order):
    w, x = _layer(seed)
    H = hessian(x)
    rtn = layer_error(w, dequantize(quantize(w, bits, group, symmetric=False)), H)
    gptq = layer_error(w, dequantize(gptq_quantize(w, H, bits, group, symmetric=False, act_order=act_order)), H)
    assert gptq <= rtn


def test_gptq_says_when_the_hessian_cannot_be_inverted():
    w, _ = _layer()
    with pytest.raises(ValueError, match=r"not positive definite even with damp=0.0: use more damping"):
        gptq_quantize(w, -torch.eye(64, dtype=torch.float64), damp=0.0)
    with pytest.raises(ValueError, match=r"H must be the \[64, 64\] Hessian"):
        gptq_quantize(w, torch.eye(32))


def test_awq_search_never_loses_to_rtn_and_prefers_salient_channels():
    w, x = _layer(1)
    x[:, :4] *= 30  # a few salient input channels, as in LLM activations
    scales, alpha, errors = awq_search(w, x, bits=4, group_size=16)
    assert 0.0 in errors and errors[alpha] <= errors[0.0]
    assert alpha > 0 and float(scales[:4].min()) > float(scales[4:].max())  # the salient channels are scaled up
    with pytest.raises(ValueError, match=r"x must hold calibration inputs \[..., 64\]"):
        awq_search(w, torch.randn(10, 32))


def test_awq_folding_leaves_the_float_model_unchanged():
    for heads in (4, 2):  # with GQA (4 / 2) and without (2 / 2, where W_o is scaled too)
        model = tiny(d_model=64, n_heads=heads, n_kv_heads=2, vocab_size=64, ffn_dim=128, tie_embeddings=True)
        calib = torch.randint(0, 64, (4, 24), generator=torch.Generator().manual_seed(1))
        ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(2))
        scaled = copy.deepcopy(model)
        alphas = awq_blocks(scaled, calib, bits=4, group_size=32, symmetric=False, include_head=True)
        assert ("0.wo" in alphas) == (heads == 2) and "lm_head" in alphas
        assert torch.allclose(scaled(ids), model(ids), atol=1e-4)
        assert not torch.equal(scaled.layers[0].attn.wqkv.weight, model.layers[0].attn.wqkv.weight)


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_calibrated_models_run_and_use_the_kernels_like_the_reference(method):
    model = tiny(d_model=64, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=128, tie_embeddings=True)
    calib = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(1))
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(3))
    fast = quantize_model(model, method=method, bits=4, group_size=32, calib=calib, act_dtype=torch.float32)
    ref = quantize_model(model, method=method, bits=4, group_size=32, calib=calib, reference=True)
    assert torch.allclose(fast(ids), ref(ids), atol=1e-4)
    model.requires_grad_(False)
    kl = lambda q: float((model(ids).softmax(-1) * (model(ids).log_softmax(-1) - q(ids).log_softmax(-1))).sum(-1).mean())  # noqa: E731
    assert kl(fast) < 0.1  # close to the float model


def test_bad_calibration_input_says_what_is_needed():
    model = tiny(vocab_size=64)
    with pytest.raises(ValueError, match="method='gptq' needs calibration token ids"):
        quantize_model(model, method="gptq", bits=4)
    with pytest.raises(ValueError, match=r"calib must be integer token ids of shape \[batch, tokens >= 2\]"):
        quantize_model(model, method="awq", bits=4, calib=torch.randn(2, 8))
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 64\)"):
        quantize_model(model, method="gptq", bits=4, calib=torch.full((1, 8), 99))
    with pytest.raises(ValueError, match="needs no calibration data"):
        quantize_model(model, method="rtn", calib=torch.zeros(1, 8, dtype=torch.long))


def test_the_block_walk_sees_what_a_full_pass_sees():
    from labkit.quant.calibrate import BlockWalk, block_inputs

    model = tiny().requires_grad_(False)
    calib = torch.randint(0, model.config.vocab_size, (3, 20), generator=torch.Generator().manual_seed(2))
    walk = BlockWalk(model, calib)
    for i in range(len(model.layers)):
        got, want = walk.inputs(i, keep="inputs"), block_inputs(model, calib, i, keep="inputs")
        assert got.keys() == want.keys() and all(torch.allclose(got[k], want[k], atol=1e-5) for k in want)
        walk.advance(i)


def test_awq_measures_each_alpha_on_at_most_max_tokens_rows():
    from labkit.quant.awq import output_error

    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(16, 64, generator=g), torch.randn(300, 64, generator=g)
    _, _, errors = awq_search(w, x, bits=4, group_size=32, max_tokens=50)
    rows = x[torch.linspace(0, 299, 50).long()]
    assert errors[0.0] == pytest.approx(output_error(w, rows, torch.ones(64), 4, 32, False), rel=1e-6)
    _, _, full = awq_search(w, x, bits=4, group_size=32)  # 300 rows, under the default cap: all of them
    assert full[0.0] == pytest.approx(output_error(w, x, torch.ones(64), 4, 32, False), rel=1e-6)
