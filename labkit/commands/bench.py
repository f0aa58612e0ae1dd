"""`labkit bench`: measure and print the lab's performance figures, write them as JSON."""
from __future__ import annotations

import importlib
import json
import pkgutil
import platform

from labkit.measure.clock import now as clock_now


def add_parser(sub):
    p = sub.add_parser("bench", help="measure the lab's performance figures")
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    p.add_argument("--only", nargs="*", metavar="NAME", help="run only these benchmarks")
    p.add_argument("--quick", action="store_true", help="fewer repeats (noisier)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--check", action="store_true", help="say whether every stored file in data/ was made by today's "
                   "code (fresh / older code / no record); exit 1 when one a chapter reads is not fresh")
    return p


def available() -> dict[str, object]:
    import labkit.benchmarks as pkg

    names = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))
    mods = {name: importlib.import_module(f"labkit.benchmarks.{name}") for name in names}
    return {name: m for name, m in mods.items() if hasattr(m, "TITLE") and hasattr(m, "run")}  # helpers are not benchmarks


def run(args) -> int:
    if args.check:
        from labkit.benchmarks.evidence import check

        return check()
    benches = available()
    if args.list:
        for name, mod in benches.items():
            print(f"{name:16s} {mod.TITLE}")
        return 0
    selected = args.only or list(benches)
    unknown = [n for n in selected if n not in benches]
    if unknown:
        raise SystemExit(f"labkit bench: unknown benchmark(s) {unknown}; known: {sorted(benches)}")
    from labkit.costmodel.cpu import cpu_info, describe

    cpu = cpu_info()
    print(f"labkit bench on {describe(cpu)}", flush=True)
    report = {"machine": platform.platform(), "cpu": cpu, "python": platform.python_version(), "results": {}}
    for name in selected:
        mod = benches[name]
        print(f"== {name}: {mod.TITLE}", flush=True)
        start = clock_now()
        report["results"][name] = mod.run(quick=args.quick)
        print(f"   ({clock_now() - start:.1f} s)", flush=True)
    if args.json:
        from labkit.benchmarks.evidence import stamp

        with open(args.json, "w") as f:
            json.dump(stamp(report, args.json), f, indent=2, default=float)
        print(f"wrote {args.json}")
    return 0
