"""One decode step of SmolLM2 in every number format: operator calls, where the time goes, passes over k tokens.

For float32, bfloat16, int8 and int4 (RTN, bf16 activations on the packed kernels) and the
GGUF file's own Q4_1 blocks:

- operator calls per decode step (`torch.profiler`, nested calls included) and the step's
  time split into weight products, other operators and what lies between them (Python and
  dispatch), as `labkit.generation.profile.step_profile` measures it; float32 also with the
  plain calls (`model.lean_step = False`: `F.linear`, `F.rms_norm`), the same numbers;
- T(k) / T(1): one pass over k new tokens against one decode step, k = 1..8, interleaved, and
  what the batch-invariant mode costs a k-token pass (with the switch / without it), next to
  which of this CPU's default kernels are row-invariant (`labkit.model.invariance`);
- decode tokens/s and the GB/s they stream (weights + KV cache per token), interleaved
  rounds, with llama.cpp on the same GGUF file when the `peers` extra is installed and the
  streaming-read roofline sampled in every round (float32's share of it);
- not with `--quick`: every format's step as one compiled program (`Transformer.compile_step`,
  `labkit.benchmarks.step_compiled`): float32's compile time cold and from the cache (each in a fresh
  process; the two fastest formats': `labkit bench --only compiled`), kernels launched per
  step against the eager operator calls, whether 64 greedy tokens equal eager's, and the
  compiled step in the same interleaved T(k) run as the eager one (rows "<format> compiled"; the
  compiled steps' decode rates: `labkit bench --only compiled`); the generated RMSNorm, RoPE and
  SwiGLU kernels. Minutes of compiling.

`labkit bench --only step --json data/step_bench.json` writes the file chapter 03 reads.
"""
from __future__ import annotations

import math
import os
import statistics

TITLE = "a decode step per format: operator calls, time split, T(k)/T(1), tok/s vs llama.cpp"

PROMPT = "Explain in two sentences why the sky is blue."
KS = (1, 2, 3, 4, 5, 6, 7, 8)
PROCESSES = 6  # fresh starts of every side for decode rates: the fewest for a 95 % interval from their medians


def _formats():
    """name -> loader of each SmolLM2 variant (loaded one by one: only what runs is in memory)."""
    import torch

    import labkit
    from labkit.quant.apply import quantize_model

    def rtn(bits):
        return lambda: quantize_model(labkit.load("smollm2-135m")[0], bits=bits, group_size=32,
                                      act_dtype=torch.bfloat16, inplace=True)

    return {"float32": lambda: labkit.load("smollm2-135m")[0],
            "bfloat16": lambda: labkit.load("smollm2-135m", dtype="bfloat16")[0],
            "int8": rtn(8), "int4 g32": rtn(4),
            "Q4_1 (GGUF)": lambda: labkit.load("smollm2-135m", dtype="bfloat16", weights="gguf")[0]}


def _bytes_per_token(model, context: int) -> int:
    from labkit.quant.apply import model_nbytes

    kv = model.config.kv_bytes_per_token(_dtype_bytes(model.dtype)) * context
    return int(model_nbytes(model) + kv)


def _dtype_bytes(dtype) -> int:
    import torch

    return torch.finfo(dtype).bits // 8


class _Invariant:
    """A model seen through its batch-invariant switch: every call and step runs with it on."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        from labkit.model.kernels import batch_invariant

        with batch_invariant(self.model):
            return self.model(*args, **kwargs)

    def step(self, *args, **kwargs):
        from labkit.model.kernels import batch_invariant

        with batch_invariant(self.model):
            return self.model.step(*args, **kwargs)


# the same formats as worker specs (labkit.benchmarks.workers): each built in a process of its own
SPECS = {"float32": {"side": "labkit"}, "bfloat16": {"side": "labkit", "dtype": "bfloat16"},
         "int8": {"side": "labkit", "bits": 8}, "int4 g32": {"side": "labkit", "bits": 4},
         "Q4_1 (GGUF)": {"side": "labkit", "dtype": "bfloat16", "weights": "gguf"}}


def worker_specs(names) -> dict:
    """Worker specs for format names, a " compiled" suffix meaning the compiled step."""
    return {name: {**SPECS[_base(name)], "compile": name.endswith(" compiled")} for name in names}


def peer_rates(names, ids: list[int], n: int, rounds: int, report: dict, processes: int = 1) -> dict:
    """Decode tok/s of each format and of llama.cpp, each in its own process, rounds alternating, `rounds` rounds in
    each of `processes` fresh starts; every sample, the protocol and each format's ratio to llama.cpp with its
    interval (from the process-level medians: `measure.compare_starts`) go into `report`."""
    from labkit import measure
    from labkit.benchmarks.workers import LLAMA_CPP, rates_in_own_processes

    run, why = rates_in_own_processes(worker_specs(names), ids, n, rounds, processes=processes)
    report["tok_s_run"] = run.as_dict()
    report["tok_s_protocol"] = run.machine["protocol"]
    if why is not None:
        report["llama_cpp"] = why
    if LLAMA_CPP in run:
        report["vs_llama_cpp"] = {name: measure.compare_starts(run, name, LLAMA_CPP).as_dict() for name in run
                                  if name != LLAMA_CPP}
    return {name: 1 / t.median for name, t in measure.at_level(run).items()}  # process-level medians


def vs_peer(vs: dict) -> str:
    """A stored comparison with llama.cpp (`Comparison.as_dict`, labkit's time / llama.cpp's) as 'x llama.cpp'."""
    lo, hi = (1 / vs["high"] if vs["high"] else math.inf), (1 / vs["low"] if vs["low"] > 0 else math.inf)
    interval = f"{lo:.2f}-{hi:.2f}" if math.isfinite(hi) and lo > 0 else "no interval: too few rounds"
    return f"{1 / vs['ratio']:.2f}x llama.cpp ({interval}, {vs['verdict']})"


def _base(name: str) -> str:
    return name.removesuffix(" compiled")


def _compile_all(models: dict, ids: list[int], report: dict) -> dict:
    """Compile every format (cold, then from the cache), print what it launches; the eager and compiled
    steps of each format to time side by side. Without a C++ compiler: the eager steps, and why."""
    from labkit.benchmarks.step_compiled import Toggle, compile_format, kernel_excerpts
    from labkit.model.compiled import compiler_problem

    why = compiler_problem()
    if why:
        report["compiled_error"] = why
        print(f"  compiled step: not measured: {why}")
        return models
    print("  the step as one compiled program (inductor, C++ wrapper, frozen weights; minutes of compiling):")
    timed = {}
    from labkit.benchmarks.workers import compile_times

    for name, model in models.items():
        program, row = compile_format(model, ids)
        if name == "float32":  # compile times of one format here; the two fastest formats': compiled_bench's
            times = compile_times(SPECS[name])  # two fresh processes: an empty inductor cache, then the one it left
            row["compile_cold_s"], row["compile_cached_s"] = times["cold_s"], times["cached_s"]
        report["formats"][name]["compiled"] = row
        eq = row["tokens_equal_eager"]
        when = (f"compiled in {row['compile_cold_s']:5.1f} s cold, {row['compile_cached_s']:5.1f} s from the cache"
                if "compile_cold_s" in row else f"compiled ({row['compile_in_process_s']:5.1f} s in this process)")
        print(f"  {name:12s} {when}; {row['program']['launches']:4d} kernels a step (eager: "
              f"{report['formats'][name]['ops_per_step']:.0f} operator calls); greedy tokens equal eager's: "
              + ("all 64" if eq == 64 else f"the first {eq} (then a top-2 margin of "
                 f"{row['first_difference_margin']:.3g}; one rounding step there: {row['rounding_step_there']:.3g})"))
        timed[name], timed[name + " compiled"] = Toggle(model, program, False), Toggle(model, program, True)
        if name == "int4 g32":
            report["compiled_kernels"] = kernel_excerpts(program)
    return timed


def run(quick: bool = False) -> dict:
    import torch

    import labkit
    from labkit.costmodel import measure
    from labkit.generation.profile import pass_costs, pass_timings, samples_by_name, step_profile
    from labkit.model.invariance import default_kernels_report

    _, tok = labkit.load("smollm2-135m")
    ids = tok.encode_chat([{"role": "user", "content": PROMPT}])
    n, rounds = (16, 3) if quick else (48, 8)  # 8 paired rounds: a 95 % interval needs 6
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    call_us = measure.operator_call_us()
    print(f"  torch {torch.__version__}, {torch.get_num_threads()} threads, prompt {len(ids)} tokens, "
          f"load average {load:.1f}; a small operator call costs {call_us:.2f} µs here")
    if load > 0.5 * (os.cpu_count() or 1):
        print("  note: the machine is busy; ratios measured side by side still hold, absolute figures are low")
    report = {"threads": torch.get_num_threads(), "load_average": load, "prompt_tokens": len(ids), "formats": {},
              "operator_call_us": call_us}
    models = {}
    for name, loader in _formats().items():
        models[name] = model = loader()
        prof = step_profile(model, ids, steps=8)
        row = {k: prof[k] for k in ("step_ms", "profiled_step_ms", "matmul_ms", "other_ms", "outside_ms", "ops_per_step")}
        row["bytes_per_token"] = _bytes_per_token(model, len(ids) + n // 2)
        report["formats"][name] = row
        print(f"  {name:12s} {prof['ops_per_step']:5.0f} operator calls a step; {prof['step_ms']:5.1f} ms "
              f"({prof['profiled_step_ms']:5.1f} profiled = products "
              f"{prof['matmul_ms']:4.1f} + other operators {prof['other_ms']:4.1f} + between them {prof['outside_ms']:4.1f})")
        if name == "float32":
            model.lean_step = False
            plain = step_profile(model, ids, steps=8)
            model.lean_step = True
            row["plain_calls"] = {k: plain[k] for k in ("step_ms", "matmul_ms", "other_ms", "outside_ms", "ops_per_step")}
            print(f"  {'  plain calls':12s} {plain['ops_per_step']:5.0f} operator calls a step; {plain['step_ms']:5.1f} ms "
                  f"(F.linear, F.rms_norm: the same numbers)")
    timed = models if quick else _compile_all(models, ids, report)
    pass_run = pass_timings(timed, ids, KS, rounds=rounds)  # every sample kept in the report
    report["pass_samples"] = samples_by_name(pass_run)
    costs = {name: {k: pass_run[(name, k)].median for k in KS} for name in timed}
    print("  T(k) / T(1), one pass over k new tokens against one decode step (interleaved):")
    print("  " + " " * 21 + "".join(f"{'k=' + str(k):>7s}" for k in KS[1:]))
    for name, per_k in costs.items():
        row = report["formats"][name] if name in models else report["formats"][_base(name)]["compiled"]
        row["pass_ms"] = {k: 1e3 * s for k, s in per_k.items()}
        row["t_ratio"] = {k: per_k[k] / per_k[1] for k in KS}
        print(f"  {name:21s}" + "".join(f"{per_k[k] / per_k[1]:7.2f}" for k in KS[1:]))
    for name in (n for n in costs if n not in models):  # the step itself, eager against compiled, same run
        eager_ms, comp_ms = 1e3 * costs[_base(name)][1], 1e3 * costs[name][1]
        print(f"  {_base(name):12s} step {eager_ms:5.1f} ms eager, {comp_ms:5.1f} ms compiled ({eager_ms / comp_ms:.2f}x)")
    report["cpu_kernels"] = default_kernels_report()
    switched = pass_costs({name: _Invariant(m) for name, m in models.items()}, ids, KS, rounds=max(1, rounds // 2))
    print("  the batch-invariant mode (Transformer.batch_invariant): a k-token pass with it / without it:")
    for name, per_k in switched.items():  # the switch runs the eager step: compare with the eager passes
        report["formats"][name]["invariant_pass_ms"] = {k: 1e3 * s for k, s in per_k.items()}
        report["formats"][name]["invariant_cost"] = {k: per_k[k] / costs[name][k] for k in KS}
        print(f"  {name:12s}" + "".join(f"{per_k[k] / costs[name][k]:7.2f}" for k in KS[1:]))
    roof = [measure.read_bandwidth_gb_s(seconds=0.3)]  # a roofline sample before and after the rates
    del models, timed  # every side runs in a process of its own from here
    # eager formats only: the compiled step's decode rate is compiled_bench's (each start would load its program again)
    rates = peer_rates(list(report["formats"]), ids, n, rounds if quick else 2, report,
                       processes=1 if quick else PROCESSES)
    why = report.get("llama_cpp")
    roof.append(measure.read_bandwidth_gb_s(seconds=0.3))
    report["roofline_gb_s"] = statistics.median(roof)
    report["tok_s"] = rates
    print(f"  decode, {n} greedy tokens, {report['tok_s_protocol']}; streaming-read roofline "
          f"{report['roofline_gb_s']:.1f} GB/s (median of {len(roof)} samples)")
    for name, rate in rates.items():
        line = f"  {name:21s} {rate:6.1f} tok/s"
        if _base(name) in report["formats"]:
            gb_s = report["formats"][_base(name)]["bytes_per_token"] * rate / 1e9
            (report["formats"][_base(name)]["compiled"] if name.endswith(" compiled") else report["formats"][name])["gb_s"] = gb_s
            line += f"  {gb_s:5.1f} GB/s ({100 * gb_s / report['roofline_gb_s']:3.0f} % of the roofline)"
        vs = report.get("vs_llama_cpp", {}).get(name)
        if vs:
            line += f"  {vs_peer(vs)}"
        print(line)
    if why is not None:
        print(f"  llama.cpp: {why}")
    return report
