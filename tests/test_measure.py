"""labkit.measure on synthetic variants: known ratios, injected noise, a fake clock (no sleeping).

What must hold for every verdict the lab prints to mean something:
  * a real difference is never called the wrong way more often than the stated rate;
  * identical variants are never called faster or slower beyond that rate;
  * a pair too noisy to read gets "inconclusive", not a verdict;
  * rounds grow only while undecided, and only up to the cap;
  * the intervals cover the true ratio at least as often as they promise.
"""
from __future__ import annotations

import math
import random

import pytest

from labkit import measure
from labkit.measure.stats import median_interval, shift_interval, sign_test_rank, summary


class FakeClock:
    """A clock that moves only when a synthetic variant 'runs'."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def variant(self, median: float, sigma: float, rng: random.Random, spikes: float = 0.0):
        """A callable that takes `median` seconds times log-normal noise, plus rare 3x spikes (a busy core)."""
        def fn():
            x = median * math.exp(rng.gauss(0.0, sigma))
            if spikes and rng.random() < spikes:
                x *= 3.0
            self.t += x
        return fn


def synthetic_compare(true_ratio, sigma, seed, **kw):
    rng, clock = random.Random(seed), FakeClock()
    a = clock.variant(1e-3 * true_ratio, sigma, rng, kw.pop("spikes", 0.0))
    b = clock.variant(1e-3, sigma, rng)
    return measure.compare(a, b, clock=clock, **kw)


def test_run_interleaves_keeps_samples_and_records_the_machine():
    order = []
    r = measure.run({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, rounds=4, warmup=1, machine=False,
                    loops=1)
    rounds = [order[i:i + 2] for i in range(0, 10, 2)]
    assert all(sorted(x) == ["a", "b"] for x in rounds)  # every variant once a round
    assert r.order == rounds[1:]  # the timed rounds' order is recorded
    again = measure.run({"a": lambda: None, "b": lambda: None}, rounds=4, warmup=1, machine=False, loops=1)
    assert again.order == r.order  # seeded: the same orders again
    assert r["a"].rounds == r["b"].rounds == 4 and len(r["a"].samples) == 4
    assert r.machine["loadavg"] is None or len(r.machine["loadavg"]) == 3
    assert "loadavg_after" in r.machine
    d = r.as_dict()
    assert set(d["variants"]["a"]) >= {"samples", "median", "iqr", "min", "max"}


def test_run_per_unit_and_setup_untimed():
    clock = FakeClock()
    def setup(name):
        clock.t += 100.0  # an expensive setup must not enter the samples
    def fn():
        clock.t += 0.016
    r = measure.run({"x": fn}, rounds=3, warmup=0, per=16, unit="token", clock=clock, setup=setup, machine=False)
    assert r["x"].samples == pytest.approx((0.001,) * 3)
    assert r["x"].per == "token"


@pytest.mark.parametrize("true_ratio", [0.8, 0.9, 1.12, 1.3])
def test_compare_never_gets_the_direction_wrong_beyond_its_rate(true_ratio):
    trials, wrong, right = 300, 0, 0
    wrong_word = "slower" if true_ratio < 1 else "faster"
    right_word = "faster" if true_ratio < 1 else "slower"
    for seed in range(trials):
        c = synthetic_compare(true_ratio, 0.15, seed, margin=0.03, rounds=10, max_rounds=40)
        wrong += c.verdict == wrong_word
        right += c.verdict == right_word
    assert wrong / trials <= 0.025  # alpha / 2 is the stated bound on a wrong direction
    assert right / trials >= 0.5     # and a real 10-30 % difference is mostly found at this noise


def test_identical_variants_are_the_same_or_inconclusive():
    for sigma in (0.02, 0.05, 0.2):
        verdicts = [synthetic_compare(1.0, sigma, seed, margin=0.03).verdict for seed in range(300)]
        wrong = sum(v in ("faster", "slower") for v in verdicts)
        assert wrong / len(verdicts) <= 0.05, sigma
        if sigma == 0.02:  # quiet enough for 40 rounds to pin the ratio inside +-3 %
            assert verdicts.count("same within margin") > len(verdicts) * 0.9


def test_a_noisy_pair_is_inconclusive_not_judged():
    # a 2 % true difference under 40 % noise: no verdict should come out of 40 rounds
    verdicts = [synthetic_compare(1.02, 0.4, seed, margin=0.03, spikes=0.1).verdict for seed in range(100)]
    assert verdicts.count("inconclusive") >= 90
    assert verdicts.count("faster") <= 3


def test_rounds_grow_only_while_undecided_and_only_to_the_cap():
    clear = synthetic_compare(0.5, 0.02, 0, rounds=10, max_rounds=40)
    assert clear.verdict == "faster" and clear.rounds == 10 and clear.looks == 1
    noisy = synthetic_compare(1.0, 0.5, 1, rounds=8, max_rounds=30, margin=0.01)
    assert noisy.verdict == "inconclusive" and noisy.rounds == 30 and noisy.looks == 3  # 8, 16, 30
    assert noisy.confidence == pytest.approx(1 - 0.05 / 3)  # alpha split over the three planned looks
    assert len(noisy.a.samples) == len(noisy.b.samples) == 30


def test_intervals_cover_the_true_ratio_at_their_confidence():
    hits, n = 0, 400
    for seed in range(n):
        c = synthetic_compare(1.25, 0.2, seed, rounds=12, max_rounds=12, margin=0.0)
        hits += c.low <= 1.25 <= c.high
    assert hits / n >= 0.93  # promised 95 %, up to Monte-Carlo error on 400 trials


def test_compare_timings_paired_and_unpaired():
    clock, rng = FakeClock(), random.Random(3)
    r = measure.run({"fast": clock.variant(1e-3, 0.05, rng), "slow": clock.variant(2e-3, 0.05, rng)}, rounds=12,
                    clock=clock, machine=False)
    c = measure.compare(r["fast"], r["slow"])
    assert c.method.startswith("paired") and c.verdict == "faster"
    assert c.speedup == pytest.approx(2.0, rel=0.1) and c.speedup_interval[0] <= c.speedup <= c.speedup_interval[1]
    r2 = measure.run({"slow": clock.variant(2e-3, 0.05, rng)}, rounds=12, clock=clock, machine=False)
    u = measure.compare(r["fast"], r2["slow"])
    assert u.method.startswith("unpaired") and u.verdict == "faster" and u.ratio == pytest.approx(0.5, rel=0.1)
    assert str(c).startswith("fast is faster than slow: ")
    with pytest.raises(ValueError, match="same unit"):
        measure.compare(r["fast"].scaled(0.5, "token"), r["slow"])
    few = measure.compare(measure.Timing("x", (1.0, 2.0), 7), measure.Timing("y", (1.5, 1.1), 7))
    assert few.verdict == "inconclusive" and "too few rounds" in str(few)
    assert measure.claim("x", few, low=1.0).why == "too few rounds for an interval"
    with pytest.raises(ValueError, match="finite positive"):
        measure.Timing("x", (1.0, float("nan")))


def test_compare_refuses_bad_input():
    with pytest.raises(ValueError, match="margin"):
        measure.compare(lambda: 0, lambda: 0, margin=1.5)
    with pytest.raises(ValueError, match="max_rounds"):
        measure.compare(lambda: 0, lambda: 0, rounds=10, max_rounds=5)
    with pytest.raises(ValueError, match="both"):
        measure.compare(lambda: 0, measure.run({"x": lambda: 0}, rounds=1, machine=False)["x"])
    with pytest.raises(ValueError, match="rounds"):
        measure.run({"x": lambda: 0}, rounds=0)
    with pytest.raises(ValueError, match="fns"):
        measure.run({})


def test_an_inconclusive_comparison_prints_no_verdict_word():
    c = synthetic_compare(1.0, 0.5, 1, rounds=8, max_rounds=16, margin=0.01)
    text = str(c)
    assert "inconclusive" in text and " faster than " not in text and " slower than " not in text


def test_decide_rule():
    assert measure.decide(0.99, 1.01, 0.03) == "same within margin"
    assert measure.decide(0.98, 0.99, 0.03) == "same within margin"  # inside the band comes before "faster"
    assert measure.decide(0.90, 0.99, 0.03) == "faster"
    assert measure.decide(1.01, 1.20, 0.03) == "slower"
    assert measure.decide(0.90, 1.10, 0.03) == "inconclusive"


def test_claim_rule():
    assert measure.claim("x", 0.3, high=0.5, exact=True).verdict == "holds"
    assert measure.claim("x", 0.7, high=0.5, exact=True).verdict == "fails"
    assert measure.claim("x", 1.6, interval=(1.55, 1.7), low=1.5).verdict == "holds"
    assert measure.claim("x", 1.4, interval=(1.2, 1.45), low=1.5).verdict == "fails"
    c = measure.claim("x", 1.5, interval=(1.3, 1.7), low=1.5)
    assert c.verdict == "inconclusive" and "straddles" in str(c)
    comp = synthetic_compare(0.5, 0.02, 0)  # a is 2x faster than b
    assert measure.claim("2x", comp, low=1.8).verdict == "holds"
    assert measure.claim("3x", comp, low=3.0).verdict == "fails"
    with pytest.raises(ValueError, match="band"):
        measure.claim("x", 1.0, exact=True)
    with pytest.raises(ValueError, match="low must be <= high"):
        measure.claim("x", 1.0, low=2, high=1, exact=True)


def test_split_checks_parts_against_the_step():
    s = measure.split({"products": 4.0, "other": 3.0}, profiled_ms=10.0, plain_ms=8.0, unseen=("AOTI shim calls",))
    assert s.overhead == pytest.approx(0.25) and s.unattributed_ms == pytest.approx(3.0)
    assert sum(s.shares().values()) == pytest.approx(1.0)
    assert sum(s.scaled_ms().values()) == pytest.approx(8.0)
    assert "+25%" in s.table() and "cannot see: AOTI shim calls" in s.table()
    assert s.larger("products", "other") is None  # 1 ms apart, the profiler added 2 ms: not told apart
    assert s.larger("products", "not attributed") is None
    t = measure.split({"products": 6.0, "other": 1.0}, profiled_ms=8.0, plain_ms=7.5)
    assert t.larger("products", "other") == "products" and t.larger("other", "not attributed") is None
    with pytest.raises(ValueError, match="parts of this split"):
        t.larger("products", "nope")
    with pytest.raises(ValueError, match="overlap"):
        measure.split({"a": 6.0, "b": 6.0}, profiled_ms=10.0, plain_ms=8.0)


def test_stopwatch_accounts_for_the_whole():
    clock = FakeClock()
    sw = measure.Stopwatch(clock)
    with sw.whole():
        with sw.part("draft"):
            clock.t += 1.0
        clock.t += 0.5  # work in no part
        with sw.part("verify"):
            clock.t += 2.0
    assert sw.totals() == {"draft": 1.0, "verify": 2.0}
    assert sw.whole_seconds == 3.5 and sw.untimed() == pytest.approx(0.5)


def test_order_statistic_intervals_against_exact_binomial():
    # n = 5: P(Bin <= 0) = 1/32 = 0.03125 <= 0.05 -> k = 1 at 90 %; nothing at 95 % (0.03125 > 0.025)
    assert sign_test_rank(5, 0.90) == 1 and sign_test_rank(5, 0.95) == 0
    assert median_interval([5, 1, 4, 2, 3], 0.95) == (-math.inf, math.inf)
    # n = 20 at 95 %: the classic k = 6 (P(Bin(20, .5) <= 5) = 0.0207)
    assert sign_test_rank(20, 0.95) == 6
    # Mann-Whitney, n = m = 10 at 95 %: the critical U of tables is 23 -> the 24th smallest difference
    rng = random.Random(5)
    xs, ys = [rng.random() for _ in range(10)], [rng.random() for _ in range(10)]  # continuous: no ties
    est, lo, hi = shift_interval(xs, ys, 0.95)
    diffs = sorted(x - y for x in xs for y in ys)
    assert (lo, hi) == (diffs[23], diffs[100 - 24])
    assert (diffs[22], diffs[100 - 23]) != (lo, hi)
    # the normal approximation (n*m > 2,500) and the exact count agree on the rank at 50 x 50
    from labkit.measure import stats
    xs, ys = [rng.random() for _ in range(50)], [rng.random() for _ in range(51)]
    _, lo_n, hi_n = shift_interval(xs, ys, 0.95)
    counts, total = stats._mann_whitney_counts(50, 51), math.comb(101, 50)
    k, cum = 0, 0
    for u, cnt in enumerate(counts):
        cum += cnt
        if cum / total > 0.025:
            break
        k = u + 1
    d2 = sorted(x - y for x in xs for y in ys)
    assert abs(d2.index(lo_n) + 1 - k) <= 1
    assert summary([1, 2, 3, 4])["iqr"] == pytest.approx(1.5)


def test_no_chapter_reads_the_clock_itself():
    """Every timing in a chapter goes through labkit.measure (its spread, its verdict rule), never a bare clock."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "notebooks"
    found = []
    for nb in sorted(root.glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            src = "".join(cell["source"])
            if cell["cell_type"] == "code" and any(w in src for w in ("perf_counter", "time.time(", "time.monotonic")):
                found.append(f"{nb.name} cell {i}")
    assert found == [], f"time these with labkit.measure: {found}"


def test_labkit_reads_one_clock():
    """Every timing in the library goes through labkit.measure's clock (tests can hand in their own); `time.time()`
    stays for wall-clock timestamps (the OpenAI API's `created`), `time.monotonic()` for deadlines."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "labkit"
    found = [str(p.relative_to(root)) for p in root.rglob("*.py")
             if p.parent.name != "measure" and "perf_counter" in p.read_text()]
    assert found == [], f"read the clock through labkit.measure: {found}"


def test_a_quantile_interval_covers_the_p99_at_its_level_and_says_when_it_cannot():
    """Exponential samples of 500: the true p99 (ln 100) falls outside the 95 % interval at most about 5 % of the time
    (order statistics: a little less), and a 90 % interval misses more often than a 95 % one."""
    import random

    from labkit.measure.stats import quantile_interval

    rng, true = random.Random(3), math.log(100)
    misses = {0.95: 0, 0.8: 0}
    for _ in range(400):
        xs = [rng.expovariate(1.0) for _ in range(500)]
        for conf in misses:
            lo, hi = quantile_interval(xs, 0.99, conf)
            misses[conf] += not lo <= true <= hi
    assert misses[0.95] / 400 <= 0.075 and misses[0.8] > misses[0.95]
    assert misses[0.8] / 400 >= 0.08  # an 80 % interval is not secretly a 95 % one
    assert quantile_interval(range(1, 101), 0.99)[1] == math.inf  # 100 values cannot bound a p99 from above
    assert quantile_interval(range(1, 50), 0.5, 0.9) == median_interval(range(1, 50), 0.9)
    with pytest.raises(ValueError, match="q"):
        quantile_interval([1, 2], 1.0)
