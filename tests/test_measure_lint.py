"""One way to judge: no verdict word computed inline, no hand-made median of timings, anywhere but labkit.measure.

CONTRIBUTING.md: every timing goes through `labkit.measure`; a verdict word (faster, slower, holds,
fails, met) is printed from its objects (`compare`, `claim`), never computed inline. These tests
read the library, the benches and every chapter's code cells and fail naming the place.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = r"(holds|hold|fails|faster|slower|met|NOT met|inconclusive|lossless|halved)"
# a string with a verdict word chosen by a conditional expression: "'faster' if x < y else ..." / "... else 'fails'"
INLINE = re.compile(r"""(["'])[^"'\n]*\b""" + WORDS + r"""\b[^"'\n]*\1[ \t]*\)?[ \t]+if\b|\belse\s+\(?\s*f?(["'])[^"'\n]*\b"""
                    + WORDS + r"""\b""")
# the places a verdict word is legitimately chosen: the rule itself, and exercise checkers' messages to the learner
VERDICT_ALLOWED = {
    "labkit/measure/claim.py": "the claim rule itself",
    "labkit/measure/compare.py": "the compare rule itself",
    "labkit/exercises/prefill_decode.py": "a checker's message ('does not hold'), not a measurement's verdict",
    "labkit/exercises/quantization.py": "a checker's message ('does not hold'), not a measurement's verdict",
    "labkit/quant/sweep.py": "seed_verdict: measure.claim's rule on the seeds' range (holds when all seeds are within); "
                             "to be routed through claim when labkit/quant next changes (it is in every stored file's "
                             "code record)",
}
MEDIAN = re.compile(r"\b(statistics\.median|np\.median)\(")
CLOCK = re.compile(r"clock_now|measure\.clock|from labkit\.measure\.clock import|measure\.timer\(|Stopwatch")
# modules that read the clock and take medians themselves, each with why; a new one fails the test
MEDIAN_ALLOWED = {
    "labkit/measure/compare.py": "the core",
    "labkit/benchmarks/serving_live.py": "p50/p99 of a load test's latencies: serving metrics, descriptive",
    "labkit/benchmarks/smollm2.py": "rates from samples, then measure.compare for the verdict; roofline medians",
    "labkit/serving/studies/parallel.py": "steps of a two-process run timed in sequence (each follows the last): "
                                          "descriptive medians, printed without a verdict",
    "labkit/serving/studies/sweeps.py": "engine steps timed in sequence (each step's state follows the last): "
                                        "descriptive medians and percentiles, printed without a verdict",
}


def _code():
    for p in sorted((ROOT / "labkit").rglob("*.py")):
        yield str(p.relative_to(ROOT)), p.read_text()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            if cell["cell_type"] == "code":
                yield f"notebooks/{nb.name} cell {i}", "".join(cell["source"])


def test_the_pattern_finds_a_verdict_word_chosen_inline():
    for planted in ("print(f\"{'faster' if a < b else 'slower'}\")", "x = 'met' if r >= 2 else 'NOT met'",
                    "v = ('almost lossless: holds' if d < 0.01\n     else 'not lossless')", "s = 'a' if c else 'fails'"):
        assert INLINE.search(planted), planted
    for fine in ("print(measure.compare(a, b))", "why = 'does it hold?'", "x = 'fast' if a else 'slow'",
                 "raise ValueError('it holds no blocks')\nif x:"):
        assert not INLINE.search(fine), fine


def test_no_verdict_word_computed_inline():
    found = [f"{where}: {m.group(0)!r}" for where, text in _code() if where not in VERDICT_ALLOWED
             for m in INLINE.finditer(text)]
    assert found == [], "print a measure.compare / measure.claim instead:\n" + "\n".join(found)


def test_no_new_hand_made_median_of_timings():
    found = [where for where, text in _code()
             if where.startswith("labkit/") and where not in MEDIAN_ALLOWED and MEDIAN.search(text) and CLOCK.search(text)]
    assert found == [], f"time with measure.run and read Timing.median (or compare): {found}"
    gone = [p for p in MEDIAN_ALLOWED if not (MEDIAN.search((ROOT / p).read_text()) and CLOCK.search((ROOT / p).read_text()))]
    assert gone == [], f"routed now: take them off MEDIAN_ALLOWED: {gone}"
