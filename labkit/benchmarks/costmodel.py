"""Cost and power sliders: the time from a slider move to a redrawn figure (budget: 100 ms)."""
from __future__ import annotations

import statistics

from labkit.measure.clock import now as clock_now

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


def _time_moves(box, control: str, values, repeat: int) -> list[float]:
    widget = box.controls[control]
    times = []
    for i in range(repeat):
        value = values[i % 2]
        start = clock_now()
        widget.value = value          # observe() runs the callback synchronously
        times.append((clock_now() - start) * 1e3)
    return times


def run(quick: bool = False) -> dict:
    from labkit.widgets import power, roofline

    makers = {name: getattr(power, name, None) or getattr(roofline, name) for name, _, _ in MOVES}
    boxes = {name: make() for name, make in makers.items()}
    repeat = 4 if quick else 10
    results = {}
    for name, control, values in MOVES:
        times = _time_moves(boxes[name], control, values, repeat)
        key = f"{name}.{control}"
        results[key] = {"median_ms": statistics.median(times), "max_ms": max(times)}
        flag = "" if results[key]["median_ms"] <= BUDGET_MS else "   OVER BUDGET"
        print(f"  {key:32s} median {results[key]['median_ms']:6.1f} ms   max {results[key]['max_ms']:6.1f} ms{flag}")
    worst = max(r["median_ms"] for r in results.values())
    print(f"  worst median {worst:.1f} ms (budget {BUDGET_MS:.0f} ms)")
    return {"callbacks": results, "worst_median_ms": worst, "budget_ms": BUDGET_MS}
