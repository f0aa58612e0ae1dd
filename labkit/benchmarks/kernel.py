"""labkit's own block kernels on SmolLM2's GGUF file: products over k rows, the whole step, decode beside llama.cpp.

Six parts, printed and returned (every timing through `labkit.measure`):

- products: one step's weight products (the 120 Q4_1 matrices and the Q8_0 head) on M = 1, 4, 8, 16
  input rows, labkit's int4 × int8 kernel (`labkit.quant.q4q8`) against torch's int4 kernel with
  bfloat16 activations (its fast path), interleaved rounds; T(M)/T(1) of each;
- the step: T(k)/T(1) of a k-token pass of the model on labkit's kernels (a prompt in the cache, the
  pass timed alone, a fresh cache each round), k = 1, 4, 8, 16;
- decode: tokens/s of labkit's kernels (eager, and the step exported with AOTInductor: `export_step`, its
  packages built before the timing; what building costs cold and loading costs, each in a fresh process
  with an empty package folder, `export_times`), of torch's int4 kernel
  (bfloat16) and of llama.cpp on the same file, each in its own process, rounds alternating (`labkit.benchmarks.workers`), ratios with their
  intervals (`measure.compare`). On a CPU with AVX-512 the same again with the labkit workers under
  AVX2 emulation (`labkit.measure.cpu.ISA_EMULATION`) against a llama.cpp built for AVX2 only, when
  `LABKIT_LLAMA_AVX2` names a folder holding such a `llama_cpp` (pip install --target FOLDER with
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON");
- the exported step (`export_step`: one program for passes of 1..16 tokens on these kernels): its T(k)/T(1),
  and a profiled decode step split into the products (labkit's operators, which the program calls), the other
  operators it calls, and the rest (its generated loops and wrapper, the decode loop);
- prompt lookup (γ = 8) against plain decoding on an input-grounded prompt, whole replies timed, eager and
  exported, natively and under AVX2 emulation, each in its own process: the speed-up with its interval,
  α, and whether the replies are identical;
- the bandwidth limit: bytes one step reads (the blocks and the KV cache at that context) over the
  streaming-read bandwidth measured in the same run: the step's share of the physical limit.

`LABKIT_LLAMA_AVX2=FOLDER labkit bench --only kernel --json data/kernel_bench.json` writes the file chapter 06 reads.
"""
from __future__ import annotations

import os

TITLE = "labkit's int4 × int8 kernel: products over k rows, the step's T(k), decode beside llama.cpp per ISA"

PROMPT = "Explain in two sentences why the sky is blue."
ROWS = (1, 4, 8, 16)
KERNEL, EXPORTED, TORCH_INT4 = "labkit Q4_1 × Q8", "labkit Q4_1 × Q8 exported", "torch int4 (bf16)"
SPECS = {KERNEL: {"side": "labkit", "weights": "gguf"},
         EXPORTED: {"side": "labkit", "weights": "gguf", "export": True},
         TORCH_INT4: {"side": "labkit", "weights": "gguf", "dtype": "bfloat16"}}


def products_over_rows(model, other, rounds: int = 5) -> dict:
    """M -> `measure.Run` of one step's products on M rows (M in `ROWS`): the kernel layers of `model` (labkit's)
    against the `QuantLinear` layers of `other` (torch's int4, bfloat16 activations), interleaved."""
    import torch

    from labkit import measure
    from labkit.quant.q4q8 import Q4Q8Linear, Q8Q8Linear
    from labkit.quant.linear import QuantLinear

    ours = [m for m in model.modules() if isinstance(m, (Q4Q8Linear, Q8Q8Linear))]
    theirs = [m for m in other.modules() if isinstance(m, QuantLinear)]
    out = {}
    for rows in ROWS:
        xs = [torch.randn(rows, m.in_features) for m in ours]
        xb = [torch.randn(rows, m.in_features, dtype=torch.bfloat16) for m in theirs]
        with torch.inference_mode():
            r = measure.run({KERNEL: lambda: [m(x) for m, x in zip(ours, xs)],
                             TORCH_INT4: lambda: [m(x) for m, x in zip(theirs, xb)]}, rounds=rounds, machine=False)
        out[rows] = r
    return out


def step_passes(model, ids: list[int], rounds: int = 5):
    """T(k) of one k-token pass after the prompt, each round on a fresh cache holding the prompt."""
    import torch

    from labkit import measure

    caches = {}

    def setup(name):
        cache = model.new_cache(max_len=len(ids) + 32)
        with torch.inference_mode():
            model.step(torch.tensor([ids]), cache)
        caches[name] = cache

    def pass_of(k):
        x = torch.full((1, k), 42)
        return lambda: model.step(x, caches[f"k={k}"])

    with torch.inference_mode():
        return measure.run({f"k={k}": pass_of(k) for k in ROWS}, rounds=rounds, setup=setup, machine=False)


def prompt_lookup(model, tok, n: int, rounds: int, gamma: int = 8) -> dict:
    """Plain greedy decoding against prompt lookup (γ = `gamma`) on an input-grounded prompt (`SMOL_PROMPTS["edit
    code"]`), whole replies timed (prefill, drafting and verification included), interleaved: the ratio with its
    interval (`measure.compare`), α, and whether the replies are identical."""
    from labkit import measure
    from labkit.benchmarks.speculative import SMOL_PROMPTS
    from labkit.generation.reply import generate as plain_generate
    from labkit.speculative.decode import generate as spec_generate
    from labkit.speculative.drafters import PromptLookup

    prompt = SMOL_PROMPTS["edit code"][1]
    outs = {}

    def plain():
        outs["plain"] = plain_generate(model, tok, prompt, max_new_tokens=n)

    def spec():
        outs["spec"] = spec_generate(model, PromptLookup(), tok, prompt, gamma=gamma, max_new_tokens=n)

    name = f"prompt lookup γ={gamma}"
    r = measure.run({"plain": plain, name: spec}, rounds=rounds, machine=False)
    c = measure.compare(r[name], r["plain"])  # speculative time / plain time; `speedup` is its inverse
    same = outs["plain"].token_ids == outs["spec"].token_ids
    return {"run": r.as_dict(), "vs_plain": c.as_dict(), "speedup": c.speedup, "alpha": outs["spec"].alpha,
            "same_as_plain": same, "tokens": len(outs["spec"].token_ids), "text": str(c)}


def lookup_report(n: int, rounds: int) -> dict:
    """`prompt_lookup` on labkit's kernels, eager and exported, in this process (the ISA it was started with)."""
    import torch

    import labkit
    from labkit.measure.cpu import describe

    model, tok = labkit.load("smollm2-135m", weights="gguf")
    out = {"cpu": describe(), "isa": torch.backends.cpu.get_cpu_capability()}
    with torch.inference_mode():
        out["eager"] = prompt_lookup(model, tok, n, rounds)
        model.export_step(progress=False)
        out["exported"] = prompt_lookup(model, tok, n, rounds)
    out["exported"]["eager_calls"] = dict(model.compiled.stats()["eager_calls"])
    return out


def _lookup(n: int, rounds: int, isa: str | None) -> dict:
    """`lookup_report` in a fresh process (under `isa` emulation where given), printed."""
    import json
    import subprocess
    import sys

    from labkit.measure.cpu import ISA_EMULATION

    env = {**os.environ, **(ISA_EMULATION[isa] if isa else {})}
    code = f"import json; from labkit.benchmarks.kernel import lookup_report; print(json.dumps(lookup_report({n}, {rounds})))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        return {"skipped": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for step in ("eager", "exported"):
        row = out[step]
        print(f"    {step:8s} {row['text']}; α {row['alpha']:.2f}; reply identical to plain decoding: {row['same_as_plain']}")
    return out


EXPORT_TIMES = """import json, torch, labkit
from labkit.measure.clock import now
start = now()
model, tok = labkit.load("smollm2-135m", weights="gguf")
loaded = now()
model.export_step(progress=False)
with torch.inference_mode():
    model.step(torch.tensor([tok.encode("Why is the sky blue?")]), model.new_cache(max_len=16))
done = now()
s = model.compiled.stats()
print(json.dumps({"model_s": loaded - start, "ready_s": done - loaded, "build_s": sum(s["compile_s"]),
                  "load_s": sum(s["load_s"]), "programs": s["programs"]}))"""


def export_times(isa: str | None) -> dict:
    """The exported step's cost in fresh processes, into an empty package folder: the first builds it (cold), the
    second loads what the first built. Seconds: building, loading, and each process's time from model to ready."""
    import json
    import subprocess
    import sys
    import tempfile

    from labkit.measure.cpu import ISA_EMULATION

    out = {}
    with tempfile.TemporaryDirectory(prefix="labkit-export-") as folder:
        env = {**os.environ, **(ISA_EMULATION[isa] if isa else {}), "LABKIT_EXPORT_DIR": folder,
               "TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "inductor")}  # cold: no compiled code to reuse
        for phase in ("cold", "from disk"):
            done = subprocess.run([sys.executable, "-c", EXPORT_TIMES], env=env, capture_output=True, text=True,
                                  timeout=1800)
            if done.returncode:
                return {"skipped": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
            out[phase] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"    exported step, fresh processes: built cold in {out['cold']['build_s']:.1f} s "
          f"({out['cold']['programs']} program), loaded from disk in {out['from disk']['load_s']:.2f} s")
    return out


def _decode(ids: list[int], n: int, rounds: int, isa: str | None, processes: int = 1) -> dict:
    """tok/s of labkit's kernels, torch's int4 and llama.cpp, each in its own process, `rounds` rounds in each of
    `processes` fresh starts; `isa`: emulate it for labkit."""
    from labkit import measure
    from labkit.benchmarks import workers
    from labkit.measure.cpu import ISA_EMULATION

    env = ISA_EMULATION[isa] if isa else None
    peer_env, peer_name = None, workers.LLAMA_CPP
    if isa:
        folder = os.environ.get("LABKIT_LLAMA_AVX2", "")
        if not folder or not os.path.isdir(folder):
            return {"skipped": f"no AVX2-only llama.cpp: set LABKIT_LLAMA_AVX2 to its folder (got {folder!r})"}
        peer_env, peer_name = {"PYTHONPATH": folder}, f"{workers.LLAMA_CPP} (AVX2 build)"
    infos: dict = {}
    run, why = workers.rates_in_own_processes(SPECS, ids, n, rounds, env=env, peer_env=peer_env, peer_name=peer_name,
                                              infos=infos, processes=processes)
    sides_info = {name: {"build_s": i["compile_s"], "load_s": i["load_s"]} for name, i in infos.items()
                  if "compile_s" in i}
    level = measure.at_level(run)  # the process-level medians of a run over several starts
    out = {"run": run.as_dict(), "isa": isa or "native", "tok_s": {k: 1 / t.median for k, t in level.items()},
           "build_s": sides_info}
    for name, t in level.items():
        print(f"    {name:28s} {1 / t.median:7.1f} tok/s (IQR {t.iqr / t.median:.0%} over {t.rounds} "
              f"{'starts' if level is not run else 'rounds'})")
    for name, t in sides_info.items():
        print(f"    {name}: its programs built in {t['build_s']:.1f} s, loaded from disk in {t['load_s']:.2f} s "
              f"(before the timing)")
    if why:
        out["llama_cpp"] = why
        print(f"    (no llama.cpp row: {why})")
        return out
    out["vs_llama_cpp"] = {}
    for name in SPECS:
        c = measure.compare_starts(run, name, peer_name)
        out["vs_llama_cpp"][name] = c.as_dict()
        print(f"    {c}")
    return out


def run(quick: bool = False) -> dict:
    import torch

    import labkit
    from labkit.costmodel.measure import read_bandwidth_gb_s
    from labkit.measure import MIN_PROCESSES
    from labkit.measure.cpu import describe
    from labkit.quant import model_nbytes, native

    built, line = native.status()
    print(f"  {describe()}\n  kernels: {line}")
    if not built:
        return {"skipped": line}
    model, tok = labkit.load("smollm2-135m", weights="gguf")
    other = labkit.load("smollm2-135m", dtype="bfloat16", weights="gguf")[0]
    ids = tok.encode(PROMPT)
    rounds = 5 if quick else 10
    report = {"cpu": describe(), "kernels": line, "path": native.path_for()}
    print("  one step's products (120 Q4_1 matrices + the Q8_0 head), ms, and T(M)/T(1):")
    prods = products_over_rows(model, other, rounds)
    report["products"] = {str(m): r.as_dict() for m, r in prods.items()}
    for name in (KERNEL, TORCH_INT4):
        t1 = prods[1][name].median
        cells = "  ".join(f"M={m}: {prods[m][name].median * 1e3:6.2f} ({prods[m][name].median / t1:4.2f})" for m in ROWS)
        print(f"    {name:20s} {cells}")
    del other
    steps = step_passes(model, ids, rounds)
    t1 = steps["k=1"].median
    report["step"] = {"run": steps.as_dict(), "ratio": {k: steps[f"k={k}"].median / t1 for k in ROWS}}
    print("  the step (labkit's kernels), T(k)/T(1): "
          + "  ".join(f"k={k}: {steps[f'k={k}'].median * 1e3:.2f} ms ({steps[f'k={k}'].median / t1:.2f})" for k in ROWS))
    from labkit.measure.clock import now

    start = now()
    model.export_step(progress=False)  # built here, or loaded: the packages are keyed by weights, code and ISA
    with torch.inference_mode():
        model.step(torch.tensor([ids]), model.new_cache(max_len=len(ids) + 32))  # the program is built or loaded now
    ready = now() - start
    steps_x = step_passes(model, ids, rounds)
    t1x = steps_x["k=1"].median
    from labkit.generation.profile import step_profile

    split = step_profile(model, ids, steps=32)  # the products are labkit's operators, called from the program
    report["step_exported"] = {"run": steps_x.as_dict(), "ratio": {k: steps_x[f"k={k}"].median / t1x for k in ROWS},
                               "ready_s": ready, "profile": split,
                               "stats": {k: v for k, v in model.compiled.stats().items()
                                         if k in ("programs", "compile_s", "load_s", "eager_calls")}}
    print(f"  the exported step (one program for 1..16 tokens, ready in {ready:.1f} s), T(k)/T(1): "
          + "  ".join(f"k={k}: {steps_x[f'k={k}'].median * 1e3:.2f} ms ({steps_x[f'k={k}'].median / t1x:.2f})" for k in ROWS))
    print(f"    profiled decode step {split['profiled_step_ms']:.2f} ms (unprofiled {split['step_ms']:.2f}) = products "
          f"{split['matmul_ms']:.2f} + other operators {split['other_ms']:.2f} + the rest {split['outside_ms']:.2f} "
          f"(the program's own loops, its wrapper, the decode loop's Python)")
    model.compiled = None
    n = 32 if quick else 64
    kv = model.config.kv_bytes_per_token(4) * (len(ids) + n // 2)
    step_bytes = model_nbytes(model) + kv
    bw = read_bandwidth_gb_s(seconds=1.0) * 1e9
    report["bandwidth"] = {"step_bytes": step_bytes, "read_gb_s": bw / 1e9, "limit_tok_s": bw / step_bytes}
    print(f"  a step reads {step_bytes / 1e6:.1f} MB (blocks + KV); streaming read {bw / 1e9:.1f} GB/s: "
          f"at most {bw / step_bytes:.0f} tok/s")
    del model
    report["decode"] = {}
    isas = [None] + (["avx2"] if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else [])
    for isa in isas:
        print(f"  decode, {n} tokens, each side in its own process ({isa or 'native'} ISA):")
        # --quick: one process; else every side started afresh 6 times, 2 rounds each
        d = _decode(ids, n, rounds, isa) if quick else _decode(ids, n, 2, isa, MIN_PROCESSES)
        report["decode"][isa or "native"] = d
        d["export_times"] = export_times(isa)
        if "tok_s" in d and isa is None:
            for name in (KERNEL, EXPORTED):
                share = d["tok_s"][name] / report["bandwidth"]["limit_tok_s"]
                report["bandwidth"][f"share {name}"] = share
                print(f"    {name} reaches {share:.0%} of the bandwidth limit")
        elif "skipped" in d:
            print(f"    (skipped: {d['skipped']})")
    report["prompt_lookup"] = {}
    for isa in isas:
        print(f"  prompt lookup on an input-grounded prompt, {n} tokens, whole replies ({isa or 'native'} ISA, own process):")
        report["prompt_lookup"][isa or "native"] = _lookup(n, rounds, isa)
    return report
