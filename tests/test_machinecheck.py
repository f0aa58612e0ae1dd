"""The measured-vs-modelled check says when the machine is too busy for its numbers to mean anything."""
import doctest

import pytest

from labkit.benchmarks import machinecheck


def test_busy_machine_is_detected():
    assert machinecheck.busy_reason([19.0, 20.0], 20.0) is None
    assert "moved from 8.0 to 19.0 GB/s" in machinecheck.busy_reason([8.0, 19.0], 20.0)  # samples disagree
    assert machinecheck.busy_reason([9.0, 9.5], 20.0) is not None  # both far below this machine's bandwidth
    with pytest.raises(ValueError, match="bandwidths must be > 0"):
        machinecheck.busy_reason([0.0, 0.0], 20.0)


def test_docstring_examples_hold():
    result = doctest.testmod(machinecheck)
    assert result.attempted > 0 and result.failed == 0
