"""The decode step exported ahead of time: `torch.export` and AOTInductor, one package per program, loaded in a second.

`model.compile_step()` (`labkit.model.compiled`) compiles the pass just in time and calls it through
TorchDynamo on every step: Dynamo's entry and its cache lookup are paid each time (a `torch.profiler` run
of SmolLM2's step shows them). `model.export_step()` takes the same pass, the model's own forward
(`Transformer.run_pass` over a `labkit.kvcache.bufferpass.BufferPass`), through `torch.export` and
AOTInductor instead (`aoti_compile_and_package`): a shared library with the weights inside, which runs from
C++ with no Python between kernels and no Dynamo at the call. labkit's block kernels (`labkit.quant.q4q8`)
are torch operators, so the exported program calls them as they are.

Which programs: a model whose every product, the LM head included, is one of labkit's block kernels (SmolLM2's
GGUF file as `labkit.load` runs it) gets one program for every pass of 1..16 tokens, its attention written
row by row (`BufferPass(rows=True)`): a row's bits do not depend on the pass, so plain decoding,
verification and the batch-invariant mode all run it, and speculative decoding replies what plain decoding
replies. Any other model gets a one-token program and a program for 2..16 tokens, and runs the
batch-invariant mode eagerly.

One package per program, per model weights, traced code, instruction set and torch version, under
`.build/exported/`: a second process loads it in about a second instead of compiling. The key holds a digest
of every weight and of the sources the program is traced from, so a package is only ever loaded for the
weights and the code it was built from (the digest is taken when a program is built or loaded, at the first
pass that needs it); building one deletes the packages of other code (`prune_stale`), which this code never
loads. A package holds a *copy* of the weights: a weight changed in place after that pass is not seen (call
`export_step()` again); replacing or re-laying out modules drops the programs, as for `compile_step` (the same
checks), and a copy of the model does not carry them.

The sizes that move are symbolic in the exported program: the keys so far (`span`), the cache's capacity
and, for the multi-token programs, the pass's length. What runs eagerly, and why, is
`CompiledStep.eager_reason`'s list.

    >>> model.export_step()                                  # doctest: +SKIP
    >>> model.step(ids, cache)  # a one-token step on a contiguous cache: the exported program  # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
import os
import sys

import torch

from labkit.data.paths import BUILD_DIR
from labkit.measure.clock import now as clock_now
from labkit.model.compiled import COMPILE_MAX_TOKENS, CompiledStep, _pass, row_invariant_products

__all__ = ["ExportedStep", "weights_digest", "package_dir", "code_digest", "prune_stale"]


def package_dir():
    """Where exported programs are kept: `$LABKIT_EXPORT_DIR` when set (a bench times a cold build there), else
    `.build/exported/`."""
    from pathlib import Path

    return Path(os.environ["LABKIT_EXPORT_DIR"]) if os.environ.get("LABKIT_EXPORT_DIR") else BUILD_DIR / "exported"


_CODE = ("model", "kvcache", "quant")  # every package a traced pass runs code from
_code_digest: list = []


def code_digest() -> str:
    """sha256 over the sources a program is traced from (the model's package, the cache's pass, the block kernels):
    16 hex digits. A package built by other code is never loaded."""
    if not _code_digest:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        h = hashlib.sha256()
        for part in _CODE:
            path = os.path.join(root, part)
            files = sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs) if os.path.isdir(path) else [path]
            for f in files:
                if f.endswith((".py", ".cpp", ".h")):
                    h.update(os.path.relpath(f, root).encode())
                    with open(f, "rb") as fh:
                        h.update(fh.read())
        _code_digest.append(h.hexdigest()[:16])
    return _code_digest[0]


def prune_stale() -> list[str]:
    """Delete the packages built by other code (another code digest): this code never loads them, and each holds a
    copy of its model's weights. Returns the names removed."""
    removed = []
    for f in package_dir().glob("step-*.pt2"):
        parts = f.name.split("-")
        if len(parts) > 2 and parts[2] != code_digest():
            f.unlink(missing_ok=True)
            removed.append(f.name)
    return removed


def weights_digest(model) -> str:
    """sha256 over every parameter and buffer of the model (names, dtypes, shapes and bytes): 16 hex digits."""
    h = hashlib.sha256()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


class _Pass(torch.nn.Module):
    """The model's own pass as a module for `torch.export`: the model's weights are its state."""

    def __init__(self, model, last_only: bool, rows: bool):
        super().__init__()
        self.model, self.last_only, self.rows = model, last_only, rows

    def forward(self, ids, positions, span, keys: list, values: list):
        return _pass(self.model, ids, positions, span, keys, values, self.last_only, self.rows)


class ExportedStep(CompiledStep):
    """`CompiledStep` whose programs are AOTInductor packages, built once per key and loaded from disk after."""

    last_slot = True  # the keys so far may fill the whole buffer (`BufferPass` tells the exporter they never exceed it)

    def __init__(self, model, progress: bool = True):
        super().__init__(model, progress)
        self.digest = weights_digest(model)
        self.load_s: list[float] = []  # seconds to load each package that was already on disk
        self.rows = row_invariant_products(model)

    def reset(self) -> None:
        super().reset()
        self.digest = weights_digest(self.model)
        self.rows = row_invariant_products(self.model)

    def package_path(self, key) -> str:
        B, program, last_only, cache_dtype, ids_dtype = key
        from labkit.quant.native import path_for

        name = (f"step-{self.digest}-{code_digest()}-b{B}-{program}-{'last' if last_only else 'all'}-"
                f"{str(cache_dtype).removeprefix('torch.')}-{torch.backends.cpu.get_cpu_capability().lower()}-"
                f"{path_for() if _uses_block_kernels(self.model) else 'aten'}-torch{torch.__version__}.pt2")
        return str(package_dir() / name)

    def _compile(self, key, args):
        self.digest = weights_digest(self.model)  # the weights as they are now, when the program is built or loaded
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

        def fn(model, ids, positions, span, keys, values, last_only, rows):
            return runner(ids, positions, span, keys, values)

        return fn, fn(*args)

    def _build(self, key, args, path: str) -> None:
        _, ids, positions, span, keys, values, last_only, rows = args
        program_kind = key[1]
        what = {"t1": "one-token step", "tk": f"pass over 2..{COMPILE_MAX_TOKENS} tokens",
                "rows": f"pass over 1..{COMPILE_MAX_TOKENS} tokens, row by row"}[program_kind]
        if self.progress:
            print(f"exporting the {what} with AOTInductor into {path} ...", file=sys.stderr, flush=True)
        n = torch.export.Dim("keys_so_far", min=2, max=self.model.config.max_seq_len)
        cap = torch.export.Dim("capacity", min=2)
        one = program_kind == "t1"
        t = None if one else torch.export.Dim("tokens", min=1 if rows else 2, max=COMPILE_MAX_TOKENS)
        shapes = {"ids": None if one else {1: t}, "positions": None if one else {0: t}, "span": {0: n},
                  "keys": [{2: cap} for _ in keys], "values": [{2: cap} for _ in values]}
        module = _Pass(self.model, last_only, rows).eval()
        # export on an example of its own (new tokens at slots 2, 3 of buffers of 8): tracing must not write the live
        # cache, and an example of one token would fix the pass length at one
        T = 1 if one else 2
        buffers = [torch.zeros(*b.shape[:2], 8, b.shape[3], dtype=b.dtype, device=b.device) for b in keys + values]
        example = (torch.zeros(ids.shape[0], T, dtype=ids.dtype, device=ids.device), torch.arange(4 - T, 4, device=ids.device),
                   torch.arange(4, device=ids.device),
                   buffers[:len(keys)], buffers[len(keys):])
        with torch.no_grad():  # the inference path (a pass with gradients on takes training's calls)
            program = torch.export.export(module, example, dynamic_shapes=shapes)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.pt2"
        torch._inductor.aoti_compile_and_package(program, package_path=tmp)
        os.replace(tmp, path)  # atomic: another process never loads a half-written package
        self.graphs += 1
        prune_stale()

    def stats(self) -> dict:
        return {**super().stats(), "load_s": list(self.load_s), "digest": self.digest}


def _uses_block_kernels(model) -> bool:
    return any(type(m).__name__ in ("Q4Q8Linear", "Q8Q8Linear") for m in model.modules())
