"""Round-to-nearest quantization: within half a step everywhere, the same as GGUF's Q4_1, clear errors."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.quant import bits_per_weight, dequantize, ggml, quantize


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([2, 3, 4, 8]), group=st.sampled_from([4, 8, "channel", "tensor"]),
       symmetric=st.booleans(), seed=st.integers(0, 10_000), spread=st.floats(1e-3, 1e3))
def test_round_trip_is_within_half_a_step(bits, group, symmetric, seed, spread):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(5, 16, generator=g) * spread
    w[0, 3] = 40 * spread  # an outlier
    qt = quantize(w, bits=bits, group_size=group, symmetric=symmetric)
    err = (dequantize(qt) - w).abs()
    assert bool((err <= qt.step() / 2 * (1 + 1e-5) + 1e-12).all())
    lo, hi = (-(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1) if symmetric else (0, 2 ** bits - 1)
    assert int(qt.codes.min()) >= lo and int(qt.codes.max()) <= hi


def test_scales_follow_the_granularity():
    w = torch.arange(32, dtype=torch.float32).reshape(2, 16) - 8
    assert quantize(w, 8, "tensor").scale.shape == (1, 1)
    assert quantize(w, 8, "channel").scale.shape == (2, 1)
    assert quantize(w, 8, 4).scale.shape == (2, 4)
    qt = quantize(w, 8, "tensor")
    assert float(qt.scale) == pytest.approx(23 / 127)  # max |w| of the whole matrix
    # groups help with an outlier: only its own group pays for it
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    w[0, 0] = 50.0
    err = {g: float((dequantize(quantize(w, 4, g)) - w).pow(2).mean()) for g in ("tensor", "channel", 16)}
    assert err[16] < err["channel"] < err["tensor"]


def test_asymmetric_group_32_is_q4_1():
    """Q4_1 is asymmetric RTN in groups of 32 whose d and m are then stored in float16 (ggml's reference)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 64)).astype(np.float32)
    q41 = ggml.dequantize(ggml.quantize(w, "Q4_1"), "Q4_1", w.shape)
    qt = quantize(torch.from_numpy(w), bits=4, group_size=32, symmetric=False)
    qt.scale, qt.minimum = qt.scale.half().float(), qt.minimum.half().float()  # what the file keeps
    assert np.allclose(dequantize(qt).numpy(), q41, atol=1e-6)
    assert bits_per_weight(4, 32, symmetric=False) == ggml.bits_per_weight("Q4_1") == 5.0
    assert bits_per_weight(8, 32) == ggml.bits_per_weight("Q8_0") == 8.5


def test_constant_and_zero_groups_are_exact():
    w = torch.tensor([[0.0, 0.0, 0.0, 0.0], [2.5, 2.5, 2.5, 2.5]])
    for symmetric in (True, False):
        assert torch.equal(dequantize(quantize(w, 4, "channel", symmetric)), w)


def test_bad_input_says_what_is_allowed():
    w = torch.randn(4, 576)
    with pytest.raises(ValueError, match=r"bits must be one of \(2, 3, 4, 5, 6, 7, 8\), got 1"):
        quantize(w, bits=1)
    with pytest.raises(ValueError, match=r"group_size=128 does not divide the 576 input features; ones that do: \[16, 32, 64\]"):
        quantize(w, 4, 128)
    with pytest.raises(ValueError, match="group_size must be a positive integer, 'channel' or 'tensor', got 'row'"):
        quantize(w, 4, "row")
    bad = w.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        quantize(bad)
    with pytest.raises(TypeError, match="floating-point"):
        quantize(torch.ones(2, 2, dtype=torch.long))


def test_docstring_examples_hold():
    import doctest

    import labkit.quant.rtn as rtn

    result = doctest.testmod(rtn, extraglobs={"torch": torch})
    assert result.attempted > 0 and result.failed == 0
