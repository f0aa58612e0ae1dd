"""`split`: a step's time divided into parts, checked against the step measured without the profiler.

A profiler slows what it watches, and it sees only what passes through its hooks: in torch, an
operator called through the dispatcher records an `aten::` event; a kernel a compiled program
calls directly (inductor's C++ wrapper through the AOTI shim) records none. A split therefore
says three things a bare table of percentages hides:

  * `overhead`: how much slower the profiled step was than the plain one (profiled / plain - 1);
  * `unattributed`: the profiled time no part claimed (the profiled step minus the parts' sum);
  * `unseen`: the names of parts the method cannot see, printed with the table.

Shares are of the profiled step; `scaled_ms` rescales each part to the plain step's time (an
estimate that assumes the profiler slowed every part alike, and is labelled so).

    >>> s = split({"products": 4.0, "other ops": 3.0}, profiled_ms=10.0, plain_ms=8.0)
    >>> round(s.overhead, 2), s.unattributed_ms
    (0.25, 3.0)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from labkit import checks

__all__ = ["split", "Split"]


@dataclass(frozen=True)
class Split:
    parts: dict[str, float]
    profiled_ms: float
    plain_ms: float
    unseen: tuple[str, ...] = field(default_factory=tuple)

    @property
    def overhead(self) -> float:
        return self.profiled_ms / self.plain_ms - 1.0

    @property
    def unattributed_ms(self) -> float:
        return self.profiled_ms - sum(self.parts.values())

    def shares(self) -> dict[str, float]:
        rows = dict(self.parts)
        rows["not attributed"] = self.unattributed_ms
        return {k: v / self.profiled_ms for k, v in rows.items()}

    def scaled_ms(self) -> dict[str, float]:
        return {k: share * self.plain_ms for k, share in self.shares().items()}

    def as_dict(self) -> dict:
        return {"parts_ms": dict(self.parts), "profiled_ms": self.profiled_ms, "plain_ms": self.plain_ms,
                "overhead": self.overhead, "unattributed_ms": self.unattributed_ms, "unseen": list(self.unseen)}

    def larger(self, a: str, b: str) -> str | None:
        """The larger of parts `a` and `b` ("not attributed" allowed), or None when they differ by less than the
        time the profiler added (|profiled - plain|): a profile cannot rank parts closer than its own cost."""
        ms = {**self.parts, "not attributed": self.unattributed_ms}
        if a not in ms or b not in ms:
            raise ValueError(f"a and b must be parts of this split ({sorted(ms)}), got {a!r} and {b!r}")
        if abs(ms[a] - ms[b]) <= abs(self.profiled_ms - self.plain_ms):
            return None
        return a if ms[a] > ms[b] else b

    def table(self) -> str:
        lines = [f"{'part':34s} {'ms (profiled)':>13s} {'share':>7s}"]
        for k, share in self.shares().items():
            ms = self.parts.get(k, self.unattributed_ms)
            lines.append(f"{k:34s} {ms:13.2f} {share:7.1%}")
        lines.append(f"the profiled step took {self.profiled_ms:.2f} ms, the same step without the profiler "
                     f"{self.plain_ms:.2f} ms: the profiler added {self.overhead:+.0%}")
        if self.unseen:
            lines.append("this profile cannot see: " + "; ".join(self.unseen))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def split(parts: dict[str, float], profiled_ms: float, plain_ms: float, unseen=(), tolerance: float = 0.02) -> Split:
    """A `Split` of a profiled step into `parts` (ms each), checked: the parts may not add up to more than the step.

    `tolerance`: the relative excess allowed for the profiler's rounding; beyond it the parts
    overlap (a nested event counted twice) and a `ValueError` says so.
    """
    if not isinstance(parts, dict) or not parts:
        raise ValueError(f"parts must be a non-empty dict of name -> ms, got {parts!r}")
    for name, v in (("profiled_ms", profiled_ms), ("plain_ms", plain_ms)):
        checks.positive(name, v)
    for k, v in parts.items():
        checks.number(f"parts[{k!r}]", v, 0, why="ms")
    if isinstance(unseen, str):
        unseen = (unseen,)
    total = sum(parts.values())
    if total > profiled_ms * (1 + tolerance):
        raise ValueError(f"the parts add up to {total:.3f} ms, more than the profiled step's {profiled_ms:.3f} ms: "
                         "they overlap (an event counted inside another?)")
    return Split(dict(parts), float(profiled_ms), float(plain_ms), tuple(unseen))
