"""Intervals for proportions: Wilson's score interval and Newcombe's hybrid interval for a difference, against the
worked examples of Newcombe (1998), Statistics in Medicine 17, 857-872 (Tables I and II)."""
import pytest

from labkit.measure.stats import rate_difference, wilson_interval


@pytest.mark.parametrize("k, n, low, high", [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605),
                                             (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)])
def test_wilson_matches_newcombe_table(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)


@pytest.mark.parametrize("a, n, b, m, low, high", [(56, 70, 48, 80, 0.0524, 0.3339), (9, 10, 3, 10, 0.1705, 0.8090),
                                                   (5, 56, 0, 29, -0.0381, 0.1926)])
def test_newcombe_difference_matches_his_table(a, n, b, m, low, high):
    d, lo, hi = rate_difference(a, n, b, m)
    assert d == pytest.approx(a / n - b / m)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)


def test_rates_refuse_impossible_counts():
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 4)
    with pytest.raises(ValueError, match="n"):
        wilson_interval(0, 0)
