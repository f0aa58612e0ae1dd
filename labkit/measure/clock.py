"""The lab's one clock, and the two ways to read it: a whole piece of work, or its parts.

    >>> with timer() as t:
    ...     _ = sum(range(1000))
    >>> t.seconds > 0
    True
    >>> sw = Stopwatch()
    >>> with sw.part("draft"):
    ...     pass
    >>> sorted(sw.totals())
    ['draft']

Everything in labkit that times something reads `now()` (through these or through `run`), so a
test can hand in a clock of its own (`clock=` on `run` and `compare`) and check the statistics
on synthetic times, without sleeping.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable

__all__ = ["now", "timer", "Timer", "Stopwatch"]

Clock = Callable[[], float]


def now() -> float:
    """Seconds on a monotonic clock of the highest resolution (for differences only)."""
    return time.perf_counter()


class Timer:
    """The seconds one `with timer():` block took (`seconds` is set when the block ends)."""

    def __init__(self, clock: Clock = now):
        self.clock, self.start, self.seconds = clock, None, None

    def __enter__(self) -> "Timer":
        self.start = self.clock()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = self.clock() - self.start

    @property
    def ms(self) -> float:
        return 1e3 * self.seconds


def timer(clock: Clock = now) -> Timer:
    """A context manager that times its block: `with timer() as t: work(); t.seconds`."""
    return Timer(clock)


class Stopwatch:
    """Totals by part of a piece of work timed in parts (drafting, scheduling, the pass, verification, ...).

    `whole()` times the enclosing work; `totals()` gives each part's seconds and `untimed()`
    what the whole took beyond its parts, so that a split can show that nothing was left out.
    """

    def __init__(self, clock: Clock = now):
        self.clock = clock
        self._parts: dict[str, float] = {}
        self._whole = 0.0

    @contextlib.contextmanager
    def part(self, name: str):
        start = self.clock()
        try:
            yield
        finally:
            self._parts[name] = self._parts.get(name, 0.0) + self.clock() - start

    @contextlib.contextmanager
    def whole(self):
        start = self.clock()
        try:
            yield
        finally:
            self._whole += self.clock() - start

    def add(self, name: str, seconds: float) -> None:
        self._parts[name] = self._parts.get(name, 0.0) + seconds

    def totals(self) -> dict[str, float]:
        return dict(self._parts)

    @property
    def whole_seconds(self) -> float:
        return self._whole

    def untimed(self) -> float:
        """Seconds of the whole not inside any part (0 when no whole was timed)."""
        return max(0.0, self._whole - sum(self._parts.values())) if self._whole else 0.0

    def reset(self) -> None:
        self._parts.clear()
        self._whole = 0.0
