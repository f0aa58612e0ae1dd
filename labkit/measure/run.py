"""`run`: time several variants of one piece of work, interleaved round by round, with their spread.

    >>> r = run({"sum": lambda: sum(range(100)), "list": lambda: list(range(100))}, rounds=5, warmup=1)
    >>> sorted(r), r["sum"].rounds
    (['list', 'sum'], 5)

Each round calls every variant once, in a fresh random order (seeded, recorded in `Run.order`),
so drift in the machine (a turbo clock settling, another process starting) hits all variants
alike, and so does carry-over: what one variant leaves behind (a cache it evicted, a pool still
spinning) lands on each other variant equally often in expectation, not always on the same one
(a fixed rotation abc, bca, cab puts b after a twice as often as c). `warmup` rounds run first,
untimed, with the same calls.

**One sample lasts at least `MIN_TICKS` ticks of the clock.** A call shorter than that is timed
in loops of several calls (`loops`, calibrated before the first round, doubling until a loop
lasts long enough: `timeit`'s autorange); with a per-call `setup` (stateful work) calls cannot be
looped, so such work is refused with a `ValueError` rather than timed at the clock's resolution.

Every variant's samples are kept; `Timing` summarises them (median, quartiles, IQR, min, max,
mean) and `Run.machine` records the machine's state around the run: the load average before and
after, the number of cores, whether the machine was **busy** (more runnable work than cores before
the run began: a verdict from it says so), and the CPU record (`labkit.measure.cpu.cpu_info`)
that stored figures carry. `Run.as_dict` / `Run.from_dict` keep whether the rounds were paired.
"""
from __future__ import annotations

import itertools
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Callable

from labkit import checks
from labkit.measure.clock import Clock, now
from labkit.measure.stats import summary

__all__ = ["run", "Run", "Timing", "machine_state", "calibrate_loops", "MIN_TICKS"]

_RUN_IDS = itertools.count(1)
MIN_TICKS = 1000  # a sample lasts at least this many ticks of the clock


@dataclass(frozen=True)
class Timing:
    """The samples of one variant (seconds per call, or per `per` units when given) and their summary."""

    name: str
    samples: tuple[float, ...]
    run_id: int = 0
    per: str = "call"

    def __post_init__(self):
        if not self.samples:
            raise ValueError(f"Timing {self.name!r} needs at least one sample")
        bad = [x for x in self.samples if not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0)]
        if bad:
            raise ValueError(f"Timing {self.name!r}: samples must be finite positive seconds, got {bad[:3]!r}")

    @property
    def stats(self) -> dict:
        return summary(self.samples)

    @property
    def rounds(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return self.stats["median"]

    @property
    def iqr(self) -> float:
        return self.stats["iqr"]

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def spread(self) -> float:
        """IQR over median: the relative spread of the samples."""
        m = self.median
        return self.iqr / m if m else float("inf")

    def scaled(self, factor: float, per: str) -> "Timing":
        """The same samples multiplied by `factor` (e.g. 1 / tokens, to get seconds per token)."""
        return Timing(self.name, tuple(s * factor for s in self.samples), self.run_id, per)

    def rate(self, units: float) -> float:
        """units per second at the median (e.g. tokens/s when a call produced `units` tokens)."""
        return units / self.median

    @property
    def mean(self) -> float:
        """The mean: what a sample costs on average, tails included (the median ignores them)."""
        return self.stats["mean"]

    def as_dict(self) -> dict:
        """JSON-ready: the samples, their summary and what one sample is."""
        return {"name": self.name, "per": self.per, "samples": list(self.samples), **self.stats}

    def __str__(self) -> str:
        s = self.stats
        return (f"{self.name}: median {_fmt(s['median'])} per {self.per} (IQR {_fmt(s['q1'])}–{_fmt(s['q3'])}, "
                f"mean {_fmt(s['mean'])}, min {_fmt(s['min'])}, max {_fmt(s['max'])}, {s['n']} rounds)")


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def machine_state(cpu: bool = True) -> dict:
    """The load average (1, 5, 15 min), the cores, whether the machine is busy (1-minute load above the cores) and,
    with `cpu`, the CPU record (needs torch)."""
    try:
        load = list(os.getloadavg())
    except (OSError, AttributeError):  # not on every platform
        load = None
    cores = os.cpu_count() or 1
    out = {"loadavg": load, "cores": cores, "busy": bool(load and load[0] > cores)}
    if cpu:
        from labkit.measure.cpu import cpu_info

        out["cpu"] = cpu_info()
    return out


@dataclass
class Run:
    """What `run` returns: a Timing per variant (index it by name) and the machine's state around the run."""

    timings: dict[str, Timing]
    warmup: int
    machine: dict = field(default_factory=dict)
    order: list = field(default_factory=list)  # the variants' order in each timed round
    loops: dict = field(default_factory=dict)  # calls per sample of each variant (1 unless calibrated)

    @classmethod
    def from_samples(cls, samples: dict, warmup: int = 0, machine: dict | None = None, unit: str = "call", *,
                     paired: bool = True) -> "Run":
        """A Run of samples timed elsewhere (e.g. inside worker processes). `paired=True` says the rounds alternated
        the variants (sample i of each in round i): they share a fresh run id and `compare` pairs them round by round;
        `paired=False` gives each its own id (separate runs, compared unpaired)."""
        if paired and len({len(s) for s in samples.values()}) > 1:
            raise ValueError("samples of a paired run must have one sample per variant in each round, got lengths "
                             f"{ {n: len(s) for n, s in samples.items()} }; pass paired=False for separate runs")
        if paired:
            rid = next(_RUN_IDS)
            return cls({n: Timing(n, tuple(s), rid, unit) for n, s in samples.items()}, warmup, dict(machine or {}))
        return cls({n: Timing(n, tuple(s), next(_RUN_IDS), unit) for n, s in samples.items()}, warmup,
                   dict(machine or {}))

    @classmethod
    def from_dict(cls, d: dict) -> "Run":
        """The Run `as_dict` wrote, its pairing kept: paired rounds share a fresh run id again."""
        if not isinstance(d, dict) or "variants" not in d:
            raise ValueError(f"d must be a dict written by Run.as_dict (with 'variants'), got {str(d)[:80]!r}")
        if "paired" not in d:
            raise ValueError("d does not say whether its rounds were paired (written before Run.as_dict kept it); "
                             "use Run.from_samples(..., paired=True or False) and say which")
        v = d["variants"]
        units = {x.get("per", "call") for x in v.values()}
        run = cls.from_samples({n: x["samples"] for n, x in v.items()}, d.get("warmup", 0), d.get("machine"),
                               unit=units.pop() if len(units) == 1 else "call", paired=bool(d["paired"]))
        run.order, run.loops = list(d.get("order", [])), dict(d.get("loops", {}))
        return run

    def __getitem__(self, name: str) -> Timing:
        return self.timings[name]

    def __iter__(self):
        return iter(self.timings)

    def __len__(self) -> int:
        return len(self.timings)

    def items(self):
        return self.timings.items()

    def medians(self) -> dict[str, float]:
        return {n: t.median for n, t in self.timings.items()}

    @property
    def paired(self) -> bool:
        """Whether every variant was timed in the same rounds (one shared run id)."""
        ids = {t.run_id for t in self.timings.values()}
        return len(ids) == 1 and 0 not in ids

    def as_dict(self) -> dict:
        """JSON-ready: every variant's samples and summary, the warm-up, the machine's state, whether the rounds were
        paired, their order and the loops per sample (`from_dict` reads it back)."""
        return {"variants": {n: t.as_dict() for n, t in self.timings.items()}, "warmup": self.warmup,
                "rounds": min(t.rounds for t in self.timings.values()), "machine": self.machine,
                "paired": self.paired, "order": self.order, "loops": self.loops}

    def __str__(self) -> str:
        return "\n".join(str(t) for t in self.timings.values())


def calibrate_loops(fn: Callable[[], object], clock: Clock = now, tick: float | None = None,
                    min_ticks: int = MIN_TICKS) -> int:
    """Calls per sample so that one sample lasts at least `min_ticks` ticks of `clock` (doubling, as timeit's
    autorange). `tick`: the clock's resolution (`time.get_clock_info('perf_counter')` for the lab's clock)."""
    tick = _tick(clock, tick)
    loops = 1
    while True:
        start = clock()
        for _ in range(loops):
            fn()
        if clock() - start >= min_ticks * tick:
            return loops
        if loops >= 1 << 24:
            raise ValueError(f"{1 << 24} calls took under {min_ticks} ticks of the clock ({tick:.3g} s each): the "
                             "callable does no measurable work (or the clock does not advance); time more work per call")
        loops *= 2


def _tick(clock: Clock, tick: float | None) -> float:
    if tick is not None:
        checks.positive("tick", tick, why="the clock's resolution in seconds")
        return float(tick)
    return time.get_clock_info("perf_counter").resolution if clock is now else 1e-9


def run(fns: dict[str, Callable[[], object]], rounds: int = 5, warmup: int = 1, *, per: float = 1.0,
        unit: str = "call", clock: Clock = now, machine: bool = True, setup: Callable[[str], object] | None = None,
        progress: Callable[[int, int], object] | None = None, seed: int = 0, tick: float | None = None,
        loops: int | None = None) -> Run:
    """Time each zero-argument callable `rounds` times, interleaved in a fresh random order each round (`seed`),
    after `warmup` untimed rounds.

    `per`: the units of work one call does (e.g. 16 tokens): samples are seconds per unit and `unit`
    names it. `setup(name)`, when given, runs before each call of variant `name`, untimed (e.g. to
    refill a cache). `machine=False` leaves out the CPU record (it imports torch). `progress(done,
    total)` is called after each round. `loops`: calls per sample (None: calibrated so a sample lasts
    `MIN_TICKS` ticks of `tick`, the clock's resolution; see the module docstring). Returns a `Run`.
    """
    if not isinstance(fns, dict) or not fns:
        raise ValueError(f"fns must be a non-empty dict of name -> zero-argument callable, got {fns!r}")
    for name, fn in fns.items():
        if not callable(fn):
            raise ValueError(f"fns[{name!r}] must be callable, got {fn!r}")
    checks.positive_int("rounds", rounds)
    checks.integer("warmup", warmup, 0)
    checks.positive("per", per, why="units of work per call")
    checks.integer("seed", seed)
    if loops is not None:
        checks.positive_int("loops", loops)
        if loops > 1 and setup is not None:
            raise ValueError(f"loops={loops} with a setup: the setup runs once per sample, not once per call, so the "
                             "calls after the first would not be set up; use loops=1 or time more work per call")
    names = list(fns)
    state = machine_state(cpu=machine)
    rng = random.Random(seed)
    n_loops = {n: loops or 1 for n in names}
    samples: dict[str, list[float]] = {n: [] for n in names}
    order: list = []
    for r in range(warmup + rounds):
        this = names[:]
        rng.shuffle(this)
        for name in this:
            if setup is not None:
                setup(name)
            start = clock()
            for _ in range(n_loops[name]):
                fns[name]()
            elapsed = clock() - start
            if r == 0 and loops is None and elapsed < MIN_TICKS * _tick(clock, tick):
                if setup is not None:
                    raise ValueError(f"fns[{name!r}] took {elapsed:.3g} s, under {MIN_TICKS} ticks of the clock, and "
                                     "a variant with a setup cannot be timed in loops: time more work per call")
                n_loops[name] = calibrate_loops(fns[name], clock, tick)
                start = clock()  # this round's sample again, at the calibrated loops
                for _ in range(n_loops[name]):
                    fns[name]()
                elapsed = clock() - start
            if r >= warmup:
                samples[name].append(elapsed / per / n_loops[name])
        if r >= warmup:
            order.append(this)
        if progress is not None and r >= warmup:
            progress(r - warmup + 1, rounds)
    state["loadavg_after"] = machine_state(cpu=False)["loadavg"]
    rid = next(_RUN_IDS)
    return Run({n: Timing(n, tuple(s), rid, unit) for n, s in samples.items()}, warmup, state, order, n_loops)
