"""Each side of a comparison in its own process, rounds alternating (labkit.benchmarks.workers)."""
from __future__ import annotations

import pytest

from labkit import measure
from labkit.benchmarks.workers import Worker, alternate, rates_in_own_processes

SPEC = {"side": "labkit", "model": "shakespeare"}
IDS = [5, 6, 7, 8, 9, 10, 11, 12]


def test_two_workers_take_turns_and_their_rounds_are_paired():
    with Worker(SPEC) as a, Worker(SPEC) as b:
        assert a.proc.pid != b.proc.pid  # two processes
        run = alternate({"a": a, "b": b}, IDS, n=4, rounds=3, warmup=1, settle_s=0.05)
    assert run["a"].rounds == run["b"].rounds == 3 and run["a"].per == "token"
    assert all(s > 0 for s in run["a"].samples + run["b"].samples)
    assert "own worker process" in run.machine["protocol"] and "cpu" in run.machine
    c = measure.compare(run["a"], run["b"], margin=0.5)
    assert c.method.startswith("paired") and c.verdict in measure.VERDICTS


def test_a_worker_that_cannot_start_says_why():
    with pytest.raises(ValueError, match="side"):
        Worker({"side": "vllm"})
    with pytest.raises(RuntimeError, match="could not start.*nope"):
        Worker({"side": "labkit", "model": "nope"})


def test_the_peer_missing_is_reported_not_fatal():
    pytest.importorskip("torch")
    try:
        import llama_cpp  # noqa: F401
        pytest.skip("llama-cpp-python is installed: the peer would run")
    except ImportError:
        pass
    run, why = rates_in_own_processes({"labkit": SPEC}, IDS, n=2, rounds=1, settle_s=0.0)
    assert list(run) == ["labkit"] and "llama-cpp-python is not installed" in why


def test_replicated_starts_start_every_side_afresh():
    pids = []
    import labkit.benchmarks.workers as w

    real = w.Worker

    class Spy(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            pids.append(self.proc.pid)

    w.Worker = Spy
    try:
        run, _ = rates_in_own_processes({"x": SPEC, "y": SPEC}, IDS, n=2, rounds=1, peer=False, settle_s=0.0,
                                        processes=2)
    finally:
        w.Worker = real
    assert len(set(pids)) == 4  # two sides, two starts: four processes
    assert run.machine["process_of_round"] == [0, 1] and run["x"].rounds == 2
    with pytest.raises(ValueError, match="processes must be"):
        rates_in_own_processes({"x": SPEC}, IDS, n=2, rounds=1, peer=False, processes=0)
