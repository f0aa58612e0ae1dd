"""Replication over processes (`measure.replicate`, `by_process`, `compare_starts`): the interval from process-level
medians, and the worker helper that starts every side afresh."""
from __future__ import annotations

import random

import pytest

from labkit import measure
from tests.test_measure import FakeClock


def _start(p, effect_of_start, n_rounds=3, sigma=0.01):
    """One 'process': variants a and b identical in code, but each start shifts a by its own luck."""
    clock, rng = FakeClock(), random.Random(p)
    luck = effect_of_start[p]
    return measure.run({"a": clock.variant(1e-3 * luck, sigma, rng), "b": clock.variant(1e-3, sigma, rng)},
                       rounds=n_rounds, clock=clock, machine=False, seed=p)


def test_a_replicated_run_keeps_every_round_and_says_where_each_came_from():
    run = measure.replicate(lambda p: _start(p, [1.0] * 6), processes=6)
    assert run["a"].rounds == 18 and run.paired
    assert run.machine["process_of_round"] == [p for p in range(6) for _ in range(3)]
    assert len(run.order) == 18
    starts = measure.by_process(run)
    assert starts["a"].rounds == 6 and starts.paired
    back = measure.Run.from_dict(run.as_dict())  # saved and loaded: the starts are still known
    assert measure.by_process(back)["b"].samples == starts["b"].samples


def test_process_luck_does_not_pass_for_a_difference_between_the_variants():
    # each start gives a its own +-6 % (where the weights landed); within a start, rounds agree to 1 %
    luck = [1.06, 0.94, 1.05, 0.95, 1.06, 0.94]
    run = measure.replicate(lambda p: _start(p, luck, n_rounds=8), processes=6)
    by_rounds = measure.compare(run["a"], run["b"])
    by_starts = measure.compare_starts(run, "a", "b")
    assert by_starts.verdict == "inconclusive" and by_starts.low < 1 < by_starts.high
    assert by_rounds.rounds == 48 and by_starts.rounds == 6
    assert (by_starts.high - by_starts.low) > (by_rounds.high - by_rounds.low)  # process variance is in the interval


def test_a_real_difference_survives_at_the_process_level():
    run = measure.replicate(lambda p: _start(p, [0.8] * 6), processes=6)
    assert measure.compare_starts(run, "a", "b").verdict == "faster"


def test_bad_runs_are_refused():
    with pytest.raises(ValueError, match="timed in one process"):
        measure.by_process(_start(0, [1.0]))
    with pytest.raises(ValueError, match="processes must be"):
        measure.replicate(lambda p: _start(p, [1.0]), processes=0)
    with pytest.raises(ValueError, match="every start must time the same variants"):
        measure.replicate(lambda p: _start(p, [1.0] * 2) if p == 0 else
                          measure.run({"c": lambda: None}, rounds=2, machine=False, loops=1), processes=2)
    with pytest.raises(ValueError, match="not a variant"):
        measure.compare_starts(_start(0, [1.0]), "a", "z")
    assert measure.compare_starts(_start(0, [0.5], n_rounds=8), "a", "b").verdict == "faster"  # one process: rounds


def test_a_start_with_unpaired_or_unequal_rounds_is_refused():
    unequal = measure.Run.from_samples({"a": [1.0, 2.0], "b": [1.0, 2.0, 3.0]}, paired=False)
    with pytest.raises(ValueError, match="same paired rounds"):
        measure.replicate(lambda p: _start(p, [1.0] * 2) if p == 0 else unequal, processes=2)


def test_at_level_gives_the_process_medians_or_the_rounds_and_a_busy_start_is_named():
    one = _start(0, [1.0])
    assert measure.at_level(one) is one

    def start(p):
        r = _start(p, [1.0] * 6)
        r.machine["busy"] = p == 3
        return r

    run = measure.replicate(start, processes=6)
    assert measure.at_level(run)["a"].rounds == 6 and run.machine["busy"]
    assert "busy machine" in str(measure.compare_starts(run, "a", "b"))
