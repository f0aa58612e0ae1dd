"""`run`: time several variants of one piece of work, interleaved round by round, with their spread.

    >>> r = run({"sum": lambda: sum(range(100)), "list": lambda: list(range(100))}, rounds=5, warmup=1)
    >>> sorted(r), r["sum"].rounds
    (['list', 'sum'], 5)

Each round calls every variant once, in an order that rotates from round to round, so drift
in the machine (a turbo clock settling, another process starting) hits all variants alike and
no variant always runs first after another. `warmup` rounds run first, untimed, with the same
calls. Every variant's samples are kept; `Timing` summarises them (median, quartiles, IQR,
min, max) and `Run.machine` records the machine's state around the run: the load average
before and after, and the CPU record (`labkit.measure.cpu.cpu_info`) that stored figures carry.
"""
from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field
from typing import Callable

from labkit import checks
from labkit.measure.clock import Clock, now
from labkit.measure.stats import summary

__all__ = ["run", "Run", "Timing", "machine_state"]

_RUN_IDS = itertools.count(1)


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

    def as_dict(self) -> dict:
        """JSON-ready: the samples, their summary and what one sample is."""
        return {"name": self.name, "per": self.per, "samples": list(self.samples), **self.stats}

    def __str__(self) -> str:
        s = self.stats
        return (f"{self.name}: median {_fmt(s['median'])} per {self.per} (IQR {_fmt(s['q1'])}–{_fmt(s['q3'])}, "
                f"min {_fmt(s['min'])}, max {_fmt(s['max'])}, {s['n']} rounds)")


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def machine_state(cpu: bool = True) -> dict:
    """The load average (1, 5, 15 min) and, with `cpu`, the CPU record (needs torch)."""
    try:
        load = list(os.getloadavg())
    except OSError:  # not on every platform
        load = None
    out = {"loadavg": load}
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

    @classmethod
    def from_samples(cls, samples: dict, warmup: int = 0, machine: dict | None = None, unit: str = "call") -> "Run":
        """A Run of samples timed elsewhere (e.g. inside worker processes), in rounds that alternated the variants:
        they share a fresh run id, so `compare` pairs them round by round."""
        rid = next(_RUN_IDS)
        return cls({n: Timing(n, tuple(s), rid, unit) for n, s in samples.items()}, warmup, dict(machine or {}))

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

    def as_dict(self) -> dict:
        """JSON-ready: every variant's samples and summary, the warm-up, the machine's state."""
        return {"variants": {n: t.as_dict() for n, t in self.timings.items()}, "warmup": self.warmup,
                "rounds": min(t.rounds for t in self.timings.values()), "machine": self.machine}

    def __str__(self) -> str:
        return "\n".join(str(t) for t in self.timings.values())


def run(fns: dict[str, Callable[[], object]], rounds: int = 5, warmup: int = 1, *, per: float = 1.0,
        unit: str = "call", clock: Clock = now, machine: bool = True, setup: Callable[[str], object] | None = None,
        progress: Callable[[int, int], object] | None = None) -> Run:
    """Time each zero-argument callable `rounds` times, interleaved, after `warmup` untimed rounds.

    `per`: the units of work one call does (e.g. 16 tokens): samples are seconds per unit and `unit`
    names it. `setup(name)`, when given, runs before each call of variant `name`, untimed (e.g. to
    refill a cache). `machine=False` leaves out the CPU record (it imports torch). `progress(done,
    total)` is called after each round. Returns a `Run`.
    """
    if not isinstance(fns, dict) or not fns:
        raise ValueError(f"fns must be a non-empty dict of name -> zero-argument callable, got {fns!r}")
    for name, fn in fns.items():
        if not callable(fn):
            raise ValueError(f"fns[{name!r}] must be callable, got {fn!r}")
    checks.positive_int("rounds", rounds)
    checks.integer("warmup", warmup, 0)
    checks.positive("per", per, why="units of work per call")
    names = list(fns)
    state = machine_state(cpu=machine)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if setup is not None:
                setup(name)
            start = clock()
            fns[name]()
            elapsed = clock() - start
            if r >= warmup:
                samples[name].append(elapsed / per)
        if progress is not None and r >= warmup:
            progress(r - warmup + 1, rounds)
    state["loadavg_after"] = machine_state(cpu=False)["loadavg"]
    rid = next(_RUN_IDS)
    return Run({n: Timing(n, tuple(s), rid, unit) for n, s in samples.items()}, warmup, state)
