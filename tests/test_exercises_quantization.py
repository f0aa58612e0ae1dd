"""The chapter 06 exercise checkers pass the reference solutions and fail the plausible wrong ones."""
import pytest
import torch

from labkit import exercises
from tests.conftest import assert_checker_separates


def q4_1_roundtrip(x):
    if x.numel() % 32:
        raise ValueError(f"x must hold whole blocks of 32, got {x.numel()} values")
    b = x.reshape(-1, 32).float()
    lo, hi = b.amin(1), b.amax(1)
    d = (hi - lo) / 15
    safe = torch.where(d > 0, d, torch.ones_like(d))
    return torch.round((b - lo[:, None]) / safe[:, None]).clamp(0, 15).to(torch.uint8), d, lo


def truncating(x):  # floor instead of round: off by up to a whole step
    codes, d, lo = q4_1_roundtrip(x)
    b = x.reshape(-1, 32)
    safe = torch.where(d > 0, d, torch.ones_like(d))
    return ((b - lo[:, None]) / safe[:, None]).clamp(0, 15).to(torch.uint8), d, lo


def one_scale(x):  # one d and m for the whole tensor, repeated per block: an outlier reaches every block
    if x.numel() % 32:
        raise ValueError("whole blocks")
    lo, hi = x.min(), x.max()
    d = (hi - lo) / 15 if hi > lo else torch.tensor(1.0)
    codes = torch.round((x - lo) / d).clamp(0, 15).to(torch.uint8).reshape(-1, 32)
    n = codes.shape[0]
    return codes, d.expand(n).clone(), lo.expand(n).clone()


def zero_offset(x):  # the block's step, but codes centred on zero instead of starting at the block's minimum
    if x.numel() % 32:
        raise ValueError("whole blocks")
    b = x.reshape(-1, 32)
    d = (b.amax(1) - b.amin(1)) / 15
    safe = torch.where(d > 0, d, torch.ones_like(d))
    return (torch.round(b / safe[:, None]) + 8).clamp(0, 15).to(torch.uint8), d, -8 * d


def symmetric(x):  # Q4_0-like: step max|x| / 7 around zero, wasting codes on a block far from zero
    if x.numel() % 32:
        raise ValueError("whole blocks")
    b = x.reshape(-1, 32)
    s = b.abs().amax(1) / 7
    safe = torch.where(s > 0, s, torch.ones_like(s))
    return (torch.round(b / safe[:, None]) + 8).clamp(0, 15).to(torch.uint8), s, -8 * s


def sixteen_steps(x):  # d = range / 16: the largest value needs code 16 and is clamped to 15
    codes, d, lo = q4_1_roundtrip(x)
    b = x.reshape(-1, 32)
    d = d * 15 / 16
    safe = torch.where(d > 0, d, torch.ones_like(d))
    return torch.round((b - lo[:, None]) / safe[:, None]).clamp(0, 15).to(torch.uint8), d, lo


def no_length_check(x):
    codes, d, lo = q4_1_roundtrip(x[: x.numel() // 32 * 32])
    return codes, d, lo


def stub(x):
    raise NotImplementedError


def test_q4_1_roundtrip_passes_the_reference(capsys):
    assert exercises.check_q4_1_roundtrip(q4_1_roundtrip)
    assert "[PASS]" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", [truncating, one_scale, zero_offset, symmetric, sixteen_steps, no_length_check])
def test_q4_1_roundtrip_fails_plausible_mistakes(wrong, capsys):
    assert not exercises.check_q4_1_roundtrip(wrong)
    assert "[FAIL]" in capsys.readouterr().out


def test_q4_1_roundtrip_reports_a_stub(capsys):
    assert not exercises.check_q4_1_roundtrip(stub)
    assert "[TODO]" in capsys.readouterr().out


def step_bytes(kind, out_features, in_features):
    n = out_features * in_features
    if kind == "int8 packed":  # int8 codes, one bfloat16 scale per row
        return n + 2 * out_features
    if kind in ("int4 g64 packed", "int4 g128 packed"):  # two codes a byte, a bfloat16 scale and zero per group
        group = int(kind.split()[1][1:])
        return n // 2 + n // group * 2 * 2
    if kind == "int3 per-channel":  # int8 codes, float32 scale and minimum per row, and the float32 matrix built
        return n + 2 * 4 * out_features + 4 * n
    if kind == "NVFP4":  # the product multiplies the float32 copy
        return 4 * n
    if kind == "Q8_0 W8A8":  # int8 codes, a float32 d per block
        return n + 4 * (n // 32)
    if kind == "Q4_1 W4A8":  # codes kept one per int8 byte, float32 d and m per block
        return n + 8 * (n // 32)
    raise ValueError(kind)


def storage_only(kind, out_features, in_features):  # the format's bits, as the chapter's tables print them
    from labkit.exercises.quantization import _layer

    return _layer(kind, out_features, in_features).nbytes()


def nibbles_for_q4_1(kind, out_features, in_features):  # W4A8 codes counted at 4 bits
    n = out_features * in_features
    return n // 2 + 8 * (n // 32) if kind == "Q4_1 W4A8" else step_bytes(kind, out_features, in_features)


def no_float_copy(kind, out_features, in_features):  # the reference path's float32 matrix forgotten
    n = out_features * in_features
    return n + 8 * out_features if kind == "int3 per-channel" else step_bytes(kind, out_features, in_features)


def test_step_bytes_passes_the_reference(capsys):
    assert exercises.check_step_bytes(step_bytes)
    assert "[PASS]" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", [storage_only, nibbles_for_q4_1, no_float_copy])
def test_step_bytes_fails_plausible_mistakes(wrong, capsys):
    assert not exercises.check_step_bytes(wrong)
    assert "[FAIL]" in capsys.readouterr().out


def test_step_bytes_reports_a_stub(capsys):
    assert not exercises.check_step_bytes(lambda kind, o, i: stub(None))
    assert "[TODO]" in capsys.readouterr().out


def ggml_convention(x):  # llama.cpp's reference: 1/d multiplied, floor(v + 0.5), d = 0 for a constant block, int64 codes
    if x.numel() % 32:
        raise ValueError("whole blocks")
    b = x.reshape(-1, 32).float()
    lo, hi = b.amin(1), b.amax(1)
    d = (hi - lo) / 15
    inv = torch.where(d > 0, 1 / torch.where(d > 0, d, torch.ones_like(d)), torch.zeros_like(d))
    codes = torch.floor((b - lo[:, None]) * inv[:, None] + 0.5).clamp(max=15).to(torch.int64)
    return codes, d, lo


def anchored_at_max(x):  # the same grid described from the top: m = max - 15 d, codes counted from there
    if x.numel() % 32:
        raise ValueError("whole blocks")
    b = x.reshape(-1, 32).float()
    lo, hi = b.amin(1), b.amax(1)
    d = (hi - lo) / 15
    m = hi - 15 * d
    safe = torch.where(d > 0, d, torch.ones_like(d))
    return torch.round((b - m[:, None]) / safe[:, None]).clamp(0, 15).to(torch.int32), d[:, None], m[:, None]


@pytest.mark.parametrize("other", [ggml_convention, anchored_at_max])
def test_q4_1_roundtrip_accepts_other_valid_conventions(other, capsys):
    assert exercises.check_q4_1_roundtrip(other)
    assert "[PASS]" in capsys.readouterr().out


def float_scales_for_int4(kind, out_features, in_features):  # the packed int4 layer's scales taken as float32
    n = out_features * in_features
    if kind in ("int4 g64 packed", "int4 g128 packed"):
        return n // 2 + n // int(kind.split()[1][1:]) * 2 * 4
    return step_bytes(kind, out_features, in_features)


def stored_plus_copy_for_nvfp4(kind, out_features, in_features):  # the codes counted on top of the float32 copy
    n = out_features * in_features
    return n * 9 // 16 + 4 * n if kind == "NVFP4" else step_bytes(kind, out_features, in_features)


@pytest.mark.parametrize("wrong", [float_scales_for_int4, stored_plus_copy_for_nvfp4])
def test_step_bytes_fails_more_mistakes(wrong, capsys):
    assert not exercises.check_step_bytes(wrong)
    assert "[FAIL]" in capsys.readouterr().out


def _rows(w, bits, *, qmax=None, absolute=True, rounded=True, guard=True):
    q = qmax or 2 ** (bits - 1) - 1
    scale = (w.abs() if absolute else w).amax(1, keepdim=True) / q
    if guard:
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    x = w / scale
    return (x.round() if rounded else x).clamp(-q, q).to(torch.int8), scale


@pytest.mark.parametrize("wrong", [
    lambda w, b: _rows(w, b, qmax=2 ** b - 1),      # the unsigned count of codes: wraps, half the range
    lambda w, b: _rows(w, b, absolute=False),        # the row's largest value, not its largest magnitude
    lambda w, b: _rows(w, b, rounded=False),         # truncated toward zero
    lambda w, b: _rows(w, b, guard=False),           # 0 / 0 on an all-zero row
])
def test_the_quantize_rows_checker_separates(wrong, capsys):
    assert_checker_separates("check_quantize_rows", _rows, wrong, capsys)
