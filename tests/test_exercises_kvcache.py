"""Chapter 04's exercise 6 checker: the shortest context from which a compressed layer stays under a quarter."""
from labkit.exercises.kvcache import _csa_values, check_csa_quarter


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
