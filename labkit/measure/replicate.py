"""Replication over processes: a run made of several independent processes, and the comparison built from them.

Rounds inside one process share that process's luck: where the allocator put the weights, which
core the OS pinned, how warm the caches are. Two identical no-ops over 2,000 paired rounds in one
process can give an interval that excludes 1 (Kalibera & Jones, "Rigorous benchmarking in
reasonable time", 2013: replicate at the level that varies). So a figure meant to generalise
beyond one process is measured in `processes` fresh starts, a few rounds in each, and its
interval is built from the **process-level medians**, one per start, paired by start:

    run = replicate(lambda p: one_process_run(seed=p), processes=6)   # every round kept
    starts = by_process(run)                                           # 6 paired process medians
    c = compare(starts["a"], starts["b"])

Six starts are the fewest for which the sign test's interval at 95 % exists (2 / 2**6 < 0.05).
"""
from __future__ import annotations

import statistics
from typing import Callable

from labkit import checks
from labkit.measure.run import Run

__all__ = ["replicate", "by_process", "at_level", "compare_starts", "MIN_PROCESSES"]

MIN_PROCESSES = 6


def replicate(make_run: Callable[[int], Run], processes: int) -> Run:
    """One Run of `processes` runs made by `make_run(p)` for p = 0, 1, ...: every round kept, paired round by round, and
    `machine["process_of_round"]` saying which start each round came from (`by_process` reads it). Each start must
    time every variant in the same paired rounds; the machine counts as busy if it was in any start."""
    checks.positive_int("processes", processes)
    runs = [make_run(p) for p in range(processes)]
    for p, r in enumerate(runs):
        if not isinstance(r, Run):
            raise ValueError(f"make_run({p}) must return a measure.Run, got {type(r).__name__}")
        if list(r) != list(runs[0]):
            raise ValueError(f"make_run({p}) timed {list(r)}, but make_run(0) timed {list(runs[0])}: every start must "
                             "time the same variants")
    names = list(runs[0])
    per = []
    for p, r in enumerate(runs):
        counts = {r[n].rounds for n in names}
        if len(counts) != 1 or (len(names) > 1 and not r.paired):
            raise ValueError(f"make_run({p}) must time every variant in the same paired rounds, got "
                             f"{ {n: r[n].rounds for n in names} } samples (paired: {r.paired})")
        per.append(counts.pop())
    samples = {n: [s for r in runs for s in r[n].samples] for n in names}
    machine = dict(runs[0].machine)
    machine["loadavg_after"] = runs[-1].machine.get("loadavg_after")
    machine["busy"] = any(r.machine.get("busy") for r in runs)  # a busy machine in any start is named
    machine["processes"] = processes
    machine["process_of_round"] = [p for p, k in enumerate(per) for _ in range(k)]
    machine["protocol"] = (f"{processes} independent starts of {runs[0].machine.get('protocol', 'the run')}; "
                           "intervals from the process-level medians (measure.by_process)")
    unit = runs[0][names[0]].per
    out = Run.from_samples(samples, runs[0].warmup, machine, unit=unit, paired=True)
    out.order = [o for r in runs for o in r.order]
    return out


def by_process(run: Run) -> Run:
    """The Run of process-level medians of a `replicate`d run: one sample per start and variant, paired by start.
    A run of one process (no `process_of_round`) is refused: its rounds cannot stand for other processes."""
    where = run.machine.get("process_of_round")
    if not where:
        raise ValueError("run was timed in one process (its machine record has no 'process_of_round'): time it with "
                         "measure.replicate over several processes to compare at the process level")
    names = list(run)
    if any(run[n].rounds != len(where) for n in names):
        raise ValueError(f"run has {len(where)} rounds in 'process_of_round' but its variants have "
                         f"{ {n: run[n].rounds for n in names} } samples")
    starts = sorted(set(where))
    medians = {n: [statistics.median(s for s, p in zip(run[n].samples, where) if p == q) for q in starts]
               for n in names}
    machine = {**run.machine, "level": f"process medians of {len(starts)} starts"}
    return Run.from_samples(medians, run.warmup, machine, unit=run[names[0]].per, paired=True)


def at_level(run: Run) -> Run:
    """The run at the level it was replicated at: its process-level medians (`by_process`) when it was timed over
    several starts, the run itself (its rounds) when it was timed in one process."""
    return by_process(run) if len(set(run.machine.get("process_of_round") or [])) > 1 else run


def compare_starts(run: Run, a: str, b: str, **kwargs):
    """`measure.compare` of variants `a` and `b` of `run` at the level it was replicated at: the process-level medians
    (`by_process`) of a run over several starts, the rounds of a run in one process. Keyword arguments go to
    `compare` (e.g. `names`, `margin`)."""
    from labkit.measure.compare import compare

    for name in (a, b):
        if name not in run.timings:
            raise ValueError(f"{name!r} is not a variant of the run; it has {list(run)}")
    level = at_level(run)
    return compare(level[a], level[b], **{"machine": run.machine, **kwargs})
