"""The checkers of the speed-against-bytes deep dive (06b) pass the answer derived from the statement and fail the
plausible wrong ones."""
import pytest

from tests.conftest import assert_checker_separates


def _speedup(step, products, s):
    return step / (step - products + products / s)


@pytest.mark.parametrize("wrong", [
    lambda step, products, s: s,                                    # the product's speed-up taken for the step's
    lambda step, products, s: step / (step / s),                    # the whole step scaled with the products
    lambda step, products, s: (step - products + products / s) / step,  # upside down: new time over old
    lambda step, products, s: step / (step - products + products * s),  # multiplied where it divides
])
def test_the_step_speedup_checker_separates(wrong, capsys):
    assert_checker_separates("check_step_speedup", _speedup, wrong, capsys)


def _budget(step, products, target):
    left = step / target - (step - products)
    return left if left > 0 else None


@pytest.mark.parametrize("wrong", [
    lambda step, products, target: products / target,                      # the products alone scaled
    lambda step, products, target: step / target - (step - products),       # never None: a negative budget
    lambda step, products, target: _budget(step, products, target) or 0.0,  # 0 where no speed reaches it
    lambda step, products, target: (lambda b: b if b > 0 else None)(step / target - products),  # rest and
    # products swapped
])
def test_the_products_budget_checker_separates(wrong, capsys):
    assert_checker_separates("check_products_budget", _budget, wrong, capsys)


def _share(p):
    return (p["other_ms"] + p["outside_ms"]) / p["profiled_step_ms"]


@pytest.mark.parametrize("wrong", [
    lambda p: p["other_ms"] / p["profiled_step_ms"],                       # the time between operators left out
    lambda p: (p["other_ms"] + p["outside_ms"]) / p["step_ms"],            # the unprofiled step as denominator
    lambda p: 100 * _share(p),                                              # a percentage
    lambda p: (p["profiled_step_ms"] - p["matmul_ms"]) / p["step_ms"],     # the unprofiled step again
])
def test_the_rest_share_checker_separates(wrong, capsys):
    assert_checker_separates("check_rest_share", _share, wrong, capsys)


def test_the_step_speedup_reference_matches_a_profile_split():
    # an int4 step against float32: 2x faster products in a step where they are 64 % give 1 / (0.36 + 0.32)
    from labkit.exercises.speed import _reference_products_budget, _reference_step_speedup

    assert _reference_step_speedup(100.0, 64.0, 2.0) == pytest.approx(1 / 0.68)
    assert _reference_products_budget(100.0, 64.0, 1 / 0.68) == pytest.approx(32.0)
    assert _reference_products_budget(100.0, 64.0, 100 / 36) is None  # the rest alone: no budget left
