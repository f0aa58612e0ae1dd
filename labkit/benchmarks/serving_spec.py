"""Speculation inside the serving engine, under load: each budget across an arrival-rate sweep.

A section of `labkit bench --only serving`; alone, `python -m labkit.benchmarks.serving_spec --json
data/serving_spec.json` writes the file chapter 09 reads. SmolLM2-135M (float32) serves the workload of
`labkit.serving.studies.specload` once, greedy and batch-invariant, and its replies are recorded; this machine's
pass costs are measured; then the recorded requests are replayed at each load with each budget through
the engine (its scheduler, prompt lookup, the budget, verification, rollback) timed by this machine's
pass costs and by the cost model's H100 running Llama-2-7B (acceptance from SmolLM2's replies). A live
run of the real engine at one load checks the replay: same replies, and its measured time next to the
replay's.
"""
from __future__ import annotations


from labkit.measure.clock import now as clock_now

LOADS = (0.05, 0.5, 1.0, 2.0)
HERE = dict(max_batch=16, token_budget=128, budgets=("off", "fixed:3", "vllm:8:3", "auto"))
H100 = dict(max_batch=256, token_budget=4096, copies=6, budgets=("off", "fixed:3", "vllm:64:3", "auto"))
H100_MODEL = ("llama-2-7b", "h100-sxm")
HEADS = (0.45, 0.28)  # chapter 07's measured acceptance: the chained and zero-copy heads (0.43-0.45), Medusa (0.28)


def h100_pass_time(config: str = H100_MODEL[0], hw: str = H100_MODEL[1]):
    """rows [(request, tokens)] -> the cost model's seconds for that pass (its tokens, the KV its rows read)."""
    from labkit.costmodel import pass_time

    return lambda rows: pass_time(config, hw, sum(n for _, n in rows), sum(r.n_cached for r, _ in rows))


def verdicts(rows: list[dict], low: float, high: float) -> dict:
    """The targets on one sweep: auto's per-request decode speed (1/TPOT) over off's at load `low`, and throughput
    over off's at load `high` (auto's and fixed:3's)."""
    at = {(r["load"], r["budget"]): r for r in rows}
    off_lo, off_hi = at[(low, "off")], at[(high, "off")]
    auto = next(b for (_, b) in at if b == "auto")
    return {"auto_speed_low": off_lo["tpot_mean_s"] / at[(low, auto)]["tpot_mean_s"],
            "auto_throughput_high": at[(high, auto)]["throughput_tok_s"] / off_hi["throughput_tok_s"],
            "fixed3_throughput_high": at[(high, "fixed:3")]["throughput_tok_s"] / off_hi["throughput_tok_s"]}


def print_sweep(res: dict, label: str) -> None:
    print(f"  {label}: capacity without speculation {res['capacity_req_s']:.2f} requests/s")
    print(f"    {'load':>5s} {'budget':10s} {'tok/s':>8s} {'TTFT p50':>9s} {'p99':>8s} {'ITL p50':>8s} {'p99':>8s} "
          f"{'TPOT':>8s} {'accepted/drafted':>17s} {'tok/pass':>8s}")
    for r in res["rows"]:
        ratio = f"{r['accepted']}/{r['drafted']}" if r["drafted"] else "-"
        print(f"    {r['load']:5.2f} {r['budget']:10s} {r['throughput_tok_s']:8.1f} {r['ttft_p50_s'] * 1e3:7.1f}ms "
              f"{r['ttft_p99_s'] * 1e3:6.0f}ms {r['itl_p50_s'] * 1e3:6.2f}ms {r['itl_p99_s'] * 1e3:6.1f}ms "
              f"{r['tpot_mean_s'] * 1e3:6.2f}ms {ratio:>17s} {r['tokens_per_pass']:8.1f}")


def section(model, tok, quick: bool = False, reuse: dict | None = None) -> dict:
    """Record, measure, sweep, check. `reuse`: a previous report's results, whose recording and pass costs are taken
    as they are (the sweeps and the live check run again)."""
    from labkit import measure
    from labkit.benchmarks.loading import source_ids
    from labkit.serving.studies import specload
    from labkit.serving.studies.passcost import measure_pass_costs, step_time

    t0 = clock_now()
    if reuse is not None:
        recorded, table = reuse["recorded"], reuse["pass_costs"]
        print(f"  the recording and pass costs of a previous run: {len(recorded['prompts'])} requests")
    else:
        prompts = specload.workload_prompts(2 if quick else 6)
        recorded = specload.record(model, tok, prompts, max_new_tokens=64 if quick else 128, progress=True)
        print(f"  recorded {len(prompts)} greedy replies ({sum(map(len, recorded['replies']))} tokens, "
              f"{sum(k == 'grounded' for k in recorded['kinds'])} input-grounded) in {clock_now() - t0:.0f} s")
        table = measure_pass_costs(model, decode_rows=(1, 2, 4, 8, 16, 32, 64), prefill_tokens=(128, 256),
                                   source=source_ids(tok), context=128, repeats=3 if quick else 7)
    t1 = table[0]["seconds"]
    print("  this machine's pass costs (decode rows at context 128; medians, interleaved): " + ", ".join(
        f"T({r['tokens']})/T(1) {r['seconds'] / t1:.2f}" for r in table if r["kind"] == "decode"))
    loads = (0.05, 1.0, 2.0) if quick else LOADS
    here = step_time(table)
    report = {"recorded": recorded, "pass_costs": table, "loads": loads, "sweeps": {}, "verdicts": {}}
    h100_opts = {**H100, "copies": 2} if quick else H100
    traces = {"grounded": specload.only(recorded, "grounded"), "mixed": recorded}
    for trace_name, head in (("grounded", None), ("mixed", None)) + tuple(("mixed", a) for a in HEADS):
        drafter = "prompt lookup" if head is None else f"a modelled head accepting {head:.0%} of its tokens"
        for machine, cost, opts in (("here", here, HERE), ("h100", h100_pass_time(), h100_opts)):
            res = specload.sweep(traces[trace_name], model.config, cost, loads=loads, head=head, **opts)
            key = f"{machine} {trace_name}" + ("" if head is None else f" head {head}")
            report["sweeps"][key] = res
            where = "this machine's measured pass costs" if machine == "here" else \
                f"the cost model's H100 running {H100_MODEL[0]}, {opts['copies']}x the requests"
            print_sweep(res, f"{trace_name} trace, {drafter}, on {where}")
            v = verdicts(res["rows"], loads[0], loads[-1])
            report["verdicts"][key] = v
            for text, value, band in ((f"auto: per-request decode speed at load {loads[0]} against off",
                                       v["auto_speed_low"], {"low": 1.3}),
                                      (f"auto: throughput at load {loads[-1]} against off", v["auto_throughput_high"],
                                       {"low": 0.97}),
                                      (f"fixed:3: throughput at load {loads[-1]} against off",
                                       v["fixed3_throughput_high"], {"high": 0.9})):
                print("    " + str(measure.claim(text, value, exact=True, source="the replay: a modelled value",
                                                 **band)))
    report["live"] = live_check(model, recorded, here, n=6 if quick else 12)
    return report


def live_check(model, recorded: dict, cost, n: int = 12, load: float = 1.0) -> dict:
    """The real engine on the first `n` recorded requests at `load`: (1) batch-invariant, auto budget, timed by the
    same pass costs: its summary and replies against the replay's (they must be equal); (2) the default mode without
    drafts on the wall clock against the replay on the measured pass costs (how well the cost table times it);
    (3) with drafts (auto) and without, both batch-invariant, on the wall clock, whose whole steps include the
    drafting, verification and sampling the replay leaves out: the live speed-up beside the replay's."""
    from labkit.serving.studies import specload

    sub = {**recorded, **{k: recorded[k][:n] for k in ("kinds", "prompts", "replies")}}
    opts = dict(max_batch=HERE["max_batch"], token_budget=HERE["token_budget"])
    rate = load * specload.capacity(sub, model.config, cost, **opts)
    replayed = specload.replay(sub, model.config, cost, rate=rate, budget="auto", **opts)
    live = specload.replay(sub, model.config, cost, rate=rate, budget="auto", model=model, **opts)
    for summary in (replayed, live):
        summary.pop("draft_s")  # the drafting's wall time on this machine, the one field a replay does not decide
    same = all(r.output == sub["replies"][r.id] for r in live.pop("served")) and (
        replayed.pop("served") is not None and live == replayed)
    timed = specload.replay(sub, model.config, cost, rate=rate, **opts)
    wall = specload.replay(sub, model.config, None, rate=rate, model=model, batch_invariant=False, **opts)
    inv_off = specload.replay(sub, model.config, None, rate=rate, model=model, **opts)
    inv_auto = specload.replay(sub, model.config, None, rate=rate, budget="auto", model=model, **opts)
    out = {"requests": n, "replay_is_the_engine": same, "measured_s": wall["duration_s"], "replayed_s": timed["duration_s"],
           "measured_tpot_s": wall["tpot_mean_s"], "replayed_tpot_s": timed["tpot_mean_s"],
           "drafts": {"live_off_tpot_s": inv_off["tpot_mean_s"], "live_auto_tpot_s": inv_auto["tpot_mean_s"],
                      "replayed_off_tpot_s": timed["tpot_mean_s"], "replayed_auto_tpot_s": replayed["tpot_mean_s"],
                      "live_speedup": inv_off["tpot_mean_s"] / inv_auto["tpot_mean_s"],
                      "replayed_speedup": timed["tpot_mean_s"] / replayed["tpot_mean_s"],
                      "live_auto_s": inv_auto["duration_s"], "replayed_auto_s": replayed["duration_s"]}}
    print(f"  live check on {n} recorded requests at load {load}: the real engine (batch-invariant, auto, the same pass "
          f"costs) gives the replay's replies, passes and times: {same}; without drafts on the wall clock it took "
          f"{wall['duration_s']:.1f} s (TPOT {wall['tpot_mean_s'] * 1e3:.1f} ms) where the replay on the measured pass "
          f"costs says {timed['duration_s']:.1f} s ({timed['tpot_mean_s'] * 1e3:.1f} ms)")
    dr = out["drafts"]
    print(f"  with drafts, live on the wall clock (batch-invariant, every step's drafting, verification and sampling "
          f"timed): auto's TPOT {dr['live_auto_tpot_s'] * 1e3:.1f} ms against {dr['live_off_tpot_s'] * 1e3:.1f} ms without "
          f"drafts, a speed-up of {dr['live_speedup']:.2f}x; the replay on the pass costs says {dr['replayed_speedup']:.2f}x "
          f"(live / replayed {dr['live_speedup'] / dr['replayed_speedup']:.2f}; one run each, no spread)")
    return out


def main(argv=None) -> int:
    import argparse
    import json
    import platform

    import labkit
    from labkit.costmodel.cpu import cpu_info, describe

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="FILE", help="write the figures (and the recording) to FILE")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reuse", metavar="FILE", help="take the recording and pass costs from a previous --json FILE "
                   "(its machine is kept as the one that measured them)")
    args = p.parse_args(argv)
    model, tok = labkit.load("smollm2-135m")
    print(f"on {describe()}")
    report = {"machine": platform.platform(), "cpu": cpu_info(), "command": "python -m labkit.benchmarks.serving_spec"}
    reuse = None
    if args.reuse:
        with open(args.reuse) as f:
            old = json.load(f)
        reuse = old["results"]
        report.update(machine=old["machine"], cpu=old["cpu"])
    report["results"] = section(model, tok, args.quick, reuse)
    from labkit.benchmarks.loading import write_report

    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
