"""Put each defect of issue 60 back into labkit.measure (monkeypatching) and check that a test fails: `python scripts/measure_mutations.py`."""
import importlib, math, random, statistics, sys, traceback
sys.path.insert(0, ".")
import pytest
from labkit import measure
from labkit.measure import stats
cm = importlib.import_module("labkit.measure.compare")
rm = importlib.import_module("labkit.measure.run")
import tests.test_measure as T0
import tests.test_measure_defects as T

class MP:
    def __init__(self): self.undo = []
    def set(self, obj, name, val):
        self.undo.append((obj, name, getattr(obj, name))); setattr(obj, name, val)
    def close(self):
        for obj, name, val in reversed(self.undo): setattr(obj, name, val)

def old_interval(a, b, confidence):
    paired = a.run_id == b.run_id and a.run_id != 0 and a.rounds == b.rounds
    if paired:
        logs = [math.log(x / y) for x, y in zip(a.samples, b.samples)]
        lo, hi = stats.median_interval(logs, confidence)
        return math.exp(statistics.median(logs)), math.exp(lo), math.exp(hi), "paired", ""
    est, lo, hi = stats.shift_interval([math.log(x) for x in a.samples], [math.log(y) for y in b.samples], confidence)
    return math.exp(est), math.exp(lo), math.exp(hi), "unpaired", ""

def never_paired(a, b, confidence):
    est, lo, hi = stats.median_difference_interval([math.log(x) for x in a.samples], [math.log(y) for y in b.samples], confidence)
    return math.exp(est), math.exp(lo), math.exp(hi), "unpaired", ""

def old_looks(rounds, max_rounds, alpha=0.05):
    out, r = [rounds], rounds
    while r < max_rounds:
        r = min(2 * r, max_rounds); out.append(r)
    return out

class Rotating(random.Random):
    k = 0
    def shuffle(self, x):
        s = Rotating.k % len(x); x[:] = x[s:] + x[:s]; Rotating.k += 1

real_mi, real_mdi, real_compare = cm.median_interval, cm.median_difference_interval, cm.compare
looks_seen = []
def so_far_mi(xs, conf):
    looks_seen.append(1); return real_mi(xs, 1 - 0.05 / len(looks_seen))

MUTANTS = {
 "1 unpaired: the shift interval": (lambda m: m.set(cm, "_interval", old_interval), [lambda: T.test_unpaired_interval_holds_its_level_under_unequal_shapes(40)]),
 "2 the per-look level printed": (lambda m: m.set(cm.Comparison, "_label", lambda self: f"{self.confidence:.1%} interval"), [T.test_the_printed_confidence_is_what_the_sequence_covers]),
 "3 'same' without the totals": (lambda m: m.set(cm, "_totals_why", lambda *a: ""), [T.test_a_variant_that_costs_more_in_total_is_never_the_same]),
 "4 no loop calibration": (lambda m: m.set(rm, "calibrate_loops", lambda *a, **k: 1), [T.test_loops_are_calibrated_to_the_clock_so_a_coarse_tick_cannot_fake_same]),
 "5 the old looks and cap": (lambda m: (m.set(cm, "_looks", old_looks), m.set(cm.compare, "__kwdefaults__", {**cm.compare.__kwdefaults__, "max_rounds": 40})), [T.test_same_within_margin_is_reachable_at_the_defaults, T.test_only_looks_that_can_decide_are_planned]),
 "6 rotation": (lambda m: m.set(rm.random, "Random", Rotating), [T.test_carry_over_from_one_variant_does_not_bias_the_others]),
 "7 load ignored": (lambda m: m.set(cm.Comparison, "busy", property(lambda self: False)), [lambda: T.test_a_verdict_on_a_busy_machine_says_so(pytest.MonkeyPatch())]),
 "8 pairing lost on save": (lambda m: m.set(rm.Run, "as_dict", lambda self: {"variants": {n: t.as_dict() for n, t in self.timings.items()}, "warmup": 0, "paired": True}), [T.test_pairing_survives_saving_and_loading]),
 "9a 90 % labelled 95 %": (lambda m: m.set(cm, "median_interval", lambda xs, c: real_mi(xs, c - 0.05)), [T.test_a_paired_interval_covers_at_its_stated_level]),
 "9b unpaired at 90 %": (lambda m: m.set(cm, "median_difference_interval", lambda a, b, c: real_mdi(a, b, c - 0.05)), [T.test_unpaired_interval_covers_at_its_level_with_equal_shapes]),
 "9d rounds unpaired": (lambda m: m.set(cm, "_interval", never_paired), [T.test_pairing_decides_under_drift_where_unpaired_cannot]),
 "9e no equivalence test in 'same'": (lambda m: m.set(cm, "decide", lambda lo, hi, mg: "faster" if hi < 1 else "slower" if lo > 1 else "same within margin"), [T0.test_a_noisy_pair_is_inconclusive_not_judged]),
 "9f alpha over the looks so far": (None, [lambda: T.test_every_look_uses_alpha_over_all_planned_looks(pytest.MonkeyPatch())]),
}
import inspect
def so_far(m):
    src = inspect.getsource(real_compare).replace("_interval(ta, tb, confidence)", "_interval(ta, tb, 1 - alpha / look)")
    assert "1 - alpha / look" in src
    ns = dict(cm.__dict__); exec(src, ns)
    m.set(cm, "compare", ns["compare"]); m.set(measure, "compare", ns["compare"])
MUTANTS["9f alpha over the looks so far"] = (so_far, MUTANTS["9f alpha over the looks so far"][1])
cm_looks_orig = cm._looks

def alpha_ignored(m):
    def ignoring(a, b, margin=0.03, **kw):
        kw.pop("alpha", None)
        return real_compare(a, b, margin, **kw)
    m.set(cm, "compare", ignoring); m.set(measure, "compare", ignoring)
MUTANTS["9c alpha ignored"] = (alpha_ignored, [T.test_alpha_is_used])
real_holm = stats.holm
MUTANTS["10 a family read without Holm"] = (
    lambda m: m.set(cm, "holm", lambda ps, alpha=0.05: [p <= alpha for p in ps]),
    [T.test_a_family_of_comparisons_keeps_its_error_rate])

ok = True
for name, (apply, tests) in MUTANTS.items():
    m = MP(); apply(m)
    caught = []
    for t in tests:
        try:
            t(); caught.append(False)
        except (AssertionError, ValueError, Exception) as exc:
            caught.append(type(exc).__name__)
    m.close()
    status = "caught" if any(caught) else "NOT CAUGHT"
    ok &= any(caught)
    print(f"{name:36s} {status} {caught}")
print("every defect caught" if ok else "SOME DEFECT NOT CAUGHT")
