"""The lab's own C++ kernels (`labkit/quant/csrc/`): built on first use, cached, loaded as torch operators.

`build()` compiles the sources with the system C++ compiler (about 10 s on 2 cores) into one file
under `.build/kernels/`, named by a hash of the sources and the torch version (a changed source or
torch gets a fresh build), and loads it: the operators `labkit::q4q8_mm` (Q4_1 weights),
`labkit::q8q8_mm` (Q8_0 weights) and `labkit::q4q8_paths` appear under `torch.ops.labkit`, with
their shapes registered for tracing, so eager code, `torch.compile` and `torch.export` all call
them. `status()` is one line for `labkit doctor`: built, or why not (no compiler, a failed build).

Paths. Each kernel has three: AVX-512 VNNI, AVX2 and plain C++ (`PATHS`). `path_for()` picks the
one for torch's CPU capability in this process (`torch.backends.cpu.get_cpu_capability()`, which
`ATEN_CPU_CAPABILITY=avx2` or `default` lowers), within what the CPU has.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from labkit.data.paths import BUILD_DIR

__all__ = ["PATHS", "ROWS", "build", "status", "available", "path_for", "cpu_paths", "KernelUnavailable"]

CSRC = Path(__file__).with_name("csrc")
SOURCES = (CSRC / "ops.cpp", CSRC / "q4q8.cpp", CSRC / "q8q8.cpp")
HEADER = CSRC / "blocks.h"
PATHS = ("portable", "avx2", "avx512-vnni")  # index = the C++ `path` argument
ROWS = 16  # output rows per packed group
_state: dict = {}  # "lib": the built file once loaded, "error": why it could not be built, "path": this process's


class KernelUnavailable(RuntimeError):
    """The kernel could not be built or loaded here; the message says why."""


def _library_file() -> Path:
    digest = hashlib.sha256(torch.__version__.encode())
    for f in (*SOURCES, HEADER):
        digest.update(f.read_bytes())
    return BUILD_DIR / "kernels" / f"labkit_blocks-{digest.hexdigest()[:16]}.so"


def _compile(target: Path) -> None:
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise KernelUnavailable("no C++ compiler (g++ or c++) on PATH; install one (Debian: apt-get install g++)")
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    libdir = cpp_extension.library_paths()[0]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        cmd = [compiler, "-O3", "-std=c++20", "-fPIC", "-shared", "-ffp-contract=off", "-fopenmp",
               f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes, *map(str, SOURCES), f"-L{libdir}", "-ltorch", "-ltorch_cpu",
               "-lc10", f"-Wl,-rpath,{libdir}", "-o", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            lines = done.stderr.strip().splitlines() or ["(no message)"]
            last = next((line for line in lines if "error" in line), lines[-1])
            raise KernelUnavailable(f"compiling labkit/quant/csrc failed: {last}")
        os.replace(out, target)  # atomic: a second process never loads a half-written file


def build() -> Path:
    """Build the kernel (once; cached under .build/kernels/) and load it; its path, or `KernelUnavailable`."""
    if "lib" in _state:
        return _state["lib"]
    if "error" in _state:
        raise KernelUnavailable(_state["error"])
    target = _library_file()
    try:
        if not target.exists():
            _compile(target)
        torch.ops.load_library(str(target))
        _register_fake()
    except (KernelUnavailable, OSError, RuntimeError) as e:
        _state["error"] = str(e)
        raise KernelUnavailable(str(e)) from None
    _state["lib"] = target
    return target


def _register_fake() -> None:
    """The outputs' shapes for tracing (torch.compile, torch.export) without running the kernels."""
    @torch.library.register_fake("labkit::q4q8_mm")
    def _(x, codes, dw, mw, path):
        return x.new_empty(x.shape[0], codes.shape[0] * ROWS)

    @torch.library.register_fake("labkit::q8q8_mm")
    def _(x, codes, dw, path):
        return x.new_empty(x.shape[0], codes.shape[0] * ROWS)


def available() -> bool:
    """Whether the kernel is built (or can be built now) and loaded."""
    try:
        build()
    except KernelUnavailable:
        return False
    return True


def status() -> tuple[bool, str]:
    """(built, one line): the file and the path this process runs, or why it cannot be built."""
    try:
        lib = build()
    except KernelUnavailable as e:
        return False, f"not built: {e}; products fall back to torch's int4 kernel"
    return True, f"built ({lib.name}), path {path_for()} here; CPU can run {', '.join(cpu_paths())}"


def cpu_paths() -> tuple[str, ...]:
    """The kernel paths this CPU has the instructions for."""
    build()
    mask = torch.ops.labkit.q4q8_paths()
    return tuple(p for i, p in enumerate(PATHS) if mask >> i & 1)


def path_for(capability: str | None = None) -> str:
    """The path for torch's CPU capability ("AVX512", "AVX2", "DEFAULT"; this process's when None), within the CPU's."""
    if capability is None:
        if "path" not in _state:
            _state["path"] = path_for(torch.backends.cpu.get_cpu_capability())
        return _state["path"]
    cap = capability.upper()
    want = "avx512-vnni" if cap.startswith("AVX512") else "avx2" if cap.startswith("AVX2") else "portable"
    have = cpu_paths()
    return want if want in have else "avx2" if want == "avx512-vnni" and "avx2" in have else "portable"




if __name__ == "__main__":  # python -m labkit.quant.native: build, and say so
    ok, line = status()
    print(line)
    sys.exit(0 if ok else 1)
