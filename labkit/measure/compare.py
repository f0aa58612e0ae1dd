"""`compare`: how variant a's time compares with b's, with an interval and a verdict from a stated rule.

    >>> c = compare(lambda: sum(range(20_000)), lambda: sum(range(20_000)), names=("a", "b"), margin=0.5)
    >>> c.verdict in ("same within margin", "inconclusive")
    True

The rule (every verdict the lab prints about "faster" or "slower" comes from it):

1. **The ratio.** Paired samples (a and b timed in the same rounds of one `run`): `ratio` is the
   median over rounds of a's time / b's time in that round, with the sign-test interval of that
   median: distribution-free, it holds whatever the noise looks like, as long as rounds are
   independent. Unpaired samples (separate runs): `ratio` is exp(median(log a) - median(log b))
   (median(a) / median(b) when the counts are odd), with the Bonett-Price interval of the difference of log medians (`stats.median_difference_interval`),
   which holds when a and b differ in shape (a tight against a spiky variant), where the
   Hodges-Lehmann / Mann-Whitney interval misses about 10 % at a nominal 5 %. It is approximate:
   every unpaired verdict says "unpaired", and pairing (one `run`) is the better design.
   The median answers "what does a typical call cost"; `ratio_of_means` (a's total time / b's)
   answers "what does the work cost", tails included, and is printed beside it.
2. **The looks.** Given callables, `compare` times `rounds` rounds, and while the verdict is
   "inconclusive" doubles the rounds, up to `max_rounds`. Only looks with enough rounds to decide
   anything are planned (a sign-test interval needs 6 paired rounds at 95 %), and a last look that
   would add less than half the rounds is merged into the one before. The error rate `alpha` is
   split evenly over the planned looks (Bonferroni): each look's interval has confidence
   1 - alpha / looks, so over the whole sequence the chance that the reported interval misses
   the true ratio is at most alpha, and that of a wrong direction at most alpha / 2. The
   confidence printed is that family level, 1 - alpha (`family_confidence`), with the per-look
   level beside it: after optional stopping the last look's interval covers less than its
   per-look level promises, but the family level holds.
3. **The verdict**, from the last look's interval [low, high] of a / b:
   "same within margin" when 1 / (1 + margin) <= low and high <= 1 + margin, **and** the
   interval of the ratio of totals (`totals_interval`, a seeded bootstrap over the rounds) lies
   in that band too (a variant 3x slower on every tenth call costs 20 % more in total while its
   typical call is the same: that is not "the same");
   otherwise "faster" when high < 1, "slower" when low > 1;
   otherwise "inconclusive" (the interval holds 1 and is wider than the margin): a run too
   noisy to read gets no verdict, and says how many rounds it took.
4. **The machine.** A comparison measured on a busy machine (load above its cores before the
   run; `Run.machine["busy"]`) says so beside its verdict.
"""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Callable, Union

from labkit import checks
from labkit.measure.clock import Clock, now
from labkit.measure.run import Timing, run
from labkit.measure.stats import holm, median_difference_interval, median_interval, sign_test_p, sign_test_rank

__all__ = ["compare", "Comparison", "decide", "VERDICTS", "family", "totals_interval"]

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
    family_confidence: float | None = None  # 1 - alpha over every planned look (None: one look, = confidence)
    planned: int = 1  # the looks planned before the first round
    why: str = ""  # why a verdict was withheld beyond the interval (unequal shapes, totals that differ)
    machine: dict | None = None

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
    def ratio_of_means(self) -> float:
        """a's mean time / b's: what the work costs in total, tails included (paired: a's total / b's total)."""
        return self.a.mean / self.b.mean

    @property
    def busy(self) -> bool:
        return bool(self.machine and self.machine.get("busy"))

    def at_confidence(self, confidence: float) -> "Comparison":
        """The same samples with the last look's interval and verdict at another per-look confidence (e.g.
        1 - (1 - confidence) / N for the best of N candidates: a Bonferroni-widened interval, since the winner's own
        interval overstates it). The planned looks are kept: the family level is 1 - (1 - confidence) x looks."""
        checks.probability("confidence", confidence, low_open=True, high_open=True)
        ratio, lo, hi, method, why = _interval(self.a, self.b, confidence)
        why = why or _totals_why(lo, hi, self.margin, self.a, self.b)
        return Comparison(self.a, self.b, ratio, lo, hi, _verdict(lo, hi, self.margin, self.a, self.b, why),
                          self.margin, confidence, self.rounds, self.looks, method,
                          max(0.0, 1 - (1 - confidence) * self.planned), self.planned, why, self.machine)

    @property
    def decided(self) -> bool:
        return self.verdict != "inconclusive"

    def as_dict(self) -> dict:
        return {"a": self.a.as_dict(), "b": self.b.as_dict(), "ratio": self.ratio, "low": self.low, "high": self.high,
                "ratio_of_medians": self.ratio_of_medians, "ratio_of_means": self.ratio_of_means,
                "verdict": self.verdict, "margin": self.margin, "confidence": self.confidence,
                "family_confidence": self.family, "planned_looks": self.planned, "rounds": self.rounds,
                "looks": self.looks, "method": self.method, "why": self.why, "busy": self.busy}

    @property
    def family(self) -> float:
        """The confidence the reported interval carries over the whole sequence of looks."""
        return self.confidence if self.family_confidence is None else self.family_confidence

    def _label(self) -> str:
        if self.planned > 1:
            return f"{self.family:.0%} interval over {self.planned} planned looks, {self.confidence:.1%} each"
        return f"{self.confidence:.1%} interval"

    def __str__(self) -> str:
        lo, hi = self.speedup_interval
        interval = (f"{self._label()} {lo:.2f}–{hi:.2f}×" if math.isfinite(hi) and lo > 0 else
                    f"no {self._label()}: too few rounds")
        where = f"{self.speedup:.2f}× the speed of {self.b.name} ({interval}, {self.rounds} rounds)"
        means = 1 / self.ratio_of_means
        if math.isfinite(hi) and lo > 0 and not lo <= means <= hi:
            where += f"; in total time {means:.2f}×: the tails differ"
        if self.method.startswith("unpaired"):
            where += "; unpaired (separate runs)"
        if self.busy:
            load = (self.machine.get("loadavg") or [float("nan")])[0]
            where += f"; measured on a busy machine (load {load:.1f} on {self.machine.get('cores')} cores)"
        if self.verdict == "inconclusive" and not (math.isfinite(hi) and lo > 0):
            return f"{self.a.name} vs {self.b.name}: inconclusive: {where}"
        if self.verdict == "inconclusive":
            return f"{self.a.name} vs {self.b.name}: inconclusive: {where}; " + (
                self.why or f"the interval holds 1 and is wider than ±{self.margin:.0%}")
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


def _interval(a: Timing, b: Timing, confidence: float) -> tuple[float, float, float, str, str]:
    """(ratio, low, high, method, why a verdict is withheld or "")."""
    paired = a.run_id == b.run_id and a.run_id != 0 and a.rounds == b.rounds
    if paired:
        logs = [math.log(x / y) for x, y in zip(a.samples, b.samples)]
        lo, hi = median_interval(logs, confidence)
        return math.exp(statistics.median(logs)), math.exp(lo), math.exp(hi), "paired rounds: sign-test interval", ""
    est, lo, hi = median_difference_interval([math.log(x) for x in a.samples], [math.log(y) for y in b.samples],
                                             confidence)
    return math.exp(est), math.exp(lo), math.exp(hi), "unpaired: ratio of medians, Bonett-Price interval", ""


def totals_interval(a: Timing, b: Timing, confidence: float = 0.95, resamples: int = 1000) -> tuple[float, float]:
    """A bootstrap interval (percentile, seeded: the same samples give the same interval) of a's total time / b's:
    rounds resampled together when a and b are paired, each side on its own otherwise."""
    rng = random.Random(0)
    xa, xb = list(a.samples), list(b.samples)
    paired = a.run_id == b.run_id and a.run_id != 0 and len(xa) == len(xb)
    ratios = []
    for _ in range(resamples):
        if paired:
            idx = [rng.randrange(len(xa)) for _ in xa]
            ratios.append(sum(xa[i] for i in idx) / sum(xb[i] for i in idx))
        else:
            ratios.append(sum(rng.choice(xa) for _ in xa) / len(xa) / (sum(rng.choice(xb) for _ in xb) / len(xb)))
    ratios.sort()
    tail = (1 - confidence) / 2
    return ratios[int(tail * (resamples - 1))], ratios[int(math.ceil((1 - tail) * (resamples - 1)))]


def _totals_why(low: float, high: float, margin: float, a: Timing, b: Timing) -> str:
    if decide(low, high, margin) != "same within margin":
        return ""
    lo, hi = totals_interval(a, b)
    if not (1 / (1 + margin) <= lo and hi <= 1 + margin):
        return (f"the typical call is the same within ±{margin:.0%}, but the total time's interval, {lo:.2f}-{hi:.2f}x "
                f"(a's total / b's, bootstrap), is not inside the band: the tails differ")
    return ""


def _verdict(low: float, high: float, margin: float, a: Timing, b: Timing, why: str) -> str:
    if why or _totals_why(low, high, margin, a, b):
        return "inconclusive"
    return decide(low, high, margin)


def _looks(rounds: int, max_rounds: int, alpha: float = 0.05) -> list[int]:
    """The planned looks: doubling from `rounds` to `max_rounds`, without looks too small to decide anything at their
    level, a last look that adds less than half the rounds merged into the one before."""
    out, r = [rounds], rounds
    while r < max_rounds:
        r = min(2 * r, max_rounds)
        out.append(r)
    if len(out) > 1 and out[-1] < 1.5 * out[-2]:
        out[-2:] = [out[-1]]
    while True:  # drop looks whose rounds cannot give an interval at 1 - alpha / len(looks)
        kept = [n for n in out if sign_test_rank(n, 1 - alpha / len(out)) > 0] or out[-1:]
        if kept == out:
            return out
        out = kept


Variant = Union[Callable[[], object], Timing]


def compare(a: Variant, b: Variant, margin: float = 0.03, *, rounds: int = 10, max_rounds: int = 80, warmup: int = 1,
            alpha: float = 0.05, names: tuple[str, str] = ("a", "b"), per: float = 1.0, unit: str = "call",
            clock: Clock = now, setup: Callable[[str], object] | None = None, machine: bool | dict = False) -> Comparison:
    """Compare a with b: two zero-argument callables (timed here, interleaved) or two `Timing`s of `run`.

    `margin`: the relative difference below which the two count as the same. `rounds`: the first
    look; `max_rounds`: the cap on rounds when the interval is too wide to decide. `alpha`: the
    error rate over all looks. `machine`: with callables, True records the CPU too (the load is always
    recorded); with Timings, the `Run.machine` they came from (a busy machine is then named). See the
    module docstring for the rule.
    """
    checks.probability("margin", margin, high_open=True)
    checks.probability("alpha", alpha, low_open=True, high_open=True)
    if isinstance(a, Timing) or isinstance(b, Timing):
        if not (isinstance(a, Timing) and isinstance(b, Timing)):
            raise ValueError("a and b must both be callables or both be Timings of run(), got one of each")
        if a.per != b.per:
            raise ValueError(f"a and b must be timed in the same unit, got per {a.per!r} and per {b.per!r}")
        ratio, lo, hi, method, why = _interval(a, b, 1 - alpha)
        why = why or _totals_why(lo, hi, margin, a, b)
        return Comparison(a, b, ratio, lo, hi, _verdict(lo, hi, margin, a, b, why), margin, 1 - alpha,
                          min(a.rounds, b.rounds), 1, method, 1 - alpha, 1, why, machine if isinstance(machine, dict)
                          else None)
    if not callable(a) or not callable(b):
        raise ValueError(f"a and b must be zero-argument callables or Timings, got {a!r} and {b!r}")
    checks.positive_int("rounds", rounds)
    checks.positive_int("max_rounds", max_rounds)
    if max_rounds < rounds:
        raise ValueError(f"max_rounds must be >= rounds ({rounds}), got {max_rounds!r}")
    if not (isinstance(names, tuple) and len(names) == 2 and names[0] != names[1]):
        raise ValueError(f"names must be two different names, got {names!r}")
    looks = _looks(rounds, max_rounds, alpha)
    confidence = 1 - alpha / len(looks)
    fns = {names[0]: a, names[1]: b}
    first = run(fns, looks[0], warmup, per=per, unit=unit, clock=clock, setup=setup, machine=bool(machine))
    samples = {n: list(first[n].samples) for n in names}
    rid = first[names[0]].run_id
    done = 0
    for look, target in enumerate(looks, 1):
        more = target - len(samples[names[0]])
        if more > 0:
            extra = run(fns, more, 0, per=per, unit=unit, clock=clock, setup=setup, machine=False, seed=look)
            for n in names:
                samples[n] += extra[n].samples
        ta, tb = (Timing(n, tuple(samples[n]), rid, unit) for n in names)
        ratio, lo, hi, method, why = _interval(ta, tb, confidence)
        why = why or _totals_why(lo, hi, margin, ta, tb)
        verdict = _verdict(lo, hi, margin, ta, tb, why)
        done = look
        if verdict != "inconclusive":
            break
    return Comparison(ta, tb, ratio, lo, hi, verdict, margin, confidence, ta.rounds, done, method, 1 - alpha,
                      len(looks), why, first.machine)


def family(comparisons, alpha: float = 0.05) -> list[str]:
    """The direction each of a family of paired comparisons can claim when the family is read together: "faster",
    "slower" or "inconclusive", by Holm's step-down rule on their exact sign tests (family-wise error <= alpha).

    Reading several comparisons at once (each step down in bytes, every format against a peer) and reporting the
    ones that came out "faster" inflates the error; this keeps it at alpha for the whole family.
    """
    comps = list(comparisons)
    for c in comps:
        if not isinstance(c, Comparison) or not c.method.startswith("paired"):
            raise ValueError(f"comparisons must be paired Comparisons (one run each), got {c!r:.80}")
    if not comps:
        raise ValueError("comparisons must hold at least one paired Comparison, got none")
    # Holm's first step needs one p-value at or below alpha / m: below that many rounds nothing can ever be decided
    floor = min(min(1.0, c.planned * 2.0 ** (1 - c.rounds)) for c in comps)  # the sign test's smallest two-sided p
    if floor > alpha / len(comps):
        need = next(n for n in range(1, 200) if min(1.0, min(c.planned for c in comps) * 2.0 ** (1 - n))
                    <= alpha / len(comps))
        raise ValueError(f"a family of {len(comps)} comparisons at alpha {alpha:g} needs at least {need} rounds each "
                         f"(the sign test's smallest p at {max(c.rounds for c in comps)} rounds is {floor:.3g}, above "
                         f"{alpha / len(comps):.3g}): time more rounds, or read fewer comparisons together")
    logs = [[math.log(x / y) for x, y in zip(c.a.samples, c.b.samples)] for c in comps]
    # a comparison that looked several times carries its p-value times its planned looks (Bonferroni over the looks)
    rejected = holm([min(1.0, c.planned * sign_test_p(lg)) for c, lg in zip(comps, logs)], alpha)
    return [("faster" if sum(x < 0 for x in lg) > sum(x > 0 for x in lg) else "slower") if r else "inconclusive"
            for r, lg in zip(rejected, logs)]
