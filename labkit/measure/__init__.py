"""labkit.measure: the one way the lab times, compares and judges.

    >>> from labkit import measure
    >>> r = measure.run({"a": f, "b": g}, rounds=10)              # doctest: +SKIP
    >>> c = measure.compare(r["a"], r["b"], margin=0.03)            # doctest: +SKIP
    >>> print(c); c.verdict                                          # doctest: +SKIP
    >>> print(measure.claim("the seed's 2x", c, low=2.0))           # doctest: +SKIP

* `run` times variants interleaved round by round and keeps every sample (`Timing`: median,
  IQR, min, max) with the machine's state around the run.
* `compare` gives a ratio with a distribution-free interval and a verdict ("faster", "slower",
  "same within margin", "inconclusive") from the rule in `labkit.measure.compare`; it measures
  more rounds, up to a cap, before it says "inconclusive".
* `claim` checks a claim's band against a measured value: "holds", "fails" or "inconclusive".
* `split` divides a profiled step into parts and says what the profiler added and missed.
* `timer` and `Stopwatch` time one block, or a piece of work by parts (nothing left out).
* `replicate` and `by_process`: a run over several fresh processes, compared by its process-level medians.
* `rate_difference` and `wilson_interval`: intervals for counted rates (acceptance, success).
* `cpu` records which CPU and instruction sets a figure was measured on.

It sits at the bottom of the lab's layers (it imports no other labkit package), so the engine,
the benches and the chapters all use it.
"""
from labkit.measure.claim import CLAIM_VERDICTS, Claim, claim
from labkit.measure.clock import Stopwatch, Timer, now, timer
from labkit.measure.compare import VERDICTS, Comparison, compare, decide, family
from labkit.measure.replicate import MIN_PROCESSES, at_level, by_process, compare_starts, replicate
from labkit.measure.run import MIN_TICKS, Run, Timing, calibrate_loops, machine_state, run
from labkit.measure.split import Split, split
from labkit.measure.stats import rate_difference, wilson_interval

__all__ = ["run", "Run", "Timing", "machine_state", "compare", "Comparison", "decide", "VERDICTS", "claim", "Claim",
           "CLAIM_VERDICTS", "split", "Split", "timer", "Timer", "Stopwatch", "now", "MIN_TICKS", "calibrate_loops", "family",
           "replicate", "by_process", "at_level", "compare_starts", "MIN_PROCESSES", "rate_difference",
           "wilson_interval"]
