"""The checkers of the formats deep dive (06a) pass the answer derived from the statement and fail the plausible
wrong ones (ties rounded to even, no saturation, the super-block's float16 numbers left out, an int16 sum)."""
import pytest
import torch

from tests.conftest import assert_checker_separates

GRID = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])


def _e2m1(v, *, ties_up=False, saturate=True):
    mid = (GRID[1:] + GRID[:-1]) / 2
    idx = torch.searchsorted(mid, v.abs(), right=ties_up)
    if not saturate:
        return torch.where(v.abs() > 6, v, torch.sign(v) * GRID[idx])
    return torch.sign(v) * GRID[idx]


@pytest.mark.parametrize("wrong", [lambda v: _e2m1(v, ties_up=True), lambda v: _e2m1(v, saturate=False),
                                   lambda v: (v * 2).round() / 2])  # an even grid of halves
def test_the_e2m1_checker_separates(wrong, capsys):
    assert_checker_separates("check_e2m1_round", _e2m1, wrong, capsys)


def _kbits(code_bits, sub_block, scale_bits, has_min, *, supers=True, min_scale=True):
    n = 2 if has_min else 1
    return code_bits + scale_bits * (n if min_scale else 1) / sub_block + (16 * n / 256 if supers else 0)


@pytest.mark.parametrize("wrong", [lambda *a: _kbits(*a, supers=False), lambda *a: _kbits(*a, min_scale=False),
                                   lambda c, s, b, m: c + b / s + 16 / 256])  # one float16 whatever the format
def test_the_kquant_bits_checker_separates(wrong, capsys):
    assert_checker_separates("check_kquant_bits", _kbits, wrong, capsys)


def test_the_kquant_reference_matches_ggml_sizes():
    from labkit.exercises.formats import _reference_kquant_bits
    from labkit.quant import ggml

    # bytes per super-block from ggml's own table, not from the formula
    for name, layout in {"Q4_K": (4, 32, 6, True), "Q5_K": (5, 32, 6, True), "Q6_K": (6, 16, 8, False)}.items():
        per_block, size = ggml.TYPES[name][1:]
        assert _reference_kquant_bits(*layout) == pytest.approx(8 * size / per_block)


def _dot(qw, dw, mw, qa, da, *, narrow=False, per_weight_min=False):
    if narrow:  # the products summed in int16: wraps on a block of 15s and 127s
        isum = int((qw.to(torch.int16) * qa.to(torch.int16)).sum(dtype=torch.int16))
    else:
        isum = int((qw.long() * qa.long()).sum())
    sq = int(qa.long().sum())
    return isum, dw * da * isum + mw * da * (sq * 32 if per_weight_min else sq)


@pytest.mark.parametrize("wrong", [lambda *a: _dot(*a, narrow=True), lambda *a: _dot(*a, per_weight_min=True),
                                   lambda qw, dw, mw, qa, da: (float((qw.long() * qa.long()).sum()), 0.0)])
def test_the_block_dot_checker_separates(wrong, capsys):
    assert_checker_separates("check_block_dot", _dot, wrong, capsys)
