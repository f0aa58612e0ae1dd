"""The decode step exported ahead of time: `torch.export` and AOTInductor, one package per program, loaded in a second.

`model.compile_step()` (`labkit.model.compiled`) compiles the pass just in time and calls it through
TorchDynamo on every step: Dynamo's entry and its cache lookup are paid each time (a `torch.profiler` run
of SmolLM2's step shows them). `model.export_step()` takes the same pass (`compiled._program`) through
`torch.export` and AOTInductor instead (`aoti_compile_and_package`): a shared library with the weights
inside, which runs from C++ with no Python between kernels and no Dynamo at the call. labkit's block
kernels (`labkit.quant.q4q8`) are torch operators, so the exported program calls them as they are.

One package per program (a one-token step, and a pass of 2..16 tokens), per model weights, instruction
set and torch version, under `.build/exported/`: a second process loads it in well under a second instead
of compiling. The key holds a digest of every weight, so a package is only ever loaded for the weights it was
built from. A package holds a *copy* of the weights: a weight changed in place after the program was built is
not seen (call `export_step()` again); replacing or re-laying out modules drops the programs, as for
`compile_step` (the same checks), and a copy of the model does not carry them.

The sizes that move are symbolic in the exported program: the keys so far (`span`), the cache's
capacity and, for the multi-token program, the pass's length. What runs eagerly, and why, is
`CompiledStep.eager_reason`'s list.

    >>> model.export_step()                                  # doctest: +SKIP
    >>> model.step(ids, cache)  # a one-token step on a contiguous cache: the exported program
"""
from __future__ import annotations

import hashlib
import os
import sys

import torch

from labkit.data.paths import BUILD_DIR
from labkit.measure.clock import now as clock_now
from labkit.model.compiled import COMPILE_MAX_TOKENS, CompiledStep, _program

__all__ = ["ExportedStep", "weights_digest", "package_dir"]


def package_dir():
    """Where exported programs are kept: `.build/exported/`."""
    return BUILD_DIR / "exported"


def weights_digest(model) -> str:
    """sha256 over every parameter and buffer of the model (names, dtypes, shapes and bytes): 16 hex digits."""
    h = hashlib.sha256()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


class _Pass(torch.nn.Module):
    """The pass as a module for `torch.export`: the model's weights and the RoPE tables are its state."""

    def __init__(self, model, cos, sin, last_only: bool):
        super().__init__()
        self.model, self.last_only = model, last_only
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, ids, positions, span, keys: list, values: list):
        return _program(self.model, self.cos, self.sin, ids, positions, span, keys, values, self.last_only)


class ExportedStep(CompiledStep):
    """`CompiledStep` whose programs are AOTInductor packages, built once per key and loaded from disk after."""

    def __init__(self, model, progress: bool = True):
        super().__init__(model, progress)
        self.digest = weights_digest(model)
        self.load_s: list[float] = []  # seconds to load each package that was already on disk

    def reset(self) -> None:
        super().reset()
        self.digest = weights_digest(self.model)

    def package_path(self, key) -> str:
        B, one, last_only, cache_dtype, ids_dtype = key
        from labkit.quant.native import path_for

        name = (f"step-{self.digest}-b{B}-{'t1' if one else 'tk'}-{'last' if last_only else 'all'}-"
                f"{str(cache_dtype).removeprefix('torch.')}-{torch.backends.cpu.get_cpu_capability().lower()}-"
                f"{path_for() if _uses_block_kernels(self.model) else 'aten'}-torch{torch.__version__}.pt2")
        return str(package_dir() / name)

    def _compile(self, key, args):
        path = self.package_path(key)
        built = not os.path.exists(path)
        if built:
            start = clock_now()
            self._build(key, args, path)
            self.compile_s.append(clock_now() - start)
        start = clock_now()
        runner = torch._inductor.aoti_load_package(path)
        if not built:
            self.load_s.append(clock_now() - start)

        def fn(model, cos, sin, ids, positions, span, keys, values, last_only):
            return runner(ids, positions, span, keys, values)

        return fn, fn(*args)

    def _build(self, key, args, path: str) -> None:
        _, cos, sin, ids, positions, span, keys, values, last_only = args
        one = key[1]
        if self.progress:
            print(f"exporting the {'one-token step' if one else f'pass over 2..{COMPILE_MAX_TOKENS} tokens'} with "
                  f"AOTInductor into {path} ...", file=sys.stderr, flush=True)
        n = torch.export.Dim("keys_so_far", min=2, max=self.model.config.max_seq_len)
        cap = torch.export.Dim("capacity", min=3, max=self.model.config.max_seq_len + 1)
        t = None if one else torch.export.Dim("tokens", min=2, max=COMPILE_MAX_TOKENS)
        shapes = {"ids": None if one else {1: t}, "positions": None if one else {0: t}, "span": {0: n},
                  "keys": [{2: cap} for _ in keys], "values": [{2: cap} for _ in values]}
        module = _Pass(self.model, cos, sin, last_only).eval()
        # export on a cache copy: tracing must not write the live cache
        example = (ids, positions, span, [k.clone() for k in keys], [v.clone() for v in values])
        program = torch.export.export(module, example, dynamic_shapes=shapes)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.pt2"
        torch._inductor.aoti_compile_and_package(program, package_path=tmp)
        os.replace(tmp, path)  # atomic: another process never loads a half-written package
        self.graphs += 1

    def stats(self) -> dict:
        return {**super().stats(), "load_s": list(self.load_s), "digest": self.digest}


def _uses_block_kernels(model) -> bool:
    return any(type(m).__name__ in ("Q4Q8Linear", "Q8Q8Linear") for m in model.modules())
