"""How many threads labkit's work runs on, chosen for a CPU that other programs share.

torch's intra-op threads (and labkit's block kernels, through `at::parallel_for`) run as one OpenMP team.
At the end of each parallel region the threads that finished wait for the rest at a barrier, and GNU
OpenMP (the runtime in torch's Linux wheels) lets a waiting thread *spin* before it sleeps. On a quiet
machine that is free: every thread has its own core. When another program holds a core, one thread of
the team is descheduled now and then; its partner spins at the barrier on the core the other program or
the descheduled thread needs, and a decode step, which crosses a barrier hundreds of times, slows by more
than the share of the CPU it lost (`labkit bench --only busy` measures it, beside llama.cpp).

What labkit does (`choose`): at `import labkit` it samples how many of this process's CPUs other programs
keep busy (twice, `SAMPLE_S` each, keeping the smaller: a blip does not count), and when fewer are free than
torch would use, it runs on the free ones (at least one). A team that fits the free cores never waits for a
descheduled partner. On a quiet machine it changes nothing. It leaves the wait policy alone: letting
threads sleep at once (`OMP_WAIT_POLICY=PASSIVE`) wakes the team at every region, which slowed quiet decode on
labkit's kernels in a one-off run (not a stored bench: untested as a claim).

It chooses only when you did not: `OMP_NUM_THREADS` or `MKL_NUM_THREADS` set by you, or `LABKIT_THREADS`
(`auto`, the default; `all`: torch's own count; or a number) decide instead. The choice is made once, when
labkit is imported (in a notebook, by the first cell that imports it; `labkit serve`; a script): work that
starts later on the machine is not seen. `status()` says what is in effect in this process and why
(`labkit doctor` prints it: in a terminal, for the doctor's own process).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

__all__ = ["Choice", "threads_for", "other_busy_cpus", "choose", "apply", "status", "SAMPLE_S", "VARIABLE"]

SAMPLE_S = 0.05  # how long each of the two samples at `import labkit` lasts
VARIABLE = "LABKIT_THREADS"
_CHOSEN = "_LABKIT_CHOSE_THREADS"  # marks an OMP_NUM_THREADS that labkit wrote (its children choose afresh)
_LAST: list = []  # the choice `apply` made in this process


@dataclass(frozen=True)
class Choice:
    """`threads` to run on (None: leave torch's own count), what it was chosen from, and why (one line)."""

    threads: int | None
    why: str
    cpus: int = 0
    busy: float = 0.0


def threads_for(default: int, cpus: int, busy: float) -> int | None:
    """The threads to run on when other programs keep `busy` of `cpus` logical CPUs busy and torch would use
    `default`: the free CPUs (a CPU counts as taken when other work holds 0.4 of it or more), at least 1, when
    that is below `default`; else None (keep torch's count).

    >>> threads_for(2, 2, 1.0), threads_for(2, 2, 0.1), threads_for(4, 8, 3.0), threads_for(4, 8, 6.0)
    (1, None, None, 2)
    """
    for name, value in (("default", default), ("cpus", cpus)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not busy >= 0:
        raise ValueError(f"busy must be a number of CPUs >= 0, got {busy!r}")
    free = max(1, cpus - int(busy + 0.6))
    return free if free < default else None


def _proc_stat(cpus: set[int] | None = None) -> tuple[float, float] | None:
    """(busy, total) jiffies summed over the logical CPUs `cpus` (all when None) from /proc/stat, or None where
    there is none (not Linux)."""
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu") and line[3:4].isdigit()]
    except OSError:
        return None
    busy = total = 0
    for fields in lines:
        if cpus is not None and int(fields[0][3:]) not in cpus:
            continue
        values = [int(v) for v in fields[1:9]]  # guest time is already counted in user
        idle = values[3] + values[4]  # idle + iowait
        busy, total = busy + sum(values) - idle, total + sum(values)
    return (busy, total) if lines else None


def other_busy_cpus(sample_s: float = SAMPLE_S) -> float | None:
    """How many of this process's logical CPUs (its affinity) other programs kept busy over `sample_s` seconds,
    this process's own CPU time taken out: from /proc/stat on Linux, else the 1-minute load average; None where
    neither exists."""
    if not isinstance(sample_s, (int, float)) or not sample_s > 0:
        raise ValueError(f"sample_s must be a positive number of seconds, got {sample_s!r}")
    mine_set = _affinity()
    cpus = len(mine_set) if mine_set else (os.cpu_count() or 1)
    first, mine = _proc_stat(mine_set), time.process_time()
    if first is None:
        try:
            return min(float(cpus), os.getloadavg()[0])
        except (AttributeError, OSError):
            return None
    time.sleep(sample_s)
    second, mine = _proc_stat(mine_set), time.process_time() - mine
    busy, total = second[0] - first[0], second[1] - first[1]
    if total <= 0:
        return None
    return max(0.0, min(float(cpus), busy / total * cpus - mine / sample_s))


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:
        return None


def _cpus() -> int:
    mine = _affinity()
    return len(mine) if mine else (os.cpu_count() or 1)


def _physical(cpus: int) -> int:
    """The threads torch starts with by default: its physical cores (Linux: distinct (package, core) ids), at
    most `cpus`; `cpus` where the system does not say."""
    try:
        with open("/proc/cpuinfo") as f:
            blocks = f.read().split("\n\n")
    except OSError:
        return cpus
    cores = set()
    for block in blocks:
        ids = dict(line.replace("\t", "").split(":", 1) for line in block.splitlines()
                   if line.startswith(("physical id", "core id")))
        if len(ids) == 2:
            cores.add((ids["physical id"].strip(), ids["core id"].strip()))
    return min(cpus, len(cores)) if cores else cpus


_SAMPLE = object()  # `choose(busy=...)` default: sample the CPUs now


def choose(env=None, sample_s: float = SAMPLE_S, busy=_SAMPLE) -> Choice:
    """What labkit runs on in this environment (`env`, default `os.environ`); `busy`: the CPUs other programs keep
    busy (a number, None for "unknown"; default: sampled now, twice, the smaller kept)."""
    env = os.environ if env is None else env
    asked = env.get(VARIABLE, "auto").strip().lower()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if env.get(var) and not (var == "OMP_NUM_THREADS" and env.get(_CHOSEN) == env.get(var)):
            return Choice(None, f"{var}={env[var]} as you set it")
    if asked == "all":
        return Choice(None, f"{VARIABLE}=all: torch's own thread count")
    if asked != "auto":
        if not asked.isdigit() or int(asked) < 1:
            raise ValueError(f"{VARIABLE} must be 'auto', 'all' or a positive number of threads, got "
                             f"{env.get(VARIABLE)!r}")
        return Choice(int(asked), f"{VARIABLE}={asked} as you set it")
    cpus = _cpus()
    if busy is _SAMPLE:
        samples = [other_busy_cpus(sample_s) for _ in range(2)]
        busy = None if None in samples else min(samples)
    if busy is not None and not isinstance(busy, (int, float)):
        raise ValueError(f"busy must be a number of CPUs or None, got {busy!r}")
    if busy is None:
        return Choice(None, "torch's own thread count (this system does not say how busy its CPUs are)", cpus)
    default = _physical(cpus)
    n = threads_for(default, cpus, busy)
    if n is None:
        return Choice(None, f"torch's own thread count ({default}): other programs kept {busy:.1f} of {cpus} "
                            f"CPUs busy when labkit started", cpus, busy)
    return Choice(n, f"{n} of {default} threads: other programs kept {busy:.1f} of {cpus} CPUs busy when labkit "
                     f"started, and a team larger than the free CPUs waits for its descheduled threads",
                  cpus, busy)


def apply(env=None) -> Choice:
    """Choose (`choose`) and put it in effect: before torch starts, in `OMP_NUM_THREADS`; after, through
    `torch.set_num_threads` (a count a parent process chose, which this one does not repeat, goes back to torch's
    own). Called by `import labkit`; a bad `LABKIT_THREADS` warns there and leaves torch's count."""
    import warnings

    env = os.environ if env is None else env
    try:
        c = choose(env)
    except ValueError as exc:
        warnings.warn(f"labkit keeps torch's own thread count: {exc}", RuntimeWarning, stacklevel=2)
        c = Choice(None, f"torch's own thread count ({exc})")
    torch = sys.modules.get("torch")
    inherited = env.get(_CHOSEN) and env.get(_CHOSEN) == env.get("OMP_NUM_THREADS")
    if c.threads is None and inherited:  # a parent's choice, which this process did not repeat
        del env["OMP_NUM_THREADS"], env[_CHOSEN]
        if torch is not None:  # the runtime read it already: set torch's own count back
            torch.set_num_threads(_physical(_cpus()))
    if c.threads is not None:
        if torch is not None:
            torch.set_num_threads(c.threads)
        else:
            env["OMP_NUM_THREADS"] = env[_CHOSEN] = str(c.threads)
    _LAST[:] = [c]
    return c


def status() -> str:
    """One line: the threads labkit chose in this process, and why."""
    return _LAST[0].why if _LAST else "not chosen yet (labkit.threads.apply() runs at `import labkit`)"
