"""The decode step as one compiled program: the model's own forward, traced into TorchInductor's C++.

An eager decode step of SmolLM2 is some three thousand operator calls, and on a CPU each has a
fixed cost (dispatch, an output allocation, Python between calls). `model.compile_step()` hands
the model's own pass (`Transformer.run_pass`, the code the eager step runs) to TorchInductor once,
with a `labkit.kvcache.bufferpass.BufferPass` for the cache: the per-layer buffers of the contiguous
cache, the new tokens' positions and the span of keys so far, all tensors. Inductor fuses the
elementwise work between the weight products into generated C++ loops (RMSNorm with the residual
add, RoPE with the cache write, SiLU·up), calls the weight products as extern kernels (MKL/oneDNN
for float, the int8/int4 and labkit's block kernels as they are), and runs it all from a C++ wrapper:
no Python between kernels. There is no second copy of the model: what the eager step computes, the
program computes; the few places where the eager step keeps something between calls (a transposed
view, the RoPE tables at the last positions, RMSNorm's constants) compute it afresh when
`torch.compiler.is_compiling()`, and the interleaved RoPE multiplies its pairs in real arithmetic there
(the complex product's parts, equal bit for bit in eager; inductor writes no code for complex numbers).

The weights are not frozen into the program: they are inputs of the graph, read from the model's modules at
each call, so an in-place change to a weight shows in the output. A program is tied to the modules it was traced
on: `column_major_()` and quantizing in place (`labkit.quant.quantize_model(..., inplace=True)`) drop the
programs, so the next pass compiles afresh; a copy of the model (`copy.deepcopy`, `quantize_model` without
`inplace`) does not carry them (it runs eagerly until `compile_step()` is called on it); and every pass checks
that the first block's products, the head and the embedding are the objects the programs were traced on (a
replaced module or weight there drops them too). A module replaced by hand elsewhere is not seen: call
`compile_step()` again after it.

Shapes are kept static so the program never recompiles during a decode: the cache is the contiguous one
(fixed capacity, one buffer per layer, written in place at `positions`), and the only sizes that move, the
number of keys so far and the cache's capacity, are symbolic dimensions. Programs are kept per batch size
and `last_only`: one for a one-token step (the GQA call the eager step makes) and one for passes of
2..`COMPILE_MAX_TOKENS` tokens (verification, small batches), each compiled on first use. Anything else runs
the eager step, whose numbers agree to rounding, not bit for bit (see Exactness): longer passes (a prompt),
other cache kinds, early exit, the batch-invariant mode, gradients, the first token of an empty cache and, for
the compiled step (not the exported one), a pass that fills the cache's last slot; `stats` counts why. The
exported step (`labkit.model.exported`) adds a third kind of program for models whose products are all
row-invariant block kernels: one 'rows' program for every pass of 1..16 tokens, batch-invariant mode included.

Exactness: the compiled program computes what the eager step computes, in float32 or the model's dtype, but
fused loops sum RMSNorm's squares and the attention's products in their own order, so logits agree to
rounding, not bit for bit (tests: greedy tokens equal, logits within 1e-4 relative in float32). Compiled
programs are cached on disk under `.build/inductor`, so a second process starts warm.

    >>> model.compile_step()                                   # doctest: +SKIP
    >>> model.step(ids, cache)  # a one-token step on a contiguous cache: the compiled program  # doctest: +SKIP
"""
from __future__ import annotations

import os
import shutil
import sys
import types
from collections import Counter

import torch

from labkit.kvcache.bufferpass import BufferPass
from labkit.measure.clock import now as clock_now

__all__ = ["CompiledStep", "COMPILE_MAX_TOKENS", "compiler_problem", "inductor_cache_dir", "kernel_source", "program_summary"]

# C++ wrapper (no Python between kernels) and bf16/fp16 intermediates rounded where the eager step rounds them
# (without it a fused kernel keeps them in float32: other bits, other tokens). `freezing` folds only what the
# graph holds as constants; the weights are graph inputs (read from the modules each call), so it leaves them be
COMPILE_OPTIONS = {"cpp_wrapper": True, "freezing": True, "emulate_precision_casts": True}
COMPILE_MAX_TOKENS = 16  # passes of up to this many tokens run compiled (verification, small batches)


def inductor_cache_dir() -> str:
    """Where inductor keeps compiled programs: $TORCHINDUCTOR_CACHE_DIR, else `.build/inductor/<ATen capability>`
    beside the package. One folder per instruction set: inductor's own cache keys do not tell an emulated
    smaller CPU (`ATEN_CPU_CAPABILITY=avx2`) from the real one, and a program built for one gives NaN on the other."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".build", "inductor")
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current in (None, "", os.path.abspath(default_cache_dir())) or current.startswith(root + os.sep):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, torch.backends.cpu.get_cpu_capability().lower())
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def compiler_problem() -> str | None:
    """Why inductor cannot build C++ here (no compiler found), or None."""
    cxx = os.environ.get("CXX") or "g++"
    if shutil.which(cxx) is None and shutil.which("c++") is None and shutil.which("clang++") is None:
        return f"no C++ compiler found ({cxx}, c++ or clang++ on PATH); install g++ (Debian: apt-get install g++)"
    return None


def _pass(model, ids, positions, span, keys, values, last_only: bool, rows: bool):
    """The model's own pass (`Transformer.run_pass`) over a contiguous cache's buffers (`BufferPass`): what is traced."""
    return model.run_pass(ids, positions, BufferPass(keys, values, positions, span, rows), last_only)


def row_invariant_products(model) -> bool:
    """Whether every weight product of the model, the LM head included, is one of labkit's block kernels, which give a
    row the same bits whatever the other rows of its pass (`labkit.quant.q4q8`)."""
    names = ("Q4Q8Linear", "Q8Q8Linear")
    products = [m for b in model.layers for m in (b.attn.wqkv, b.attn.wo, b.mlp.w_gate_up, b.mlp.w_down)]
    return model.lm_head is not None and all(type(m).__name__ in names for m in products + [model.lm_head])


class CompiledStep:
    """A model's compiled passes, keyed by (batch, program, last_only, cache and ids dtypes); the program is 't1'
    (one token), 'tk' (2..16 tokens) or, for the exported step of a model on row-invariant kernels, 'rows' (1..16).

    Each key gets its own copy of `_pass`'s code, so Dynamo holds one entry per copy and its
    guards can be skipped at call time (the key, checked here in Python, is what they would check).
    """

    last_slot = False  # whether a pass that fills the cache's last slot runs the program (the exported one does)

    def __init__(self, model, progress: bool = True):
        if model.config.compressed_attention:
            raise ValueError("compile_step is not implemented for compressed attention (csa_block > 0): "
                             "its layers attend through their own cache")
        if model.config.layer_windows:
            raise ValueError("compile_step is not implemented for sliding layers (layer_windows): a program would "
                             "have to choose per pass whether a layer's window has slid")
        why = compiler_problem()
        if why:
            raise RuntimeError(f"compile_step needs a C++ compiler: {why}")
        inductor_cache_dir()
        self.model, self.progress = model, progress
        self._fns: dict = {}
        self.graphs = 0  # programs compiled (Dynamo graphs handed to inductor) for this model
        self.compile_s: list[float] = []
        self.calls, self.eager = 0, Counter()  # compiled passes; eager passes by reason
        self.code: dict[str, str] = {}  # program name -> the generated source (C++ kernels and wrapper)
        self.resets = 0  # times the programs were dropped because the model changed under them
        self._anchor = _anchor(model)
        for block in model.layers:  # the RoPE tables exist before anything is traced (a trace keeps nothing)
            model.rope_of(block).tables(model.dtype)
        self.rows = False  # one 'rows' program for passes of 1..16 tokens (`ExportedStep` on row-invariant kernels)

    def __deepcopy__(self, memo):
        """A copy of the model does not carry the programs (they were traced on the original's modules)."""
        return None

    def reset(self) -> None:
        """Drop every program: the model's modules or weights changed; the next pass compiles afresh."""
        if self._fns:
            self.resets += 1
        self._fns.clear()
        self._anchor = _anchor(self.model)

    def _backend(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        self.graphs += 1
        return compile_fx(gm, example_inputs, config_patches=COMPILE_OPTIONS)

    def eager_reason(self, ids: torch.Tensor, cache, n_layers) -> str | None:
        """Why this pass runs eagerly, or None when the compiled program takes it."""
        from labkit.kvcache.contiguous import ContiguousCache

        if _anchor(self.model) != self._anchor:
            self.reset()
        if torch.is_grad_enabled():
            return "gradients on"
        if type(cache) is not ContiguousCache:
            return "no cache" if cache is None else f"cache kind {cache.kind!r}"
        if n_layers is not None:
            return "early exit"
        if self.model.batch_invariant and not self.rows:
            return "batch-invariant mode"
        if ids.shape[1] > COMPILE_MAX_TOKENS:
            return f"pass over more than {COMPILE_MAX_TOKENS} tokens"
        if cache.seq_len + ids.shape[1] < 2:
            return "first token of an empty cache"
        if not self.last_slot and cache.seq_len + ids.shape[1] >= cache.max_len:  # keys so far = the whole buffer:
            return "a pass into the cache's last slot"  # Dynamo's guards, traced with fewer keys than slots, refuse it
        if ids.device != self.model.device or cache.device != self.model.device:
            return "device"
        return None

    def run(self, ids: torch.Tensor, cache, last_only: bool) -> torch.Tensor:
        """The compiled pass (call only when `eager_reason` is None): begins and ends the cache's pass."""
        B, T = ids.shape
        # the rows program computes every row (a row's bits do not depend on the others) and keeps the last after
        keep_last = bool(last_only) and not self.rows
        key = (B, "rows" if self.rows else "t1" if T == 1 else "tk", keep_last, cache.dtype, ids.dtype)
        fn = self._fns.get(key)
        positions = cache.begin(T)
        try:
            if cache.pass_end > self.model.config.max_seq_len:
                raise ValueError(f"sequence of {cache.pass_end} tokens is longer than the context window "
                                 f"of {self.model.config.max_seq_len} tokens")
            span = torch.arange(cache.pass_end, device=cache.device)
            torch._dynamo.mark_dynamic(span, 0)
            if key[1] == "tk":
                torch._dynamo.mark_dynamic(ids, 1)
                torch._dynamo.mark_dynamic(positions, 0)
            keys, values = zip(*cache.layer_buffers())
            for buf in keys + values:  # the capacity: one symbol for all (equal sizes share one)
                torch._dynamo.mark_dynamic(buf, 2)
            args = (self.model, ids, positions, span, list(keys), list(values), keep_last, self.rows)
            if fn is None:
                fn, out = self._compile(key, args)
                self._fns[key] = fn
            else:
                with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                    out = fn(*args)
        except BaseException:
            cache.abort()
            raise
        self.calls += 1
        cache.end()
        return out[:, -1:] if last_only and self.rows and T > 1 else out

    def _compile(self, key, args):
        B, one = key[0], key[1] == "t1"
        name = f"labkit_step_b{B}_{key[1]}_{'last' if key[2] else 'all'}_{len(self._fns)}"
        code = _pass.__code__.replace(co_name=name)
        fn = torch.compile(types.FunctionType(code, _pass.__globals__, name), backend=self._backend,
                           fullgraph=True, dynamic=False)
        if self.progress:
            print(f"compiling the {'one-token step' if one else 'pass over 2..16 tokens'} (batch {B}) with "
                  f"inductor; cached under {inductor_cache_dir()} ...", file=sys.stderr, flush=True)
        from unittest import mock

        from torch._inductor.graph import GraphLowering

        start = clock_now()
        with mock.patch.object(GraphLowering, "save_output_code", lambda code: self.code.__setitem__(name, code)):
            out = fn(*args)  # the first call compiles (or loads from the disk cache) and runs the pass
        self.compile_s.append(clock_now() - start)
        return fn, out

    def stats(self) -> dict:
        """graphs compiled, compile seconds, compiled passes, eager passes by reason."""
        return {"graphs": self.graphs, "compile_s": list(self.compile_s), "compiled_calls": self.calls,
                "eager_calls": dict(self.eager), "programs": len(self._fns), "resets": self.resets}



def _anchor(model) -> tuple:
    """Identities a pass checks cheaply (a few attribute reads): block 0's product modules and weights, the head, the
    embedding's weight. Quantizing or re-laying out a model replaces them."""
    first = model.layers[0]
    mods = (first.attn.wqkv, first.attn.wo, first.mlp.w_gate_up, first.mlp.w_down)
    return (tuple(id(m) for m in mods), tuple(id(m._parameters.get("weight")) for m in mods),
            id(model.lm_head), id(model.tok_embeddings.weight))


def program_summary(source: str) -> dict:
    """What one generated program launches per pass: its fused C++ kernels and its extern calls, by name."""
    import re

    calls = re.findall(r"^\s+(?:AOTI_TORCH_ERROR_CODE_CHECK\()?(cpp_fused_\w+|aoti_torch_cpu_\w+)\(", source, re.M)
    kernels = Counter(c for c in calls if c.startswith("cpp_fused_"))
    extern = Counter(c[len("aoti_torch_cpu_"):] for c in calls if c.startswith("aoti_torch_cpu_"))
    return {"fused_kernels": dict(kernels), "extern_calls": dict(extern),
            "launches": sum(kernels.values()) + sum(extern.values())}


def kernel_source(source: str, *fragments: str, max_lines: int = 60) -> tuple[str, str] | None:
    """The first generated kernel whose name holds every fragment (or is the one full name given): (name, its C++ text without lone braces
    and error-flag bookkeeping, up to max_lines), or None."""
    import re

    for match in re.finditer(r'^extern "C"\s+void\s+(cpp_fused_\w+)\(', source, re.M):
        name = match.group(1)
        body_start = source.find("{", match.end())
        wanted = name == fragments[0] if fragments[0].startswith("cpp_fused_") else all(f in name for f in fragments)
        if wanted and body_start > 0 and source[match.end():body_start].count(";") == 0:
            end = source.find("\n}\n", body_start)
            noise = ("inductor_cpu_integer_div_error", "C10_LIKELY", "#pragma")  # bookkeeping, not the arithmetic
            lines = [line for line in source[match.start():end + 2].splitlines()
                     if line.strip() not in ("{", "}") and not any(n in line for n in noise)]
            body = "\n".join(lines[:max_lines] + (["    ..."] if len(lines) > max_lines else []))
            return name, body
    return None
