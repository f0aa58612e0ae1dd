"""Microscaling formats (labkit.quant.mx): MXFP4 byte-exact against `gguf`, NVFP4 decoded as `gguf` decodes it,
MXFP8 against torch.float8_e4m3fn, the element codecs, the storage cost, and clear errors."""
import ast
import math
import warnings

import numpy as np
import pytest
import torch

from labkit.quant import ggml, mx

F32 = np.float32
GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _gguf():
    gguf = pytest.importorskip("gguf")
    return gguf.quants, gguf.GGMLQuantizationType


def _gq(x, qtype):
    gq, T = _gguf()
    with warnings.catch_warnings():  # gguf overflows / wraps on the adversarial blocks
        warnings.simplefilter("ignore")
        return gq.quantize(x, T[qtype])


def _gdq(b, qtype):
    gq, T = _gguf()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gq.dequantize(b, T[qtype])


def _same(a, b):
    return a.shape == b.shape and np.array_equal(np.asarray(a, F32).view(np.uint32), np.asarray(b, F32).view(np.uint32))


def _nearest_e2m1(v: float) -> float:
    """Scalar reference: nearest of ±GRID, a tie going to the smaller magnitude (and 0 to +0, as ggml writes)."""
    cands = [math.copysign(g, v) if g else 0.0 for g in GRID]
    return min(cands, key=lambda g: (abs(g - v), abs(g)))


def _spec_mxfp4(block: np.ndarray) -> tuple[int, np.ndarray]:
    """OCP MX v1.0 by hand: e = floor(log2 amax) − 2 exactly, clamped to −127; x / 2^e to the nearest E2M1."""
    amax = float(np.abs(block).max())
    e = -127 if amax == 0 else max(math.frexp(amax)[1] - 1 - 2, -127)
    vals = [_nearest_e2m1(math.ldexp(float(x), -e)) * 2.0**e for x in block]
    return e + 127, np.array(vals, dtype=F32)


def _random(scale: float, seed: int, shape=(16, 256)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * rng.uniform(0.1, 10, size=(shape[0], 1))
    return (x * scale).astype(F32)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_mxfp4_is_byte_identical_to_gguf_on_random_data(scale):
    x = _random(scale, seed=int(scale * 1000) % 97)
    ours, ref = mx.quantize_blocks(x, "MXFP4")[0], _gq(x, "MXFP4")
    assert ours.shape == ref.shape == (16, 256 // 32 * 17) and ours.tobytes() == ref.tobytes()
    assert _same(mx.dequantize_blocks(ours, "MXFP4"), _gdq(ref, "MXFP4"))
    assert ggml.quantize(x, "MXFP4").tobytes() == ref.tobytes()
    assert _same(ggml.dequantize(ref, "MXFP4", x.shape), _gdq(ref, "MXFP4"))


def _tie_block(k: int) -> np.ndarray:
    # amax 6·2^k so e = k: every midpoint of the E2M1 grid, both signs, plus -0.0 and tiny negatives
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]
    return (np.array(mids + [-m for m in mids] + [-0.0, -0.1, 0.1, -0.25] + [0.0] * 12) * 2.0**k).astype(F32)


def test_mxfp4_adversarial_blocks_where_gguf_follows_the_spec():
    x = np.stack([np.zeros(32, F32), _tie_block(0), _tie_block(-20), _tie_block(30), -_tie_block(3),
                  np.full(32, 2.0**-125, F32), np.full(32, 6.0 * 2.0**-127, F32)])
    ours = mx.quantize_blocks(x, "MXFP4")[0]
    assert ours.tobytes() == _gq(x, "MXFP4").tobytes()
    assert _same(mx.dequantize_blocks(ours, "MXFP4"), _gdq(ours, "MXFP4"))
    assert ours[0].tolist() == [0] * 17  # all zeros: scale byte 0 (2^-127), codes 0
    # ties go to the smaller magnitude: 0.25 -> 0, 0.75 -> 0.5, ..., 5 -> 4, and never to -0
    assert mx.dequantize_blocks(ours[1], "MXFP4")[:20].tolist() == [0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2,
                                                                    -3, -4, -6, 0, 0, 0, 0]
    for row, block in zip(ours, x):
        byte, vals = _spec_mxfp4(block)
        assert row[0] == byte and _same(mx.dequantize_blocks(row, "MXFP4"), vals)


def test_mxfp4_where_gguf_departs_from_the_spec():
    big, near = np.finfo(F32).max, np.nextafter(F32(1024), F32(0))
    rng = np.random.default_rng(3)
    x = np.stack([np.array([big, -big, big / 3, -big / 7] + [0] * 28, F32),
                  (-np.abs(rng.standard_normal(32)) * 1e37).astype(F32),
                  (rng.uniform(-1, 1, 32) * 2.0**-126).astype(F32),  # float32 subnormals
                  np.array([2.0**-126] + [1e-45] * 31, F32),
                  np.array([near] + list(rng.uniform(-1000, 1000, 31)), F32)])
    x[1, 5] = -big
    ours, ref = mx.quantize_blocks(x, "MXFP4")[0], _gq(x, "MXFP4")
    # gguf: float32 log2 rounds the largest float32 and 1023.99994 up (one exponent too many);
    # its exponent wraps around as uint8 for the subnormal blocks (0xFF, the NaN byte, for 2^-126)
    assert ours[:, 0].tolist() == [252, 252, 0, 0, 134] and ref[:, 0].tolist() == [253, 253, 254, 255, 135]
    deq = mx.dequantize_blocks(ours, "MXFP4")
    for row, block, got in zip(ours, x, deq):
        byte, vals = _spec_mxfp4(block)
        assert row[0] == byte and _same(got, vals)
    assert np.isfinite(deq).all()
    assert _same(_gdq(ours, "MXFP4"), deq)  # gguf reads labkit's bytes the same way
    assert _same(deq[0], _gdq(ref, "MXFP4")[0])  # largest float32: other bytes, the same values
    assert deq[3, 0] == F32(2.0**-126) and _gdq(ref, "MXFP4")[3, 0] == 0  # gguf loses the block


def test_mxfp4_decodes_every_scale_and_code_as_gguf_does():
    scales = np.arange(255, dtype=np.uint8)  # 0xFF is NaN here and 2^127 in gguf; never written
    codes = np.tile(np.arange(16, dtype=np.uint8), 2)
    qs = codes[:16] | (codes[16:] << 4)
    blocks = np.concatenate([scales[:, None], np.tile(qs, (255, 1))], axis=1)
    with np.errstate(over="ignore"):
        assert _same(mx.dequantize_blocks(blocks, "MXFP4"), _gdq(blocks, "MXFP4"))
    assert np.isnan(mx.dequantize_blocks(np.r_[np.uint8(255), qs], "MXFP4")).all()


def test_nvfp4_dequantization_equals_gguf():
    x = _random(1.0, seed=5, shape=(8, 256))
    x[0, :64] = 0
    x[1, :16] = 1e-30  # a tiny block: its scale byte is the smallest subnormal, not 0
    data, s_t = mx.quantize_blocks(x, "NVFP4")
    assert data.shape == (8, 256 // 64 * 36)
    assert _same(mx.dequantize_blocks(data, "NVFP4"), _gdq(data, "NVFP4"))
    rng = np.random.default_rng(6)
    rand = rng.integers(0, 256, size=(50, 36), dtype=np.uint8)
    rand[:, :4] = rng.integers(0, 0x7F, size=(50, 4))  # valid UE4M3 scale bytes: sign clear, not NaN (0x7F)
    assert _same(mx.dequantize_blocks(rand, "NVFP4"), _gdq(rand, "NVFP4"))
    # via ggml: tensor scale 1.0, same bytes as mx with tensor_scale=1.0
    one = mx.quantize_blocks(x, "NVFP4", tensor_scale=1.0)
    assert one[1] == 1.0 and ggml.quantize(x, "NVFP4").tobytes() == one[0].tobytes()
    assert _same(ggml.dequantize(one[0], "NVFP4", x.shape), _gdq(one[0], "NVFP4").reshape(x.shape))


def test_nvfp4_two_level_scales_and_nearest_elements():
    x = _random(0.02, seed=7, shape=(4, 128))
    x[2, 16:32] = 0
    x[3, :16] = 1e-9  # far below the rest: block scale rounds to 0 -> smallest subnormal
    data, s_t = mx.quantize_blocks(x, "NVFP4")
    amax = float(np.abs(x).max())
    assert s_t <= amax / 2688 and F32(s_t) == s_t and np.nextafter(F32(s_t), F32(1)) > amax / 2688
    d = mx.e4m3_decode(data.reshape(-1, 36)[:, :4]).astype(np.float64).reshape(-1)
    sub = x.reshape(-1, 16).astype(np.float64)
    want = np.abs(sub).max(axis=1) / 6 / s_t
    expect = torch.tensor(np.minimum(want, 448)).to(torch.float8_e4m3fn).double().numpy()
    expect = np.where((expect == 0) & (want > 0), 2.0**-9, expect)
    assert np.array_equal(d, expect) and d.max() <= 448 and d[17] == 0 and d[24] == 2.0**-9  # 8 blocks a row
    deq = mx.dequantize_blocks(data, "NVFP4", s_t).reshape(-1, 16)
    for i in range(0, sub.shape[0], 3):
        step = d[i] * s_t
        for xv, got in zip(sub[i], deq[i]):
            assert got == F32(F32(_nearest_e2m1(xv / step) * d[i]) * F32(s_t))
    t = mx.quantize(x, "NVFP4")
    assert t.tensor_scale == s_t and _same(t.dequantize().numpy(), deq.reshape(x.shape))


@pytest.mark.parametrize("amax", [1.0, 3.0, float(np.finfo(F32).max)])
def test_nvfp4_tensor_scale_rounds_down_so_nothing_overshoots(amax):
    # float32(amax / 2688) rounds up for 1.0 and 3.0: then 6·448·s_t would exceed amax (inf for the largest float)
    x = np.zeros((2, 64), F32)
    x[0, :2], x[1, 5] = [amax, -amax], amax / 3
    data, s_t = mx.quantize_blocks(x, "NVFP4")
    assert s_t <= amax / 2688
    deq = mx.dequantize_blocks(data, "NVFP4", s_t)
    assert np.isfinite(deq).all() and np.abs(deq).max() <= amax and deq[0, 0] >= F32(amax) * (1 - 2.0**-20)


def test_nvfp4_invalid_scale_bytes():
    block = np.zeros(36, np.uint8)
    block[4:] = 0x22  # codes 2 (value 1) everywhere
    block[0] = 0x7F  # E4M3 NaN: NaN here, gguf reads 0
    assert np.isnan(mx.dequantize_blocks(block, "NVFP4")[:16]).all()
    block[0] = 0x80 | 0x38  # sign bit on an unsigned scale
    with pytest.raises(ValueError, match="sign bit"):
        mx.dequantize_blocks(block, "NVFP4")


def test_mxfp8_matches_torch_float8_and_error_bound():
    x = np.concatenate([_random(s, seed=i, shape=(4, 128)) for i, s in enumerate([1e-3, 1.0, 1e3])])
    x[0, :32] = 0
    x[1, :32] = np.linspace(-1e-40, 1e-40, 32)  # subnormal block: exponent clamped to -127
    data = mx.quantize_blocks(x, "MXFP8")[0]
    assert data.shape == (12, 128 // 32 * 33)
    blocks = x.reshape(-1, 32).astype(np.float64)
    amax = np.abs(blocks).max(axis=1)
    e = np.array([-127 if a == 0 else max(math.frexp(a)[1] - 1 - 8, -127) for a in amax])
    assert data.reshape(-1, 33)[:, 0].tolist() == (e + 127).tolist()
    scaled = blocks / 2.0**e[:, None]
    v = np.clip(scaled, -448, 448)  # amax / 2^e can reach 512: the spec's exponent clips [448, 512) to 448
    ref = torch.tensor(v.astype(F32)).to(torch.float8_e4m3fn).double().numpy() * 2.0**e[:, None]
    deq = mx.dequantize_blocks(data, "MXFP8").reshape(-1, 32)
    assert _same(deq, ref.astype(F32))
    normal = (np.abs(scaled) >= 2.0**-6) & (np.abs(scaled) <= 448)
    assert normal.mean() > 0.9
    assert (np.abs(deq - blocks)[normal] <= 2.0**-4 * np.abs(blocks)[normal]).all()
    codes = data.reshape(-1, 33)[:, 1:]
    assert not ((codes & 0x7F) == 0x7F).any()  # never the NaN byte


def test_element_codecs():
    codes = np.arange(16, dtype=np.uint8)
    vals = mx.e2m1_decode(codes)
    assert vals[:8].tolist() == GRID and vals[8:].tolist() == [-g for g in GRID] and not np.signbit(vals[8])
    assert mx.e2m1_encode(vals).tolist() == [*range(8), 0, *range(9, 16)]  # -0 comes back as +0
    assert mx.e2m1_encode(np.array([7.0, -100.0, 1e-30])).tolist() == [7, 15, 0]  # saturates
    b = np.arange(256, dtype=np.uint8)
    ref = torch.from_numpy(b.copy()).view(torch.float8_e4m3fn).float().numpy()
    assert np.array_equal(mx.e4m3_decode(b), ref, equal_nan=True) and mx.E4M3_VALUES[0x7E] == 448
    finite = b[(b & 0x7F) != 0x7F]
    assert mx.e4m3_encode(mx.e4m3_decode(finite)).tolist() == finite.tolist()
    # ties to even, midpoints of every neighbouring pair, and saturation, as torch converts
    pos = np.sort(mx.E4M3_VALUES[:0x7F].astype(np.float64))
    probe = np.concatenate([(pos[1:] + pos[:-1]) / 2, pos * 1.01, [500.0, 448.5, 1e-30]])
    probe = np.concatenate([probe, -probe]).astype(F32)
    got = mx.e4m3_decode(mx.e4m3_encode(probe))
    assert np.array_equal(got, torch.tensor(probe).to(torch.float8_e4m3fn).float().numpy())
    assert mx.e8m0_decode(mx.e8m0_encode(np.array([-200, -127, 0, 127, 300]))).tolist() == \
        [2.0**-127, 2.0**-127, 1.0, 2.0**127, 2.0**127]
    assert np.isnan(mx.e8m0_decode(np.uint8(255)))
    with pytest.raises(ValueError, match="UE4M3"):
        mx.e4m3_encode(np.array([-1.0]), unsigned=True)


@pytest.mark.parametrize("fmt,bits", [("MXFP4", 4.25), ("MXFP8", 8.25), ("NVFP4", 4.5)])
def test_bits_per_weight_from_the_bytes(fmt, bits):
    x = torch.randn(6, 192)
    t = mx.quantize(x, fmt)
    n = x.numel()
    tensor_bytes = 4 if fmt == "NVFP4" else 0
    assert t.data.dtype == np.uint8 and t.data.shape[0] == 6 and t.shape == (6, 192)
    assert t.nbytes() == t.data.nbytes + tensor_bytes == mx.nbytes(fmt, n)
    assert mx.bits_per_weight(fmt) == bits == 8 * t.data.nbytes / n
    assert mx.bits_per_weight(fmt, n) == 8 * t.nbytes() / n == bits + 8 * tensor_bytes / n
    out = mx.dequantize(t)
    assert out.dtype == torch.float32 and out.shape == x.shape and torch.equal(out, t.dequantize())
    assert t.data.tobytes() == mx.quantize(x.numpy(), fmt).data.tobytes()  # torch or numpy, same bytes
    if fmt != "MXFP8":
        assert ggml.bits_per_weight(fmt) == bits and ggml.nbytes(fmt, n) == t.data.nbytes
        assert ggml.TYPES[fmt] == {"MXFP4": (39, 32, 17), "NVFP4": (40, 64, 36)}[fmt]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_refused(bad):
    x = np.ones((2, 64), F32)
    x[1, 7] = bad
    for fmt in mx.FORMATS:
        with pytest.raises(ValueError, match="x contains NaN or inf"):
            mx.quantize(x, fmt)
    for qtype in ("Q8_0", "Q4_0", "Q4_1", "MXFP4", "NVFP4"):
        with pytest.raises(ValueError, match="x contains NaN or inf"):
            ggml.quantize(x, qtype)


def test_clear_errors():
    with pytest.raises(ValueError, match="MXFP4.*MXFP8.*NVFP4"):
        mx.quantize(torch.randn(2, 32), "FP4")
    with pytest.raises(TypeError, match="x must be"):
        mx.quantize(torch.ones(2, 32, dtype=torch.long), "MXFP4")
    with pytest.raises(TypeError, match="x must be"):
        mx.quantize(np.ones((2, 32), np.int32), "MXFP8")
    with pytest.raises(ValueError, match="multiple of 32"):
        mx.quantize(torch.randn(2, 48), "MXFP4")
    with pytest.raises(ValueError, match="multiple of 64"):
        mx.quantize(torch.randn(2, 32), "NVFP4")
    for bad in (-32, 32.0, "64", True):
        with pytest.raises(ValueError, match="n_weights"):
            ggml.nbytes("Q8_0", bad)
        with pytest.raises(ValueError, match="n_weights"):
            mx.nbytes("MXFP4", bad)
    assert ggml.nbytes("Q8_0", np.int64(64)) == 68 and ggml.nbytes("NVFP4", 0) == 0
    with pytest.raises(ValueError, match="blocks of 64"):
        ggml.nbytes("NVFP4", 32)


def test_mx_does_not_import_labkit():
    import labkit.quant.mx as mod

    tree = ast.parse(open(mod.__file__).read())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.startswith("labkit")]


def test_docstring_examples_hold():
    import doctest

    result = doctest.testmod(mx, extraglobs={"np": np})
    assert result.attempted > 0 and result.failed == 0
