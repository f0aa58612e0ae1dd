"""Cost and power sliders: the time from a slider move to a redrawn figure (budget: 100 ms)."""
from __future__ import annotations

TITLE = "cost and power widgets: slider callback time (budget 100 ms)"
BUDGET_MS = 100.0

# (widget, control, two values to alternate between)
MOVES = [
    ("power_timeline", "reply", (24, 256)),
    ("power_timeline", "switch", ("handoff", "dvfs")),
    ("power_timeline", "core", (40.0, 0.0)),
    ("energy_vs_reply", "switch", ("collapse", "handoff")),
    ("energy_vs_reply", "prompt", (512, 64)),
    ("kv_placement", "sram", (2.0, 8.0)),
    ("kv_placement", "kv_bits", (8, 16)),
    ("dvfs_explorer", "context", (2048, 256)),
    ("dvfs_explorer", "hw", ("raspberry-pi-5", "phone-sd8gen3")),
    ("swap_explorer", "bw", (0.1, 4.0)),
    ("roofline_explorer", "batch", (64, 1)),
    ("roofline_explorer", "prompt", (4096, 512)),
    ("roofline_explorer", "hw", ("a100-sxm", "h100-sxm")),
]


def _time_moves(box, control: str, values, repeat: int):
    """A `measure.Timing` of `repeat` moves of the control, between its two values (each call one move)."""
    from labkit import measure

    widget, moves = box.controls[control], [0]

    def move():
        widget.value = values[moves[0] % 2]  # observe() runs the callback synchronously
        moves[0] += 1

    return measure.run({control: move}, rounds=repeat, warmup=0, machine=False, loops=1)[control]


def run(quick: bool = False) -> dict:
    from labkit import measure
    from labkit.measure.stats import median_interval
    from labkit.widgets import power, roofline

    makers = {name: getattr(power, name, None) or getattr(roofline, name) for name, _, _ in MOVES}
    boxes = {name: make() for name, make in makers.items()}
    repeat = 4 if quick else 10
    results = {}
    for name, control, values in MOVES:
        t = _time_moves(boxes[name], control, values, repeat)
        key = f"{name}.{control}"
        lo, hi = median_interval(t.samples, 0.95)
        results[key] = {"median_ms": t.median * 1e3, "max_ms": t.max * 1e3, "samples_s": list(t.samples)}
        verdict = measure.claim(f"{key}: the median callback within {BUDGET_MS:.0f} ms", t.median * 1e3,
                                interval=(lo * 1e3, hi * 1e3), high=BUDGET_MS)
        results[key]["verdict"] = verdict.verdict
        print(f"  {verdict} (max {t.max * 1e3:.1f} ms)")
    worst = max(r["median_ms"] for r in results.values())
    print(f"  worst median {worst:.1f} ms (budget {BUDGET_MS:.0f} ms)")
    return {"callbacks": results, "worst_median_ms": worst, "budget_ms": BUDGET_MS}
