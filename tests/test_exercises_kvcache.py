"""Deep dive 04a's exercise checkers: the shortest context from which a compressed layer stays under a quarter, and
an H2O budget at equal bytes."""
import pytest

from labkit.exercises.kvcache import _csa_values, check_csa_quarter
from tests.conftest import assert_checker_separates


def _values(n, block, window, kv_dim, index_dim):
    return min(n, window - 1) * 2 * kv_dim + n // block * (kv_dim + index_dim) + n % block * (2 * kv_dim + index_dim)


def test_the_right_answer_passes_and_the_first_crossing_fails(capsys):
    assert all(_values(n, 4, 64, 128, 32) == _csa_values(n, 4, 64, 128, 32) for n in (1, 3, 63, 64, 65, 700, 1025))

    def right(block, window, kv_dim, index_dim, dense, horizon):
        over = [n for n in range(1, horizon + 1) if _values(n, block, window, kv_dim, index_dim) > dense * n / 4]
        return (max(over) + 1 if over else 1), (kv_dim + index_dim) / (block * dense)

    def first_crossing(block, window, kv_dim, index_dim, dense, horizon):  # the non-monotone trap
        n = next(n for n in range(1, horizon + 1) if _values(n, block, window, kv_dim, index_dim) <= dense * n / 4)
        return n, (kv_dim + index_dim) / (block * dense)

    assert check_csa_quarter(right)
    assert not check_csa_quarter(first_crossing)
    assert "[FAIL]" in capsys.readouterr().out


def _h2o(cfg, length, fraction, *, extra_bytes=8, rounding=int):
    kv = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4
    extra = cfg.n_layers * cfg.n_kv_heads * extra_bytes
    return rounding(fraction * length * kv / (kv + extra))


@pytest.mark.parametrize("wrong", [lambda c, n, f: _h2o(c, n, f, extra_bytes=0),   # keys and values only
                                   lambda c, n, f: _h2o(c, n, f, extra_bytes=4),   # the position, not the score
                                   lambda c, n, f: _h2o(c, n, f, rounding=round),  # rounded up past the bytes
                                   lambda c, n, f: float(_h2o(c, n, f))])          # not a whole number of tokens
def test_the_h2o_budget_checker_separates(wrong, capsys):
    assert_checker_separates("check_h2o_budget", _h2o, wrong, capsys)


def _mixed(windows, context, heads, dim, b, *, cap=True, pair=2):
    held = sum(context if w == 0 else (min(context, w) if cap else w) for w in windows)
    return pair * heads * dim * b * held


@pytest.mark.parametrize("wrong", [lambda *a: _mixed(*a, cap=False),            # a window counted before it fills
                                   lambda *a: _mixed(*a, pair=1),               # keys only
                                   lambda w, n, h, d, b: 2 * len(w) * h * d * b * n])  # every layer global
def test_the_mixed_cache_checker_separates(wrong, capsys):
    assert_checker_separates("check_mixed_cache_bytes", _mixed, wrong, capsys)
