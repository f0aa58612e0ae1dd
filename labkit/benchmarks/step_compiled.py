"""The step bench's compiled half: every format's step as one inductor program (`Transformer.compile_step`).

Per format: the compile time cold (an empty inductor cache) and again from the disk cache (a
second `compile_step` in the same process), the kernels the program launches per step against
the eager step's operator calls, and whether 64 greedy tokens equal the eager step's (where
not: the first token that differs and the eager logits' top-2 margin there, against the
format's rounding step). The eager and compiled steps then race side by side in `step.run`
through `Toggle`: the same model with its compiled program switched on or off.
"""
from __future__ import annotations

import math

FRAGMENTS = {"RMSNorm (+ the residual add)": ("add", "rsqrt"), "RoPE (+ the cache write)": ("stack", "sub"),
             "SwiGLU": ("silu",)}


class Toggle:
    """`model` seen with its compiled program on (`compiled=True`) or off: the eager step, numbers alike."""

    def __init__(self, model, program, compiled: bool):
        self.model, self.program, self.on = model, program, compiled

    def __getattr__(self, name):
        return getattr(self.model, name)

    def _run(self, fn, *args, **kwargs):
        self.model.compiled = self.program if self.on else None
        try:
            return fn(*args, **kwargs)
        finally:
            self.model.compiled = self.program

    def __call__(self, *args, **kwargs):
        return self._run(self.model, *args, **kwargs)

    def step(self, *args, **kwargs):
        return self._run(self.model.step, *args, **kwargs)


def _greedy(model, ids: list[int], n: int):
    import torch

    from labkit.generation.stages import prefill

    state = prefill(model, ids, max_len=len(ids) + n + 1)
    tokens, margins = [], []  # margins: (top-1 minus top-2, one rounding step at top-1's size)
    with torch.inference_mode():
        logits = state.logits
        for _ in range(n):
            top = logits.float().topk(2).values
            margins.append((float(top[0] - top[1]), float(top[0].abs())))
            tokens.append(int(logits.argmax()))
            logits = model.step(torch.tensor([[tokens[-1]]]), state.cache)[0, -1]
    # the coarsest float dtype the step computes in (bf16 activations give float32 logits a bf16 resolution)
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()} | {logits.dtype} | {
        m.act_dtype for m in model.modules() if isinstance(getattr(m, "act_dtype", None), torch.dtype)}
    eps = max(torch.finfo(d).eps for d in dtypes)
    return tokens, [(gap, eps * 2.0 ** math.floor(math.log2(max(top, 1e-30)))) for gap, top in margins]


def compile_format(model, ids: list[int], n: int = 64) -> tuple[object, dict]:
    """Compile `model` once here (its program: launches, kernels, greedy tokens against eager's). Compile *times*
    come from fresh processes (`labkit.benchmarks.workers.compile_times`): inside one process inductor's
    in-memory code cache makes a second compile, and any compile after the first format's, warm."""
    import torch

    from labkit.generation.stages import decode, prefill
    from labkit.model.compiled import CompiledStep, program_summary

    eager_tokens, margins = _greedy(model, ids, n)
    row = {}
    model.compiled = program = CompiledStep(model, progress=False)
    state = prefill(model, ids, max_len=len(ids) + 12)
    decode(model, state, 1)  # the one-token program
    with torch.inference_mode():  # the program for passes of 2..16 tokens
        model.step(torch.full((1, 2), ids[-1]), state.cache)
    row["compile_in_process_s"] = sum(program.compile_s)
    model.compiled = program
    one = next(src for name, src in program.code.items() if "_t1_" in name)
    row["program"] = program_summary(one)
    tokens, _ = _greedy(model, ids, n)
    same = next((i for i, (a, b) in enumerate(zip(tokens, eager_tokens)) if a != b), None)
    row["tokens_equal_eager"] = n if same is None else same
    if same is not None:
        row["first_difference_margin"], row["rounding_step_there"] = margins[same]
    row["graphs"] = program.graphs
    return program, row


def kernel_excerpts(program, max_lines: int = 60) -> dict[str, dict]:
    """The one-token program's generated kernels for RMSNorm, RoPE and SwiGLU: name, launches a step and C++
    text. Of the kernels whose names hold the fragments, the one launched most (a per-layer kernel)."""
    from labkit.model.compiled import kernel_source, program_summary

    one = next(src for name, src in program.code.items() if "_t1_" in name)
    launches = program_summary(one)["fused_kernels"]
    out = {}
    for what, fragments in FRAGMENTS.items():
        names = sorted((n for n in launches if all(f in n for f in fragments)), key=lambda n: (-launches[n], "index" in n))  # not the embedding's
        found = kernel_source(one, names[0], max_lines=max_lines) if names else None
        if found:
            out[what] = {"kernel": found[0], "launches": launches[found[0]], "source": found[1]}
    return out


DISPATCH_EVENTS = ("TorchDynamo Cache Lookup", "Pregraph bytecode", "Torch-Compiled Region",
                   "AOTDispatcher Runtime Wrapper Prologue", "AOTDispatcher Runtime Wrapper Epilogue")


def compiled_profile(model, ids: list[int], steps: int = 8) -> dict:
    """Where a compiled decode step's time goes (the profiler's self times per step): the weight products, other
    ATen operators the program calls (allocations, attention, sizes), the generated program itself (its loops
    and C++ wrapper), Dynamo's per-call entry (the cache lookup and wrappers), and what no event claims.

    Dynamo's events are matched by prefix (torch 2.13 names the region "Torch-Compiled Region: <id>"). A product
    the C++ wrapper calls through the AOTI shim records no `aten::` event, so it lands inside "generated
    program": the split says so (`unseen`), and says what share the profiler added against the same steps timed
    without it (`labkit.measure.split`)."""
    import torch

    from labkit import measure
    from labkit.generation.profile import MATMUL_OPS, _quiet_stderr
    from labkit.generation.stages import decode, prefill

    state = prefill(model, ids, max_len=len(ids) + 4 * steps + 4)
    decode(model, state, 2)
    plain = measure.run({"step": lambda: decode(model, state, steps)}, rounds=1, warmup=0, per=steps,
                        machine=False)["step"].median
    with _quiet_stderr(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with measure.timer() as t:
            decode(model, state, steps)
    wall = t.seconds / steps
    ms = {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}
    parts = {"products_ms": sum(v for k, v in ms.items() if k in MATMUL_OPS),
             "other_ops_ms": sum(v for k, v in ms.items() if k.startswith("aten::") and k not in MATMUL_OPS),
             "program_ms": sum(v for k, v in ms.items() if k.startswith("## Call CompiledFxGraph")),
             "dynamo_entry_ms": sum(v for k, v in ms.items() if k.startswith(DISPATCH_EVENTS))}
    split = measure.split(parts, 1e3 * wall, 1e3 * plain, unseen=(
        "products the C++ wrapper calls through the AOTI shim (no aten:: event: counted in program_ms)",))
    return {"profiled_step_ms": 1e3 * wall, "step_ms": 1e3 * plain, "profiler_added": split.overhead, **parts,
            "rest_ms": split.unattributed_ms, "unseen": list(split.unseen)}
