"""KIVI's quantized cache: the half-step bound, group directions, exact residual windows, bounded logit error."""
import pytest
import torch

from labkit.kvcache.quantize import dequantize_keys, dequantize_values, fake_quantize, kv_bits_per_value, pack4, quantize_keys, quantize_values, unpack4
from tests.kvcache_shared import ids, run_pieces, tiny


def _keys_with_outlier_channels(T=64, D=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, T, D, generator=g)
    x[..., [3, 17]] = x[..., [3, 17]] * 0.2 + 25.0  # channels that are large for every token, as real keys have
    return x


@pytest.mark.parametrize("bits", [4, 8])
def test_every_element_comes_back_within_half_a_step(bits):
    x = _keys_with_outlier_channels()
    codes, scale, lo = quantize_keys(x, bits, 16)
    assert codes.dtype == torch.uint8 and codes.shape[-1] == 32 * bits // 8
    assert scale.shape == lo.shape == (2, 3, 4, 32)  # one (scale, min) per channel per 16 tokens
    err = (dequantize_keys(codes, scale, lo, bits, 16) - x).abs()
    assert (err <= scale.float().repeat_interleave(16, dim=-2) / 2 * (1 + 1e-3)).all()
    codes, scale, lo = quantize_values(x, bits, 8)
    assert scale.shape == (2, 3, 64, 4)  # one (scale, min) per token per 8 channels
    err = (dequantize_values(codes, scale, lo, bits, 8) - x).abs()
    assert (err <= scale.float().repeat_interleave(8, dim=-1) / 2 * (1 + 1e-3)).all()


def test_groups_run_along_tokens_for_keys_and_along_channels_for_values():
    x = torch.randn(1, 1, 32, 16, generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[0, 0, 5, 2] = 100.0  # one outlier: token 5, channel 2
    _, ks_x, _ = quantize_keys(x, 8, 8)
    _, ks_y, _ = quantize_keys(y, 8, 8)
    changed = (ks_x != ks_y).nonzero().tolist()
    assert changed == [[0, 0, 0, 2]]  # only channel 2 of the first 8-token group
    _, vs_x, _ = quantize_values(x, 8, 8)
    _, vs_y, _ = quantize_values(y, 8, 8)
    assert (vs_x != vs_y).nonzero().tolist() == [[0, 0, 5, 0]]  # only token 5's first 8 channels


def test_per_channel_keys_beat_per_token_keys_when_channels_have_outliers():
    x = _keys_with_outlier_channels()
    per_channel = (fake_quantize(x, 4, 32, per="channel") - x).pow(2).mean()
    per_token = (fake_quantize(x, 4, 32, per="token") - x).pow(2).mean()
    assert per_channel * 10 < per_token


def test_int4_codes_pack_two_to_a_byte():
    codes = torch.randint(0, 16, (3, 10), dtype=torch.uint8)
    packed = pack4(codes)
    assert packed.shape == (3, 5) and torch.equal(unpack4(packed), codes)
    assert kv_bits_per_value(4, 64) == 4.5
    with pytest.raises(ValueError, match="bits must be one of"):
        kv_bits_per_value(2, 32)


@torch.inference_mode()
@pytest.mark.parametrize("bits", [4, 8])
def test_residual_windows_are_bit_exact_and_the_rest_within_the_bound(bits):
    model = tiny(d_model=96, n_heads=6, n_kv_heads=2)  # head_dim 16
    x = ids(45)
    reference = model.new_cache("contiguous", max_len=48)
    cache = model.new_cache("quantized", max_len=48, bits=bits, group_size=8, residual=16)
    run_pieces(model, x, reference, [20] + [1] * 25)
    run_pieces(model, x, cache, [20] + [1] * 25)
    n = cache.counts
    assert n == {"qk": 32, "kt": 13, "qv": 29, "vt": 16}
    # layer 0's keys and values depend only on the tokens, so both caches were handed the same ones
    keys, values = cache.layer_kv(0)
    true_k, true_v = reference.keys[0, :, :, :45], reference.values[0, :, :, :45]
    assert torch.equal(keys[:, :, 32:], true_k[:, :, 32:]) and torch.equal(values[:, :, 29:], true_v[:, :, 29:])
    step_k = cache.k_scale[0, :, :, :4].float().repeat_interleave(8, dim=-2)  # [B, H, 32, D]
    assert ((keys[:, :, :32] - true_k[:, :, :32]).abs() <= step_k / 2 * (1 + 1e-3)).all()
    step_v = cache.v_scale[0, :, :, :29].float().repeat_interleave(8, dim=-1)  # [B, H, 29, D]
    assert ((values[:, :, :29] - true_v[:, :, :29]).abs() <= step_v / 2 * (1 + 1e-3)).all()
    assert (keys[:, :, :32] != true_k[:, :, :32]).any() and (values[:, :, :29] != true_v[:, :, :29]).any()


@torch.inference_mode()
def test_logits_stay_close_to_the_float_cache_and_int8_is_closer_than_int4():
    model = tiny()
    x = ids(60, seed=9)
    reference = run_pieces(model, x, model.new_cache("contiguous", max_len=64), [24] + [1] * 36)
    errors = {}
    for bits in (8, 4):
        cache = model.new_cache("quantized", max_len=64, bits=bits, group_size=8, residual=8)
        got = run_pieces(model, x, cache, [24] + [1] * 36)
        assert torch.equal(got[:, :24], reference[:, :24])  # a pass attends to its own tokens at full precision
        errors[bits] = (got - reference).abs().max().item()
    assert 0 < errors[8] < 0.02 and errors[8] * 5 < errors[4] < 0.5
