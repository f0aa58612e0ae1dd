"""The decode step as one compiled program: TorchInductor's C++ kernels and its C++ wrapper.

An eager decode step of SmolLM2 is some three thousand operator calls, and on a CPU each has a
fixed cost (dispatch, an output allocation, Python between calls). `model.compile_step()` hands
the whole stack to TorchInductor once: it traces one step (embedding → 30 blocks → LM head) into
one graph, fuses the elementwise work between the weight products into generated C++ loops
(RMSNorm with the residual add, RoPE with the cache write, SiLU·up), calls the weight products
as extern kernels (MKL/oneDNN for float, the packed int8/int4 kernels as they are), and runs it
all from a C++ wrapper: no Python between kernels. The weights are not frozen into the program: they
are inputs of the graph, read from the model's modules at each call, so an in-place change to a weight
shows in the output. A program is tied to the modules it was traced on: `column_major_()` and quantizing
in place (`labkit.quant.quantize_model(..., inplace=True)`) drop the programs, so the next pass compiles
afresh; a copy of the model (`copy.deepcopy`, `quantize_model` without `inplace`) does not carry them (it runs
eagerly until `compile_step()` is called on it); and every pass checks that the first block's products,
the head and the embedding are the objects the programs were traced on (a replaced module or weight there
drops them too). A module replaced by hand elsewhere is not seen: call `compile_step()` again after it.

Shapes are kept static so the program never recompiles during a decode: the cache is the
contiguous one (fixed capacity, one buffer per layer, written in place at `positions`), and
the only sizes that move, the number of keys so far and the cache's capacity, are symbolic
dimensions. Programs are kept per batch size and `last_only`: one for a one-token step (the GQA
call the eager step makes) and one for passes of 2..`COMPILE_MAX_TOKENS` tokens (verification,
small batches), each compiled on first use. Anything else runs the eager step, whose numbers agree
to rounding, not bit for bit (see Exactness): longer passes (a prompt), other cache kinds, early exit, the batch-invariant mode,
gradients, the first token of an empty cache and a pass that fills the cache's last slot (where
the keys so far are the whole buffer, which another program would have to handle); `stats` counts why.

Exactness: the compiled program computes what the eager step computes, in float32 or the model's
dtype, but fused loops sum RMSNorm's squares and the attention's products in their own order and
RoPE is written in real arithmetic where the eager step multiplies complex numbers, so logits
agree to rounding, not bit for bit (tests: greedy tokens equal, logits within 1e-4 relative in
float32). Compiled programs are cached on disk under `.build/inductor`, so a second process
starts warm.

    >>> model.compile_step()                                   # doctest: +SKIP
    >>> model.step(ids, cache)  # a one-token step on a contiguous cache: the compiled program
"""
from __future__ import annotations

import os
import shutil
import sys
import types
from collections import Counter

import torch
import torch.nn.functional as F

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


def _rms(x: torch.Tensor, norm) -> torch.Tensor:
    if x.dtype != torch.float32:
        return F.rms_norm(x, norm.weight.shape, norm.weight, norm.eps)
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + norm.eps) * norm.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """RoPE in real arithmetic: x [B, T, heads, D]; cos, sin [T, 1, D/2] (interleaved) or [T, 1, D] (half)."""
    if layout == "interleaved":
        x0, x1 = x[..., 0::2].float(), x[..., 1::2].float()
        return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2).to(x.dtype)
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def _product(module, x: torch.Tensor) -> torch.Tensor:
    """x @ Wᵀ: the float layer's one matmul (inductor picks the kernel), any quantized layer's own forward."""
    if type(module).__name__ == "Linear":
        return torch.mm(x, module.weight.t())
    return module(x)


def _program(model, cos, sin, ids, positions, span, keys, values, last_only: bool):
    """One pass over ids [B, T] at `positions` [T] into per-layer caches [B, Hkv, C, D]; span = arange(keys so far)."""
    cfg = model.config
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    B, T = ids.shape
    n = span.shape[0]
    x = model.tok_embeddings.weight[ids.reshape(-1)]  # [B·T, d]
    c, s = cos[positions][:, None], sin[positions][:, None]
    mask = None if T == 1 else span[None, :] <= positions[:, None]  # [T, n]
    for i, block in enumerate(model.layers):
        qkv = _product(block.attn.wqkv, _rms(x, block.attn_norm)).view(B, T, H + 2 * Hkv, D)
        qk = _rotate(qkv[:, :, :H + Hkv], c, s, cfg.rope_layout)
        keys[i][:, :, positions] = qk[:, :, H:].transpose(1, 2).to(keys[i].dtype)
        values[i][:, :, positions] = qkv[:, :, H + Hkv:].transpose(1, 2).to(values[i].dtype)
        kk, vv = keys[i][:, :, :n], values[i][:, :, :n]
        if T == 1:  # the eager step's call: the g query heads of a group as g rows against their KV head
            o = F.scaled_dot_product_attention(qk[:, :, :H].reshape(B, Hkv, H // Hkv, D), kk, vv).reshape(B, H * D)
        else:
            o = F.scaled_dot_product_attention(qk[:, :, :H].transpose(1, 2), kk, vv, attn_mask=mask,
                                               enable_gqa=H != Hkv).transpose(1, 2).reshape(B * T, H * D)
        x = x + _product(block.attn.wo, o)
        gate_up = _product(block.mlp.w_gate_up, _rms(x, block.ffn_norm))
        x = x + _product(block.mlp.w_down, F.silu(gate_up[:, :cfg.ffn_dim]) * gate_up[:, cfg.ffn_dim:])
    if last_only and T > 1:
        x = x.view(B, T, -1)[:, -1]
    h = _rms(x, model.norm)
    logits = torch.mm(h, model.tok_embeddings.weight.t()) if model.lm_head is None else _product(model.lm_head, h)
    return logits.view(B, -1, logits.shape[-1])


class CompiledStep:
    """A model's compiled passes, keyed by (batch, one token or several, last_only, cache and ids dtypes).

    Each key gets its own copy of `_program`'s code, so Dynamo holds one entry per copy and its
    guards can be skipped at call time (the key, checked here in Python, is what they would check).
    """

    def __init__(self, model, progress: bool = True):
        if model.config.compressed_attention:
            raise ValueError("compile_step is not implemented for compressed attention (csa_block > 0): "
                             "its layers attend through their own cache")
        cfg = model.config
        if cfg.norm_placement != "pre" or cfg.qk_norm or cfg.activation != "silu" or cfg.embed_scale != 1.0 \
                or cfg.layer_windows:
            raise ValueError("compile_step is implemented for the Llama block only; this config has Gemma-style "
                             "parts (sandwich norms, QK-norm, GeGLU, an embedding scale or sliding layers)")
        why = compiler_problem()
        if why:
            raise RuntimeError(f"compile_step needs a C++ compiler: {why}")
        inductor_cache_dir()
        self.model, self.progress = model, progress
        self._fns: dict = {}
        dtype = torch.float32 if model.config.rope_layout == "interleaved" else model.dtype
        tables = model.rope.tables(dtype)
        cos, sin = (tables.real, tables.imag) if model.config.rope_layout == "interleaved" else tables
        self.cos, self.sin = cos.contiguous(), sin.contiguous()
        self.graphs = 0  # programs compiled (Dynamo graphs handed to inductor) for this model
        self.compile_s: list[float] = []
        self.calls, self.eager = 0, Counter()  # compiled passes; eager passes by reason
        self.code: dict[str, str] = {}  # program name -> the generated source (C++ kernels and wrapper)
        self.resets = 0  # times the programs were dropped because the model changed under them
        self._anchor = _anchor(model)

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
        if self.model.batch_invariant:
            return "batch-invariant mode"
        if ids.shape[1] > COMPILE_MAX_TOKENS:
            return f"pass over more than {COMPILE_MAX_TOKENS} tokens"
        if cache.seq_len + ids.shape[1] < 2:
            return "first token of an empty cache"
        if cache.seq_len + ids.shape[1] >= cache.max_len:  # keys[:n] is then the whole buffer: another program
            return "a pass into the cache's last slot"
        if ids.device != self.model.device or cache.device != self.model.device:
            return "device"
        return None

    def run(self, ids: torch.Tensor, cache, last_only: bool) -> torch.Tensor:
        """The compiled pass (call only when `eager_reason` is None): begins and ends the cache's pass."""
        B, T = ids.shape
        key = (B, T == 1, bool(last_only), cache.dtype, ids.dtype)
        fn = self._fns.get(key)
        positions = cache.begin(T)
        try:
            if cache.pass_end > self.model.config.max_seq_len:
                raise ValueError(f"sequence of {cache.pass_end} tokens is longer than the context window "
                                 f"of {self.model.config.max_seq_len} tokens")
            span = torch.arange(cache.pass_end, device=cache.device)
            torch._dynamo.mark_dynamic(span, 0)
            if T > 1:
                torch._dynamo.mark_dynamic(ids, 1)
                torch._dynamo.mark_dynamic(positions, 0)
            keys, values = zip(*cache.layer_buffers())
            for buf in keys + values:  # the capacity: one symbol for all (equal sizes share one)
                torch._dynamo.mark_dynamic(buf, 2)
            args = (self.model, self.cos, self.sin, ids, positions, span, list(keys), list(values), bool(last_only))
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
        return out

    def _compile(self, key, args):
        B, one = key[0], key[1]
        name = f"labkit_step_b{B}_{'t1' if one else 'tk'}_{'last' if key[2] else 'all'}_{len(self._fns)}"
        code = _program.__code__.replace(co_name=name)
        fn = torch.compile(types.FunctionType(code, _program.__globals__, name), backend=self._backend,
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
