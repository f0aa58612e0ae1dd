"""The power exercise checkers accept the answer derived from the statement and catch the plausible wrong ones."""
import math

import pytest

from tests.conftest import assert_checker_separates


def _cheapest(vf, c, static, mc, *, static_on=True, lowest_tie=True):
    def energy(p):
        return (c * p[0] * p[1] ** 2 * 1e-6 + (static if static_on else 0)) * mc / p[0]
    return min(vf, key=lambda p: (energy(p), p[0] if lowest_tie else -p[0]))[0]


@pytest.mark.parametrize("wrong", [
    lambda vf, c, s, mc: _cheapest(vf, c, s, mc, static_on=False),     # the static power forgotten
    lambda vf, c, s, mc: max(p[0] for p in vf),                        # race to idle, always
    lambda vf, c, s, mc: min(vf, key=lambda p: c * p[0] * p[1] ** 2 * 1e-6 + s)[0],  # power, not energy
])
def test_the_cheapest_clock_checker_separates(wrong, capsys):
    assert_checker_separates("check_cheapest_mhz", _cheapest, wrong, capsys)


def _outweighs(w, kv, sram, pd, ps, *, sram_price=True, strict=True):
    c = 0
    while True:
        c += 1
        b = c * kv
        e = min(sram, b) * (ps if sram_price else pd) + max(0, b - sram) * pd
        if (e > w * pd) if strict else (e >= w * pd):
            return c


@pytest.mark.parametrize("wrong", [
    lambda w, kv, s, pd, ps: _outweighs(w, kv, 0, pd, ps),                 # SRAM ignored
    lambda w, kv, s, pd, ps: _outweighs(w, kv, s, pd, ps, sram_price=False),  # SRAM charged at DRAM's price
    lambda w, kv, s, pd, ps: _outweighs(w, kv, s, pd, ps, strict=False),   # "at least as much"
])
def test_the_kv_outweighs_checker_separates(wrong, capsys):
    assert_checker_separates("check_kv_outweighs_at", _outweighs, wrong, capsys)


def _breakeven(e, th, ph, tl, pl, tail, ih, il, *, with_tail=True):
    for n in range(1, 1_000_000):
        if e + n * tl * pl + (tail * il if with_tail else 0) < n * th * ph + (tail * ih if with_tail else 0):
            return n
    return None


@pytest.mark.parametrize("wrong", [
    lambda *a: _breakeven(*a, with_tail=False),                            # the idle tail left out
    lambda e, th, ph, tl, pl, *rest: e / (th * ph - tl * pl) if th * ph > tl * pl else math.inf,  # n*, unrounded
    lambda *a: (lambda n: None if n is None else n - 1)(_breakeven(*a)),   # one token short
])
def test_the_breakeven_checker_separates(wrong, capsys):
    assert_checker_separates("check_breakeven_with_tail", _breakeven, wrong, capsys)
