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


def _fake_llama(folder, sig: str):
    pkg = folder / "llama_cpp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"import os, signal\nos.kill(os.getpid(), signal.{sig})\n")
    return str(folder)


def test_a_crashing_peer_is_reported_with_its_signal_and_the_avx2_build_is_tried_in_its_place(tmp_path, monkeypatch):
    """A llama.cpp build that dies on this CPU (the AMX repack's segfault) is named with its signal, and the
    AVX2-only build `LABKIT_LLAMA_AVX2` names is started in its place; when that fails too, both causes are said."""
    import labkit.benchmarks.workers as w

    monkeypatch.setattr(w, "FALLBACK", {})
    monkeypatch.setenv("PYTHONPATH", _fake_llama(tmp_path / "native", "SIGSEGV"))
    monkeypatch.delenv(w.AVX2_BUILD, raising=False)
    worker, why = w.start_peer("smollm2-135m", None)
    assert worker is None and "exited with code -11 (SIGSEGV)" in why and "AVX2-only" not in why
    monkeypatch.setenv(w.AVX2_BUILD, _fake_llama(tmp_path / "avx2", "SIGABRT"))
    worker, why = w.start_peer("smollm2-135m", None)
    assert worker is None and "(SIGSEGV)" in why and "the AVX2-only build in LABKIT_LLAMA_AVX2 failed too" in why
    assert "(SIGABRT)" in why
    run, why = rates_in_own_processes({"labkit": SPEC}, IDS, n=2, rounds=1, settle_s=0.0)
    assert list(run) == ["labkit"] and "(SIGSEGV)" in why  # the labkit side still measured, the peer's absence said
