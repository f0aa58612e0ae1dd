"""The argument checks: one message form, bools refused as numbers, and no inline copies elsewhere."""
from __future__ import annotations

import math
import re

import pytest
import torch

from labkit import checks
from tests.conftest import ROOT


@pytest.mark.parametrize("value", [0, -3, 2.0, "4", None, True, False])
def test_positive_int_refuses_what_is_not_a_count(value):
    with pytest.raises(ValueError, match=re.escape(f"block_size must be a positive integer, got {value!r}")):
        checks.positive_int("block_size", value)


def test_integer_bounds_and_words():
    assert checks.integer("k", 0, low=0) == 0 and checks.integer("k", 12, 1, 12) == 12
    cases = [(dict(low=0), -1, "a non-negative integer"), (dict(low=64), 63, "an integer >= 64"),
             (dict(low=1, high=12), 13, "an integer in [1, 12]"), (dict(high=5), 6, "an integer <= 5")]
    for bounds, bad, words in cases:
        with pytest.raises(ValueError, match=re.escape(f"k must be {words}, got {bad}")):
            checks.integer("k", bad, **bounds)
    with pytest.raises(ValueError, match=r"chunk must be a positive integer \(tokens per pass\), got 0"):
        checks.positive_int("chunk", 0, why="tokens per pass")
    assert checks.positive_int("g", None, none_ok=True) is None
    with pytest.raises(ValueError, match="g must be None or a positive integer, got 0"):
        checks.positive_int("g", 0, none_ok=True)
    with pytest.raises(TypeError, match="vocab_size must be an integer, got '9'"):
        checks.integer("vocab_size", "9", error=TypeError)


def test_number_ends_open_and_closed():
    assert checks.number("p", 1, 0, 1, low_open=True) == 1
    for bad in (0, 1.5, math.nan, math.inf, True, "0.5"):
        with pytest.raises(ValueError, match=re.escape(f"p must be a number in (0, 1], got {bad!r}")):
            checks.number("p", bad, 0, 1, low_open=True)
    with pytest.raises(ValueError, match=r"r must be a number in \[0, 1\), got 1"):
        checks.probability("r", 1, high_open=True)
    with pytest.raises(ValueError, match="s must be a positive number, got 0"):
        checks.positive("s", 0)
    with pytest.raises(ValueError, match="x must be a number >= 0, got -1"):
        checks.number("x", -1, 0)
    with pytest.raises(ValueError, match="x must be a finite number, got nan"):
        checks.number("x", math.nan)


def test_flag_and_one_of():
    assert checks.flag("f", False) is False
    for bad in (0, 1, None, "yes"):
        with pytest.raises(ValueError, match=re.escape(f"f must be True or False, got {bad!r}")):
            checks.flag("f", bad)
    with pytest.raises(TypeError, match="f must be True or False"):
        checks.flag("f", 1, error=TypeError)
    assert checks.one_of("policy", "static", {"static": 1, "chunked": 2}) == "static"
    with pytest.raises(ValueError, match=r"policy must be one of \('static', 'chunked'\), got \['static'\]"):
        checks.one_of("policy", ["static"], {"static": 1, "chunked": 2})


def test_tensor_kind_dtype_and_shape():
    x = torch.zeros(2, 3)
    assert checks.tensor("x", x, shape=(None, 3), floating=True) is x
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        checks.tensor("x", [1.0])
    with pytest.raises(TypeError, match="ids must be a torch.int64 tensor, got torch.float32"):
        checks.tensor("ids", x, dtype=torch.int64)
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        checks.tensor("x", torch.zeros(2, dtype=torch.int64), floating=True)
    with pytest.raises(ValueError, match=r"x must have shape \(\*, 4\), got \(2, 3\)"):
        checks.tensor("x", x, shape=(None, 4))
    with pytest.raises(ValueError, match=r"x must have 1 dimensions, got shape \(2, 3\)"):
        checks.tensor("x", x, ndim=1)


def test_no_inline_bool_checks_outside_the_checks_module():
    """`isinstance(x, bool)` (an int that is not a bool, a flag) is written once, in labkit/checks.py."""
    found = []
    for path in sorted((ROOT / "labkit").rglob("*.py")):
        if path.name == "checks.py" and path.parent.name == "labkit":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"isinstance\([^()]*,\s*bool\)", line):
                found.append(f"{path.relative_to(ROOT)}:{n}")
    assert found == [], "use labkit.checks (integer, number, flag, is_int, is_number) instead"
