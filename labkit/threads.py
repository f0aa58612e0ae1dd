"""How many threads labkit's work runs on, chosen for a CPU that other programs share.

torch's intra-op threads (and labkit's block kernels, through `at::parallel_for`) run as one OpenMP team.
At the end of each parallel region the threads that finished wait for the rest at a barrier, and GNU
OpenMP (the runtime in torch's Linux wheels) lets a waiting thread *spin* before it sleeps. On a quiet
machine that is free: every thread has its own core. When another program holds a core, one thread of
the team is descheduled now and then; its partner spins at the barrier on the core the other program or
the descheduled thread needs, and a decode step, which crosses a barrier hundreds of times, slows by a
multiple of the CPU it lost (the bench `labkit bench --only busy` measures it, beside llama.cpp).

What labkit does (`choose`): at `import labkit` it samples, for `SAMPLE_S`, how many logical CPUs other
programs keep busy, and when fewer are free than torch would use, it runs on the free ones
(at least one). A team that fits the free cores never waits for a descheduled partner, so a step slows
in proportion to the CPU it gets. On a quiet machine it changes nothing. The wait policy stays GNU
OpenMP's default (spin, then sleep): sleeping at once (`OMP_WAIT_POLICY=PASSIVE`) wakes the team at every
region and costs a quiet machine's decode far more than it saves on a busy one, shorter spin counts
neither (the bench's notes say by how much, on the CPU it ran).

It chooses only when you did not: `OMP_NUM_THREADS` set by you, or `LABKIT_THREADS` (`auto`, the default;
`all`: torch's own count; or a number) decide instead. The choice is made once, when labkit is imported
(a Jupyter kernel, `labkit serve`, a script): work that starts later on the machine is not seen.
`status()` says what is in effect and why (`labkit doctor` prints it).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

__all__ = ["Choice", "threads_for", "other_busy_cpus", "choose", "apply", "status", "SAMPLE_S", "VARIABLE"]

SAMPLE_S = 0.1  # how long `import labkit` samples the CPU
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


def _proc_stat() -> tuple[float, float] | None:
    """(busy, total) jiffies over all CPUs from /proc/stat, or None where there is none (not Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def other_busy_cpus(cpus: int, sample_s: float = SAMPLE_S) -> float | None:
    """How many of `cpus` logical CPUs other programs kept busy over `sample_s` seconds (this process's own CPU
    time taken out); from /proc/stat on Linux, else the 1-minute load average; None where neither exists."""
    first, mine = _proc_stat(), time.process_time()
    if first is None:
        try:
            return min(float(cpus), os.getloadavg()[0])
        except (AttributeError, OSError):
            return None
    time.sleep(sample_s)
    second, mine = _proc_stat(), time.process_time() - mine
    busy, total = second[0] - first[0], second[1] - first[1]
    if total <= 0:
        return None
    share = busy / total * cpus - mine / sample_s
    return max(0.0, min(float(cpus), share))


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


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


def choose(env=None, sample_s: float = SAMPLE_S, busy: float | None = -1.0) -> Choice:
    """What labkit runs on in this environment (`env`, default `os.environ`); `busy`: the other programs' CPUs
    (default: sampled now)."""
    env = os.environ if env is None else env
    asked = env.get(VARIABLE, "auto").strip().lower()
    user_omp = env.get("OMP_NUM_THREADS") and env.get(_CHOSEN) != env.get("OMP_NUM_THREADS")
    if user_omp:
        return Choice(None, f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']} as you set it")
    if asked == "all":
        return Choice(None, f"{VARIABLE}=all: torch's own thread count")
    if asked != "auto":
        if not asked.isdigit() or int(asked) < 1:
            raise ValueError(f"{VARIABLE} must be 'auto', 'all' or a positive number of threads, got "
                             f"{env.get(VARIABLE)!r}")
        return Choice(int(asked), f"{VARIABLE}={asked} as you set it")
    cpus = _cpus()
    busy = other_busy_cpus(cpus, sample_s) if busy == -1.0 else busy
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
    `torch.set_num_threads`. Called by `import labkit`; a bad `LABKIT_THREADS` is reported there, not raised."""
    env = os.environ if env is None else env
    try:
        c = choose(env)
    except ValueError as exc:
        c = Choice(None, f"torch's own thread count ({exc})")
    if c.threads is None and env.get(_CHOSEN) and env.get(_CHOSEN) == env.get("OMP_NUM_THREADS"):
        del env["OMP_NUM_THREADS"], env[_CHOSEN]  # a parent's choice, which this process did not repeat
    if c.threads is not None:
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(c.threads)
        else:
            env["OMP_NUM_THREADS"] = env[_CHOSEN] = str(c.threads)
    _LAST[:] = [c]
    return c


def status() -> str:
    """One line: the threads labkit chose in this process, and why."""
    return _LAST[0].why if _LAST else "not chosen yet (labkit.threads.apply() runs at `import labkit`)"
