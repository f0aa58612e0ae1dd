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
