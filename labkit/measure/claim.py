"""`claim`: a seed's, a paper's or a target's claim checked against a measured value, with the band it used.

    >>> print(claim("int4 is at most half the bytes", 0.31, high=0.5, exact=True, source="chapter 06"))
    int4 is at most half the bytes: holds (0.31, an exact value, in the band ≤ 0.5; chapter 06)
    >>> claim("decode is 1.5x faster", 1.4, interval=(1.2, 1.7), low=1.5).verdict
    'inconclusive'

The rule: the claim's band is [low, high] (either end may be open). A value with an interval
(a measurement: a `Comparison`'s speed-up or any (low, high) the caller measured) **holds** when
the whole interval lies in the band, **fails** when none of it does, and is **inconclusive**
otherwise: the measurement cannot tell. A value without an interval must be declared exact
(`exact=True`: a byte count, a token count, a modelled value): it holds or fails by where it lies.
A measured value given without its interval is refused, never judged as if it were exact.

**Selection.** The best of N measured candidates carries a winner's curse: its own interval
overstates it. `selected_from=N` says the value was picked as the best of N: a `Comparison` is
judged on its interval widened to the per-look confidence 1 - alpha / (looks x N) (Bonferroni over
the looks and the candidates); a
bare interval cannot be widened, so it may fail but not hold ("inconclusive: the best of N,
confirm it on fresh rounds"). A chapter prints these objects; it does not compute holds / fails
inline.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from labkit import checks
from labkit.measure.compare import Comparison

__all__ = ["claim", "Claim", "CLAIM_VERDICTS"]

CLAIM_VERDICTS = ("holds", "fails", "inconclusive")


@dataclass(frozen=True)
class Claim:
    name: str
    value: float
    low: float | None
    high: float | None
    interval: tuple[float, float] | None
    verdict: str
    source: str = ""
    why: str = ""

    @property
    def band(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.low:g} – {self.high:g}"
        return f"≥ {self.low:g}" if self.low is not None else f"≤ {self.high:g}"

    def as_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "low": self.low, "high": self.high,
                "interval": list(self.interval) if self.interval else None, "verdict": self.verdict,
                "source": self.source, "why": self.why}

    def __str__(self) -> str:
        measured = (f"{self.value:.3g}, interval {self.interval[0]:.3g}–{self.interval[1]:.3g}" if self.interval
                    else f"{self.value:.3g}, an exact value")
        tail = "; ".join(x for x in (self.why, self.source) if x)
        where = "in the band" if self.verdict == "holds" else "against the band"
        return f"{self.name}: {self.verdict} ({measured}, {where} {self.band}" + (f"; {tail})" if tail else ")")

def _number(name: str, v) -> float | None:
    if v is None:
        return None
    if not checks.is_number(v) or math.isnan(v):
        raise ValueError(f"{name} must be a number or None, got {v!r}")
    return float(v)


def claim(name: str, value, *, low: float | None = None, high: float | None = None,
          interval: tuple[float, float] | None = None, exact: bool = False, selected_from: int = 1,
          source: str = "", why: str = "") -> Claim:
    """Check `value` against the band [low, high]: "holds", "fails" or "inconclusive" (rule in the module docstring).

    `value` is a number or a `Comparison` (then its speed-up, b's time / a's, and that speed-up's
    interval are used). `interval`: the measured value's uncertainty; without one, `exact=True` must
    say that the value has none. `selected_from`: how many candidates the value was the best of.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    checks.flag("exact", exact)
    checks.positive_int("selected_from", selected_from)
    selected = ""
    if isinstance(value, Comparison):
        if interval is not None or exact:
            raise ValueError("interval must be None and exact False when value is a Comparison (its own interval "
                             "is used)")
        if selected_from > 1:
            value = value.at_confidence(1 - (1 - value.confidence) / selected_from)
            selected = f"the best of {selected_from}: interval widened to {value.confidence:.1%}"
        value, interval = value.speedup, value.speedup_interval
    elif interval is None and not exact:
        raise ValueError(f"claim {name!r}: a measured value needs its interval (interval=(low, high) or a Comparison);"
                         " pass exact=True only for a count, a size or a modelled value, which has none")
    elif interval is not None and exact:
        raise ValueError("exact must be False when an interval is given")
    value = _number("value", value)
    low, high = _number("low", low), _number("high", high)
    if low is None and high is None:
        raise ValueError("a claim needs a band: give low, high or both")
    if low is not None and high is not None and low > high:
        raise ValueError(f"low must be <= high, got low={low}, high={high}")
    lo_b = -math.inf if low is None else low
    hi_b = math.inf if high is None else high
    if interval is None:
        verdict = "holds" if lo_b <= value <= hi_b else "fails"
    else:
        if not (isinstance(interval, (tuple, list)) and len(interval) == 2):
            raise ValueError(f"interval must be a (low, high) pair, got {interval!r}")
        i_lo, i_hi = float(interval[0]), float(interval[1])
        if math.isnan(i_lo) or math.isnan(i_hi) or i_lo > i_hi:
            raise ValueError(f"interval must be (low, high) with low <= high, got {interval!r}")
        if not i_lo <= value <= i_hi:
            raise ValueError(f"value must lie in its interval, got {value} outside {interval!r}")
        interval = (i_lo, i_hi)
        if lo_b <= i_lo and i_hi <= hi_b and selected_from > 1 and not selected:
            verdict = "inconclusive"
            why = why or f"the best of {selected_from} candidates: its own interval overstates it; confirm it on fresh rounds"
        elif lo_b <= i_lo and i_hi <= hi_b:
            verdict = "holds"
        elif i_hi < lo_b or i_lo > hi_b:
            verdict = "fails"
        else:
            verdict = "inconclusive"
            why = why or ("too few rounds for an interval" if math.isinf(i_hi - i_lo) or i_lo <= 0 and i_hi == math.inf
                          else "the measured interval straddles the band's edge")
    why = "; ".join(x for x in (why, selected) if x)
    return Claim(name, value, low, high, interval, verdict, source, why)
