"""The compiled decode step of the two fastest formats (int4 g32, the GGUF file's Q4_1), on this CPU.

A shorter companion to `labkit bench --only step` (which compiles every format): run it under
each instruction set (`scripts/isa_env.sh`) to see whether compiling pays there. For each
format: compile time cold and from the cache, kernels a step, greedy tokens against eager's,
where the compiled step's time goes (`step_compiled.compiled_profile`: products, other operators,
the generated program, Dynamo's entry, the rest), T(k) / T(1) eager and compiled side by side,
and decode tokens/s in interleaved rounds with llama.cpp on the same GGUF file (when the
`peers` extra is installed). `--json data/compiled_bench.json` writes the file chapter 03 reads.
"""
from __future__ import annotations

TITLE = "the compiled step of int4 and Q4_1: where its time goes, against eager and llama.cpp"
KS = (1, 2, 4, 8)


def run(quick: bool = False) -> dict:
    import torch

    import labkit
    from labkit.benchmarks.step_compiled import Toggle, compile_format, compiled_profile
    from labkit.benchmarks.step import PROCESSES, PROMPT, SPECS, _formats, peer_rates, vs_peer
    from labkit.benchmarks.workers import compile_times
    from labkit.costmodel.cpu import emulated_isa
    from labkit.generation.profile import pass_timings, samples_by_name
    from labkit.model.compiled import compiler_problem

    why = compiler_problem()
    if why:
        print(f"  not measured: {why}")
        return {"error": why}
    _, tok = labkit.load("smollm2-135m")
    ids = tok.encode_chat([{"role": "user", "content": PROMPT}])
    n, rounds = (16, 3) if quick else (48, 8)  # 8 paired rounds: a 95 % interval needs 6
    report = {"threads": torch.get_num_threads(), "prompt_tokens": len(ids), "formats": {}}
    timed, loaders = {}, _formats()
    for name in ("int4 g32", "Q4_1 (GGUF)"):
        model = loaders[name]()
        program, row = compile_format(model, ids, n=32 if quick else 64)
        times = compile_times(SPECS[name])  # fresh processes: an empty inductor cache, then the one it left
        row["compile_cold_s"], row["compile_cached_s"] = times["cold_s"], times["cached_s"]
        row["profile"] = prof = compiled_profile(model, ids)
        report["formats"][name] = row
        print(f"  {name:12s} compiled in {row['compile_cold_s']:.0f} s cold, {row['compile_cached_s']:.0f} s from the "
              f"cache; {row['program']['launches']} kernels a step; greedy tokens equal eager's: {row['tokens_equal_eager']}"
              f" of {32 if quick else 64}")
        print(f"  {'':12s} compiled step, profiled {prof['profiled_step_ms']:.1f} ms = products {prof['products_ms']:.1f} + "
              f"other operators {prof['other_ops_ms']:.1f} + generated program {prof['program_ms']:.1f} + Dynamo's entry "
              f"{prof['dynamo_entry_ms']:.1f} + not attributed {prof['rest_ms']:.1f}; without the profiler "
              f"{prof['step_ms']:.1f} ms (the profiler added {prof['profiler_added']:+.0%}); cannot see: "
              + "; ".join(prof["unseen"]))
        timed[name], timed[name + " compiled"] = Toggle(model, program, False), Toggle(model, program, True)
    pass_run = pass_timings(timed, ids, KS, rounds=rounds)  # every sample kept in the report
    report["pass_samples"] = samples_by_name(pass_run)
    costs = {name: {k: pass_run[(name, k)].median for k in KS} for name in timed}
    print("  T(k) / T(1) (interleaved)      " + "".join(f"{'k=' + str(k):>7s}" for k in KS[1:]) + "   step ms")
    for name, per_k in costs.items():
        row = report["formats"][name.removesuffix(" compiled")]
        row["compiled_pass_ms" if name.endswith("compiled") else "eager_pass_ms"] = {k: 1e3 * s for k, s in per_k.items()}
        print(f"  {name:30s}" + "".join(f"{per_k[k] / per_k[1]:7.2f}" for k in KS[1:]) + f"   {1e3 * per_k[1]:6.1f}")
    del timed  # every side runs in a process of its own from here
    rates = peer_rates(list(costs), ids, n, rounds if quick else 2, report, processes=1 if quick else PROCESSES)
    report["tok_s"] = rates
    print(f"  decode, {n} greedy tokens, {report['tok_s_protocol']}:")
    for name, rate in rates.items():
        vs = report.get("vs_llama_cpp", {}).get(name)
        ratio = (f"  {vs_peer(vs)}" if vs
                 else "  (its own kernels for this CPU: an emulated instruction set does not reach it)"
                 if name == "llama.cpp Q4_1" and emulated_isa() else "")
        print(f"  {name:30s} {rate:6.1f} tok/s{ratio}")
    if report.get("llama_cpp"):
        print(f"  llama.cpp: {report['llama_cpp']}")
    return report
