"""The serving exercise checkers accept the reference formulas and catch the usual mistakes."""
import math

import pytest

from tests.conftest import assert_checker_separates


def _critical_batch(F, BW, W, N, kv):
    d = 2 * N * BW / F - kv
    return W / d if d > 0 else math.inf


@pytest.mark.parametrize("name, right, wrong", [
    ("check_kv_blocks", lambda ls, bs: sum(math.ceil(n / bs) for n in ls), lambda ls, bs: sum(n // bs for n in ls)),
    ("check_kv_blocks", lambda ls, bs: sum(-(-n // bs) for n in ls), lambda ls, bs: math.ceil(sum(ls) / bs)),  # pooled
    ("check_critical_batch", _critical_batch, lambda F, BW, W, N, kv: W * F / (2 * N * BW)),                   # no KV
    ("check_critical_batch", _critical_batch, lambda F, BW, W, N, kv: W / (2 * N * BW / F - kv)),  # no inf case
    ("check_cost_per_million", lambda t, p: p / (t * 3600) * 1e6, lambda t, p: p / t * 1e6),
])
def test_checker_passes_the_right_formula_and_fails_a_wrong_one(name, right, wrong, capsys):
    assert_checker_separates(name, right, wrong, capsys)


def test_the_critical_batch_cases_are_realistic():
    # Llama-2-7B fp16 on an H100 without KV is the ridge in tokens: 989e12 * 2 / (2 * 3.35e12) = 295
    assert _critical_batch(989e12, 3.35e12, 13.48e9, 6.74e9, 0.0) == pytest.approx(989e12 / 3.35e12)
    assert _critical_batch(989e12, 3.35e12, 13.48e9, 6.74e9, 32 * 524288) == pytest.approx(466.8, abs=0.1)
