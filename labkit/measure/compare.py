"""`compare`: how variant a's time compares with b's, with an interval and a verdict from a stated rule.

    >>> c = compare(lambda: sum(range(20_000)), lambda: sum(range(20_000)), names=("a", "b"), margin=0.5)
    >>> c.verdict in ("same within margin", "inconclusive")
    True

The rule (every verdict the lab prints about "faster" or "slower" comes from it):

1. **The ratio.** Paired samples (a and b timed in the same rounds of one `run`): `ratio` is the
   median over rounds of a's time / b's time in that round, with the sign-test interval of that
   median. Unpaired samples: `ratio` is exp of the Hodges-Lehmann shift of log times, with its
   Mann-Whitney interval. Both intervals are distribution-free: they hold whatever the noise
   looks like, as long as rounds are independent. (For multiplicative noise both estimate
   median(a) / median(b); `ratio_of_medians` is printed beside.)
2. **The looks.** Given callables, `compare` times `rounds` rounds, and while the verdict is
   "inconclusive" doubles the rounds, up to `max_rounds`. The error rate `alpha` is split evenly
   over the looks it may take (Bonferroni): each look's interval has confidence
   1 - alpha / looks, so over the whole sequence the chance that the interval misses the true
   ratio is at most alpha, and that of a wrong direction at most alpha / 2.
3. **The verdict**, from the last look's interval [low, high] of a / b:
   "same within margin" when 1 / (1 + margin) <= low and high <= 1 + margin;
   otherwise "faster" when high < 1, "slower" when low > 1;
   otherwise "inconclusive" (the interval holds 1 and is wider than the margin): a run too
   noisy to read gets no verdict, and says how many rounds it took.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Union

from labkit import checks
from labkit.measure.clock import Clock, now
from labkit.measure.run import Timing, run
from labkit.measure.stats import median_interval, shift_interval

__all__ = ["compare", "Comparison", "decide", "VERDICTS"]

VERDICTS = ("faster", "slower", "same within margin", "inconclusive")


@dataclass(frozen=True)
class Comparison:
    """a against b: `ratio` = a's time / b's, its interval [low, high], the verdict and how it was reached."""

    a: Timing
    b: Timing
    ratio: float
    low: float
    high: float
    verdict: str
    margin: float
    confidence: float
    rounds: int
    looks: int
    method: str

    @property
    def speedup(self) -> float:
        """b's time / a's: how many times faster a is (below 1: slower)."""
        return 1.0 / self.ratio

    @property
    def speedup_interval(self) -> tuple[float, float]:
        return (1.0 / self.high if self.high else math.inf, 1.0 / self.low if self.low > 0 else math.inf)

    @property
    def ratio_of_medians(self) -> float:
        return self.a.median / self.b.median

    @property
    def decided(self) -> bool:
        return self.verdict != "inconclusive"

    def as_dict(self) -> dict:
        return {"a": self.a.as_dict(), "b": self.b.as_dict(), "ratio": self.ratio, "low": self.low, "high": self.high,
                "ratio_of_medians": self.ratio_of_medians, "verdict": self.verdict, "margin": self.margin,
                "confidence": self.confidence, "rounds": self.rounds, "looks": self.looks, "method": self.method}

    def __str__(self) -> str:
        lo, hi = self.speedup_interval
        interval = (f"{self.confidence:.1%} interval {lo:.2f}–{hi:.2f}×" if math.isfinite(hi) and lo > 0 else
                    f"no {self.confidence:.1%} interval: too few rounds")
        where = f"{self.speedup:.2f}× the speed of {self.b.name} ({interval}, {self.rounds} rounds)"
        if self.verdict == "inconclusive" and not (math.isfinite(hi) and lo > 0):
            return f"{self.a.name} vs {self.b.name}: inconclusive: {where}"
        if self.verdict == "inconclusive":
            return (f"{self.a.name} vs {self.b.name}: inconclusive: {where}; the interval holds 1 and is wider than "
                    f"±{self.margin:.0%}")
        if self.verdict == "same within margin":
            return f"{self.a.name} vs {self.b.name}: the same within ±{self.margin:.0%}: {where}"
        return f"{self.a.name} is {self.verdict} than {self.b.name}: {where}"


def decide(low: float, high: float, margin: float) -> str:
    """The verdict for an interval [low, high] of a's time / b's (rule 3 of the module docstring)."""
    if 1 / (1 + margin) <= low and high <= 1 + margin:
        return "same within margin"
    if high < 1:
        return "faster"
    if low > 1:
        return "slower"
    return "inconclusive"


def _interval(a: Timing, b: Timing, confidence: float) -> tuple[float, float, float, str]:
    paired = a.run_id == b.run_id and a.run_id != 0 and a.rounds == b.rounds
    if paired:
        logs = [math.log(x / y) for x, y in zip(a.samples, b.samples)]
        lo, hi = median_interval(logs, confidence)
        return math.exp(statistics.median(logs)), math.exp(lo), math.exp(hi), "paired rounds: sign-test interval"
    est, lo, hi = shift_interval([math.log(x) for x in a.samples], [math.log(y) for y in b.samples], confidence)
    return math.exp(est), math.exp(lo), math.exp(hi), "unpaired: Hodges-Lehmann with Mann-Whitney interval"


def _looks(rounds: int, max_rounds: int) -> list[int]:
    out, r = [rounds], rounds
    while r < max_rounds:
        r = min(2 * r, max_rounds)
        out.append(r)
    return out


Variant = Union[Callable[[], object], Timing]


def compare(a: Variant, b: Variant, margin: float = 0.03, *, rounds: int = 10, max_rounds: int = 40, warmup: int = 1,
            alpha: float = 0.05, names: tuple[str, str] = ("a", "b"), per: float = 1.0, unit: str = "call",
            clock: Clock = now, setup: Callable[[str], object] | None = None, machine: bool = False) -> Comparison:
    """Compare a with b: two zero-argument callables (timed here, interleaved) or two `Timing`s of `run`.

    `margin`: the relative difference below which the two count as the same. `rounds`: the first
    look; `max_rounds`: the cap on rounds when the interval is too wide to decide. `alpha`: the
    error rate over all looks. See the module docstring for the rule.
    """
    checks.probability("margin", margin, high_open=True)
    checks.probability("alpha", alpha, low_open=True, high_open=True)
    if isinstance(a, Timing) or isinstance(b, Timing):
        if not (isinstance(a, Timing) and isinstance(b, Timing)):
            raise ValueError("a and b must both be callables or both be Timings of run(), got one of each")
        if a.per != b.per:
            raise ValueError(f"a and b must be timed in the same unit, got per {a.per!r} and per {b.per!r}")
        lo_hi = _interval(a, b, 1 - alpha)
        return Comparison(a, b, lo_hi[0], lo_hi[1], lo_hi[2], decide(lo_hi[1], lo_hi[2], margin), margin, 1 - alpha,
                          min(a.rounds, b.rounds), 1, lo_hi[3])
    if not callable(a) or not callable(b):
        raise ValueError(f"a and b must be zero-argument callables or Timings, got {a!r} and {b!r}")
    checks.positive_int("rounds", rounds)
    checks.positive_int("max_rounds", max_rounds)
    if max_rounds < rounds:
        raise ValueError(f"max_rounds must be >= rounds ({rounds}), got {max_rounds!r}")
    if not (isinstance(names, tuple) and len(names) == 2 and names[0] != names[1]):
        raise ValueError(f"names must be two different names, got {names!r}")
    looks = _looks(rounds, max_rounds)
    confidence = 1 - alpha / len(looks)
    fns = {names[0]: a, names[1]: b}
    first = run(fns, rounds, warmup, per=per, unit=unit, clock=clock, setup=setup, machine=machine)
    samples = {n: list(first[n].samples) for n in names}
    rid = first[names[0]].run_id
    done = 0
    for look, target in enumerate(looks, 1):
        more = target - len(samples[names[0]])
        if more > 0:
            extra = run(fns, more, 0, per=per, unit=unit, clock=clock, setup=setup, machine=False)
            for n in names:
                samples[n] += extra[n].samples
        ta, tb = (Timing(n, tuple(samples[n]), rid, unit) for n in names)
        ratio, lo, hi, method = _interval(ta, tb, confidence)
        verdict = decide(lo, hi, margin)
        done = look
        if verdict != "inconclusive":
            break
    return Comparison(ta, tb, ratio, lo, hi, verdict, margin, confidence, ta.rounds, done, method)
