"""labkit.threads: the thread count chosen at `import labkit` for a CPU other programs share."""
import os
import subprocess
import sys

import pytest

from labkit import threads
from tests.conftest import ROOT


@pytest.mark.parametrize("default,cpus,busy,want", [
    (2, 2, 1.0, 1),      # one of two cores busy: one thread
    (2, 2, 0.3, None),   # a light load takes no core
    (2, 2, 0.45, 1),     # 0.4 of a core counts as taken
    (2, 2, 2.0, 1),      # never below one thread
    (4, 8, 3.0, None),   # 5 free logical CPUs >= torch's 4 threads: unchanged
    (4, 8, 5.0, 3),
])
def test_threads_for_takes_the_free_cpus_only_when_fewer_than_torchs(default, cpus, busy, want):
    assert threads.threads_for(default, cpus, busy) == want


@pytest.mark.parametrize("kwargs,name", [({"default": 0}, "default"), ({"cpus": 1.5}, "cpus"),
                                         ({"busy": -1.0}, "busy"), ({"busy": float("nan")}, "busy")])
def test_threads_for_refuses_bad_arguments_by_name(kwargs, name):
    args = {"default": 2, "cpus": 2, "busy": 0.0, **kwargs}
    with pytest.raises(ValueError, match=name):
        threads.threads_for(**args)


def test_choose_respects_what_the_user_set():
    assert threads.choose({"OMP_NUM_THREADS": "3"}, busy=2.0).threads is None
    assert "as you set" in threads.choose({"OMP_NUM_THREADS": "3"}, busy=2.0).why
    assert threads.choose({"MKL_NUM_THREADS": "2"}, busy=2.0).why == "MKL_NUM_THREADS=2 as you set it"
    assert threads.choose({"LABKIT_THREADS": "all"}, busy=2.0).threads is None
    assert threads.choose({"LABKIT_THREADS": "3"}, busy=0.0).threads == 3
    for bad in ("0", "many", "-2"):
        with pytest.raises(ValueError, match="LABKIT_THREADS.*'auto', 'all' or a positive number"):
            threads.choose({"LABKIT_THREADS": bad})
    with pytest.raises(ValueError, match="busy must be a number of CPUs or None, got 'two'"):
        threads.choose({}, busy="two")
    with pytest.raises(ValueError, match="sample_s must be a positive number of seconds, got 0"):
        threads.other_busy_cpus(sample_s=0)


def test_a_parents_choice_is_made_afresh():
    inherited = {"OMP_NUM_THREADS": "1", "_LABKIT_CHOSE_THREADS": "1"}
    assert threads.choose(inherited, busy=0.0).threads is None  # quiet now: torch's own count
    assert "torch's own thread count" in threads.choose(inherited, busy=0.0).why
    assert threads.choose({}, busy=None).threads is None
    assert "does not say" in threads.choose({}, busy=None).why


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="samples /proc/stat (Linux)")
def test_the_sample_sees_a_busy_core():
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = threads.other_busy_cpus(sample_s=0.5)
    finally:
        hog.kill()
        hog.wait()
    assert busy >= 0.6


def _threads_in_child(env: dict, code: str = "import labkit, torch") -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                            "_LABKIT_CHOSE_THREADS", "LABKIT_THREADS")} | env
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", f"{code}; from labkit import threads; "
                          "print(torch.get_num_threads(), '|', threads.status())"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_labkit_puts_the_choice_in_effect_before_and_after_torch():
    default = int(_threads_in_child({"LABKIT_THREADS": "all"}, "import torch").split("|")[0])
    if default < 2:
        pytest.skip("torch runs one thread here: no choice to tell from its own")
    assert _threads_in_child({"LABKIT_THREADS": "1"}).startswith("1 |")
    assert _threads_in_child({"LABKIT_THREADS": "1"}, "import torch, labkit").startswith("1 |")
    inherited = {"LABKIT_THREADS": "all", "OMP_NUM_THREADS": "1", "_LABKIT_CHOSE_THREADS": "1"}
    for code in ("import labkit, torch", "import torch, labkit"):  # a parent's choice does not stick, either way
        assert int(_threads_in_child(inherited, code).split("|")[0]) == default, code
    assert _threads_in_child({"OMP_NUM_THREADS": "1"}).startswith("1 | OMP_NUM_THREADS=1 as you set it")
    bad = _threads_in_child({"LABKIT_THREADS": "lots"})
    assert bad.startswith(f"{default} |") and "LABKIT_THREADS must be" in bad  # reported, torch's own count kept


def test_the_busy_bench_refuses_a_thread_count_set_from_outside(monkeypatch):
    from labkit.benchmarks import busy

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("_LABKIT_CHOSE_THREADS", raising=False)
    out = busy.run(quick=True)
    assert "OMP_NUM_THREADS=1 is set" in out["skipped"]
