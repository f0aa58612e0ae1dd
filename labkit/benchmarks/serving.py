"""Serving on this machine: batching policies on one trace, decode vs batch, chunked prefill, the endpoint,
two processes (TP, DP, disaggregation), and the same policies and layouts modelled on GPUs.

Every live figure is measured here, on SmolLM2-135M in float32 (the Shakespeare target for the
two-process runs: its heads divide by 2). The trace replay runs on the engine's measured virtual
clock (each step's real wall time; idle gaps skipped). Targets are printed beside
the figure; a figure from one run has no interval, so it gets no verdict (`labkit.measure.claim` needs one), and
a count (the KV utilisation) is judged as exact.
"""
from __future__ import annotations

from labkit.benchmarks.loading import source_ids  # noqa: F401  (chapter 09 imports it from here)

TITLE = ("Serving: static vs continuous vs chunked batching, decode vs batch, chunked prefill, prefix caching, endpoint, "
         "TP/DP/disaggregation, speculation budgets under load")

# The mixed trace: Poisson arrivals, prompts uniform, replies geometric (a reply ends with the same
# probability after every token), clipped; dense enough that a queue forms.
TRACE = dict(n=48, rate=16.0, prompt_len=(16, 96), reply_len=(4, 256), reply_mean=48, seed=0)
QUICK_TRACE = dict(n=12, rate=16.0, prompt_len=(16, 64), reply_len=(4, 96), reply_mean=24, seed=0)
POLICY_LIMITS = {"static": dict(token_budget=512), "continuous": dict(token_budget=512), "chunked": dict(token_budget=64)}
PRICE_HERE = 0.10   # $/hour for a 2-vCPU cloud machine: an assumption, set your own
PRICE_H100 = 3.00   # $/hour for one H100 rented: an assumption, set your own


def _target(band: str) -> str:
    return f"target {band}; one run, no interval: no verdict"


def policies(model, source, trace_opts: dict, max_batch: int = 16, progress: bool = False) -> dict:
    """Replay one trace against each policy; the summaries and the replays, by policy."""
    from labkit.serving import Engine, fresh, poisson_trace, summarize

    trace = poisson_trace(source=source, **trace_opts)
    out = {}
    for policy, limits in POLICY_LIMITS.items():
        engine = Engine(model, policy=policy, max_batch=max_batch, block_size=16, num_blocks=max_batch * 24, **limits)
        replay = engine.replay(fresh(trace), progress=progress)
        out[policy] = {"summary": summarize(replay, ttft_slo_s=2.0, itl_slo_s=0.1), "replay": replay}
    return out


def modelled_policies(trace_opts: dict, config="llama-2-7b", hw="h100-sxm", max_batch: int = 64,
                      token_budget: int = 512) -> dict:
    """The same policies on a GPU: the scheduler with the cost model's pass times (no model runs)."""
    from labkit.costmodel import pass_time
    from labkit.serving import fresh, poisson_trace, summarize
    from labkit.serving.studies.sweeps import simulate

    trace = poisson_trace(source=list(range(1, 4096)), **trace_opts)

    def step_time(rows):
        cached = sum(r.n_cached for r, n in rows)
        return pass_time(config, hw, sum(n for _, n in rows), cached)

    out = {}
    for policy in POLICY_LIMITS:
        replay = simulate(fresh(trace), step_time, policy=policy, max_batch=max_batch, token_budget=token_budget)
        out[policy] = summarize(replay, ttft_slo_s=2.0, itl_slo_s=0.1)
    return out


def _print_policies(rows: dict, label: str) -> None:
    print(f"  {label}")
    print(f"    {'policy':10s} {'tok/s':>7s} {'TTFT p50':>9s} {'p99':>7s} {'ITL p50':>8s} {'p99':>7s} {'goodput':>8s} "
          f"{'KV paged':>8s} {'prealloc':>8s} {'batch':>5s} {'preempt':>7s}")
    for p, s in rows.items():
        print(f"    {p:10s} {s['throughput_tok_s']:7.1f} {s['ttft_p50_s']:8.2f}s {s['ttft_p99_s']:6.2f}s "
              f"{s['itl_p50_s'] * 1e3:6.1f}ms {s['itl_p99_s'] * 1e3:5.0f}ms {s['goodput_req_s']:6.2f}/s "
              f"{s['kv_util_paged']:8.0%} {s['kv_util_prealloc']:8.0%} {s['mean_batch']:5.1f} {s['preemptions']:7d}")


def run(quick: bool = False) -> dict:
    import torch

    from labkit.benchmarks.loading import load_or_skip
    from labkit.costmodel import compare_plans, cost_per_million_tokens, critical_batch, decode_throughput, this_machine
    from labkit.costmodel.serving import LLAMA3_70B
    from labkit.serving.studies.sweeps import batch_sweep, prefill_interference

    model, tok, skipped = load_or_skip("smollm2-135m")
    if skipped:
        return skipped
    source = source_ids(tok)
    report = {"threads": torch.get_num_threads()}

    # 1. one trace, three policies
    pol = policies(model, source, QUICK_TRACE if quick else TRACE)
    summaries = {p: v["summary"] for p, v in pol.items()}
    report["policies"] = summaries
    _print_policies(summaries, "mixed trace " + str(QUICK_TRACE if quick else TRACE) + ", max_batch 16, measured here:")
    st, co = summaries["static"], summaries["continuous"]
    ratio = co["throughput_tok_s"] / st["throughput_tok_s"]
    print(f"    continuous / static throughput {ratio:.2f}x ({_target('>= 2x')}), "
          f"p99 TTFT {co['ttft_p99_s']:.2f} vs {st['ttft_p99_s']:.2f} s ({_target('no worse')})")
    util = summaries["continuous"]["kv_util_paged"]
    print("    " + str(measure.claim("paged KV utilisation >= 90 %", util, low=0.9, exact=True,
                                    why="a count of the blocks' slots")) + f"; preallocating prompt + max_tokens "
          f"per request: {summaries['continuous']['kv_util_prealloc']:.0%}")
    gpu = modelled_policies({**(QUICK_TRACE if quick else TRACE), "n": 128 if quick else 512, "rate": 1000.0})
    report["policies_modelled_h100_llama2_7b"] = gpu
    _print_policies(gpu, "the same policies modelled on an H100 (Llama-2-7B, 16-bit, max_batch 64, token budget 512, a burst of the same lengths):")
    print(f"    continuous / static throughput there: {gpu['continuous']['throughput_tok_s'] / gpu['static']['throughput_tok_s']:.2f}x")

    # 2. decode tokens/s vs batch, next to the cost model
    batches = [1, 2, 4, 8] if quick else [1, 2, 4, 8, 16, 32]
    sweep = batch_sweep(model, batches, prompt_len=64, steps=6 if quick else 12, source=source)
    hw = this_machine()
    modelled = {r["batch"]: r for r in decode_throughput(model.config, hw, batches, context=70, weight_bits=32,
                                                         kv_bits=32, act_bits=32)}
    b_star = critical_batch(model.config, hw, 70, weight_bits=32, kv_bits=32, act_bits=32)
    report["batch_sweep"] = {"measured": sweep, "modelled": list(modelled.values()), "critical_batch": b_star}
    print(f"  decode vs batch (context ~70), measured vs modelled ({hw.name}); critical batch {b_star:.1f}:")
    for r in sweep:
        m = modelled[r["batch"]]
        print(f"    batch {r['batch']:3d}: {r['step_s'] * 1e3:6.1f} ms/step, {r['tokens_per_s']:6.1f} tok/s "
              f"(modelled {m['tokens_per_s']:6.1f}, {m['bound']}-bound)" + ("  [noisy]" if r["spread"] > 0.25 else ""))
    one = {r["batch"]: r["tokens_per_s"] for r in sweep}
    if 8 in one:
        print(f"    batch 8 / batch 1: {one[8] / one[1]:.2f}x ({_target('>= 4x')})")

    # 3. a 1k-token prompt arriving while 4 requests decode
    rows = {}
    for policy, chunk in (("continuous", 0), ("chunked", 16), ("chunked", 64)):
        r = prefill_interference(model, policy=policy, chunk=chunk or 16, long_prompt=256 if quick else 1024,
                                 source=source)
        rows[f"{policy} {r['chunk']}"] = {k: v for k, v in r.items() if k not in ("running", "long")}
        print(f"  {policy:10s} chunk {r['chunk']:4d}: running requests' ITL during the long prefill p99 "
              f"{r['p99_during_s'] * 1e3:7.1f} ms vs the undisturbed gap {r['undisturbed_s'] * 1e3:5.1f} ms "
              f"({r['p99_over_undisturbed']:.1f}x); the long prompt's TTFT {r['ttft_long_s']:.2f} s")
    best = rows["chunked 16"]["p99_over_undisturbed"]
    print(f"    chunked prefill: p99 during the prefill / the undisturbed gap {best:.2f}x ({_target('<= 2x')})")
    report["prefill_interference"] = rows

    # 4. automatic prefix caching: a 1,000-token system prompt shared by every request
    from labkit.serving.studies.sweeps import shared_prefix
    system = source[:256 if quick else 1000]
    questions = [source[5000 + 40 * i: 5000 + 40 * i + 16] for i in range(4 if quick else 8)]
    pc = shared_prefix(model, system, questions)
    report["prefix_cache"] = pc
    on, off = pc["on"]["summary"], pc["off"]["summary"]
    gain = off["ttft_p50_s"] / on["ttft_p50_s"]
    print(f"  prefix caching, {len(questions)} requests sharing a {len(system)}-token system prompt (one a minute, no queue): "
          f"TTFT p50 {on['ttft_p50_s'] * 1e3:.0f} ms with the cache, {off['ttft_p50_s'] * 1e3:.0f} ms without "
          f"({gain:.1f}x; {_target('>= 3x')}); hit rate {on['prefix_hit_rate']:.0%}; prompt tokens run "
          f"{pc['on']['prefilled_tokens']} vs {pc['off']['prefilled_tokens']}; replies identical: {pc['same_replies']}")

    # 5. two data-parallel replicas: round robin vs least outstanding work, prompts of very different lengths
    import numpy as np

    from labkit.serving import Request
    from labkit.serving.studies.sweeps import routing
    rng = np.random.default_rng(1)
    n_req = 8 if quick else 24
    long_p, short_p = (256, 16) if quick else (512, 24)
    lens = rng.choice([long_p, short_p], size=n_req, p=[0.35, 0.65])
    arrivals = np.cumsum(rng.exponential(0.3, n_req))
    mixed = [Request(i, source[97 * i: 97 * i + int(p)], 16, arrival=float(a)) for i, (p, a) in enumerate(zip(lens, arrivals))]
    rt = routing(model, mixed, 2)
    report["routing"] = {k: {"summary": v["summary"], "route": v["route"]} for k, v in rt.items()}
    for name, v in rt.items():
        sm = v["summary"]
        print(f"  2 replicas, {name:11s}: {n_req} requests ({long_p}- and {short_p}-token prompts): TTFT p50 "
              f"{sm['ttft_p50_s']:.2f} s, p99 {sm['ttft_p99_s']:.2f} s; throughput {sm['throughput_tok_s']:.1f} tok/s")

    # 6. disaggregated prefill (DistServe, Splitwise): two workers co-located vs one prefill + one decode engine
    from labkit.serving.studies.sweeps import disaggregation
    sizes = dict(long_prompt=256, reply=16) if quick else {}
    dg = disaggregation(model, source=source, **sizes)
    report["disaggregation"] = dg
    tr = dg["trace"]
    print(f"  2 workers, {tr['n_running']} requests decoding while {tr['long_prompts']} prompts of {tr['long_prompt']} tokens arrive "
          f"(KV link modelled at {dg['link_gb_s']:g} GB/s; {dg['kv_bytes_per_token'] / 1e3:.1f} kB of KV per token):")
    print(f"    {'':22s} {'ITL p50':>8s} {'p99':>8s} {'p99 during prefill':>19s} {'long TTFT p50':>14s} {'tok/s':>6s} "
          f"{'KV moved/long':>13s} {'transfer':>9s}")
    for way in ("continuous", "chunked", "disaggregated"):
        r = dg[way]
        moved = (f"{r['kv_bytes_per_long'] / 1e6:10.1f} MB {r['transfer_s_per_long'] * 1e3:7.1f} ms"
                 if way == "disaggregated" else f"{'-':>13s} {'-':>9s}")
        label = f"co-located {way}" if way != "disaggregated" else way
        print(f"    {label:22s} {r['itl_p50_s'] * 1e3:6.1f}ms {r['itl_p99_s'] * 1e3:6.0f}ms {r['itl_during_p99_s'] * 1e3:17.0f}ms "
              f"{r['ttft_long_p50_s']:13.2f}s {r['throughput_tok_s']:6.1f} {moved}")
    dis = dg["disaggregated"]
    print(f"    disaggregated: p99 during the prefills / its ITL p50 {dis['itl_during_p99_s'] / dis['itl_p50_s']:.2f}x "
          f"({_target('<= 1.5x')}); replies identical three ways: {dg['same_outputs']}")

    # 7. the endpoint, 8. two processes, 9. paper
    from labkit.benchmarks.serving_live import endpoint, two_processes
    report["endpoint"] = endpoint(model, tok, quick)
    report["two_processes"] = two_processes(quick)
    plans = {b: compare_plans(LLAMA3_70B, "h100-sxm", batch=b) for b in (64, 512)}
    report["tp8_vs_tp4dp2"] = plans
    print("  Llama-3-70B on 8 H100s, modelled (prompt 1024, reply 256):")
    for b, pair in plans.items():
        for p in pair:
            print(f"    batch {b:4d} {p['plan']:8s}: ITL {p['itl_s'] * 1e3:5.1f} ms, {p['tokens_per_s']:8,.0f} tok/s, "
                  f"{p['mem_per_gpu_gb']:5.1f} GB/GPU (fits: {p['fits']}), all-reduce {p['allreduce_s'] * 1e3:4.1f} ms/step")
    here = co["throughput_tok_s"]
    h100 = decode_throughput("llama-2-7b", "h100-sxm", [64], context=512)[0]["tokens_per_s"]
    report["cost_per_million"] = {"here": cost_per_million_tokens(here, PRICE_HERE),
                                  "h100_llama2_7b_batch64": cost_per_million_tokens(h100, PRICE_H100)}
    print(f"  $ per 1M output tokens: here (SmolLM2, continuous, ${PRICE_HERE}/h assumed) "
          f"{report['cost_per_million']['here']:.2f}; H100 (Llama-2-7B, batch 64 modelled, ${PRICE_H100}/h assumed) "
          f"{report['cost_per_million']['h100_llama2_7b_batch64']:.3f}")

    # 10. speculation inside the engine, under load (each budget across an arrival-rate sweep)
    from labkit.benchmarks.serving_spec import section
    report["speculation"] = section(model, tok, quick)
    return report
