"""The power exercise checkers accept the reference formulas and catch the usual mistakes."""
import math

import pytest

from labkit import exercises
from tests.conftest import assert_checker_separates


@pytest.mark.parametrize("name, right, wrong", [
    ("check_dynamic_power", lambda c, f, v: c * f * v * v * 1e-6, lambda c, f, v: c * f * v * 1e-6),
    ("check_onchip_share", lambda s, k, c: 1.0 if k * c == 0 else min(1.0, s / (k * c)), lambda s, k, c: s / (k * c + 1)),
    ("check_breakeven_tokens",
     lambda e, th, ph, tl, pl: e / (th * ph - tl * pl) if th * ph > tl * pl else math.inf,
     lambda e, th, ph, tl, pl: e / (ph - pl)),
])
def test_checker_passes_the_right_formula_and_fails_a_wrong_one(name, right, wrong, capsys):
    assert_checker_separates(name, right, wrong, capsys)


def test_quantization_checkers_pass_the_reference_and_catch_the_usual_mistakes(capsys):
    import torch

    from labkit.quant import ggml

    def absmax(x):
        scale = x.abs().max() / 127
        return torch.round(x / scale).to(torch.int8), scale

    def truncating(x):  # casts without rounding: the classic bug
        scale = x.abs().max() / 127
        return (x / scale).to(torch.int8), scale

    assert exercises.check_absmax_int8(absmax) and not exercises.check_absmax_int8(truncating)
    right = lambda block, bits, n: block * bits / 8 + 2 * n  # noqa: E731
    assert exercises.check_block_bytes(right) and not exercises.check_block_bytes(lambda block, bits, n: block * bits / 8)
    for qtype, (block, bits, n) in {"Q8_0": (32, 8, 1), "Q4_0": (32, 4, 1), "Q4_1": (32, 4, 2)}.items():
        assert right(block, bits, n) == ggml.nbytes(qtype, 32)  # the checker's formula is the file format's
    out = capsys.readouterr().out
    assert out.count("[PASS]") == 2 and out.count("[FAIL]") == 2
