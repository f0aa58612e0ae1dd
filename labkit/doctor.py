"""`labkit doctor`: is this environment ready for the lab?

One `[OK]`/`[FAIL]` line per requirement, then this machine's CPU threads and
memory bandwidth (measured by a ~1 s copy test). Every failure names the exact
command that fixes it. `run()` returns the exit status: 1 on any FAIL.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass

from labkit.data import paths

SETUP_FIX = "make setup   (or: pip install -c constraints.txt torch==2.13.0 -e '.[lab,test]')"

# (import name, distribution name, minimum version, fix command)
PACKAGES = [
    ("torch", "torch", "2.4", "pip install torch==2.13.0   (the CPU build; pin it, a bare 'torch' pulls a CUDA build)"),
    ("numpy", "numpy", "1.26", "pip install 'numpy>=1.26'"),
    ("plotly", "plotly", "5.20", "pip install 'plotly>=5.20'"),
    ("ipywidgets", "ipywidgets", "8.1", "pip install 'ipywidgets>=8.1'"),
    ("anywidget", "anywidget", "0.9", "pip install 'anywidget>=0.9'   (plotly's FigureWidget needs it)"),
    ("jupyterlab", "jupyterlab", "4.0", "pip install 'jupyterlab>=4.0'"),
    ("gguf", "gguf", "0.10", "pip install 'gguf>=0.10'"),
]
HEAVY_IMPORTS = frozenset({"jupyterlab"})


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        tag = "[OK]  " if self.ok else "[FAIL]"
        text = f"{tag} {self.name}: {self.detail}"
        if not self.ok and self.fix:
            text += f"\n       fix: {self.fix}"
        return text


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) < len(piece):  # a pre-release tag such as '0rc1' ends the number
            break
    return tuple(parts)


def check_python() -> Check:
    v = sys.version_info
    ok = v >= (3, 10)
    return Check("Python", ok, f"{v.major}.{v.minor}.{v.micro} (need >= 3.10)", "install Python 3.10 or newer (3.11 is tested)")


def check_package(module: str, dist: str, minimum: str, fix: str) -> Check:
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return Check(module, False, "not installed", fix)
    if _version_tuple(version) < _version_tuple(minimum):
        return Check(module, False, f"{version} is older than {minimum}", fix)
    try:
        if module in HEAVY_IMPORTS:  # importing jupyterlab takes seconds; finding it is enough
            if importlib.util.find_spec(module) is None:
                raise ImportError(f"no module named {module!r}")
        else:
            importlib.import_module(module)
    except Exception as exc:  # installed but broken
        return Check(module, False, f"{version} installed but import fails: {type(exc).__name__}: {exc}", fix)
    return Check(module, True, version)


def check_smollm2() -> Check:
    try:
        path = paths.smollm2_gguf_path()
    except FileNotFoundError as exc:
        return Check("SmolLM2 GGUF file", False, str(exc).split(";")[0], paths.SMOLLM2_INSTALL)
    size_mb = path.stat().st_size / 1e6
    return Check("SmolLM2 GGUF file", True, f"{path.name}, {size_mb:.0f} MB")


def check_gemma3() -> Check:
    """The Gemma 3 270M file (chapters 01 and 06 read it): its package installed and the file assembled."""
    try:
        path = paths.gemma3_gguf_path()
    except (FileNotFoundError, ValueError, OSError) as exc:
        return Check("Gemma 3 GGUF file", False, str(exc).split(";")[0], paths.GEMMA3_INSTALL)
    return Check("Gemma 3 GGUF file", True, f"{path.name}, {path.stat().st_size / 1e6:.0f} MB")


def check_data() -> list[Check]:
    from labkit.data import files as datafiles

    results = datafiles.check()
    if not results:
        return [Check("data/", False, "no data files found", "git checkout -- data/")]
    checks = []
    for name, ok, detail in results:
        if "not listed" in detail:
            fix = "python -m labkit.data.files write   (records the checksums of the files now in data/)"
        elif name.startswith("shakespeare_"):
            fix = "python -m labkit.data.corpus build   (or: git checkout -- data/)"
        else:
            fix = f"git checkout -- data/{name}"
        checks.append(Check(f"data/{name}", ok, detail, fix))
    return checks


def machine_lines(seconds: float = 1.0) -> list[str]:
    """CPU threads and measured memory bandwidth (information, never a failure)."""
    lines = [f"[INFO] CPU: {os.cpu_count()} logical cores"]
    try:
        from labkit.costmodel import measure as hwmeasure

        lines[0] += f", torch uses {hwmeasure.cpu_threads()} threads"
        from labkit import threads

        lines.append(f"[INFO] threads: {threads.status()}")
        bw = hwmeasure.copy_bandwidth_gb_s(seconds=seconds)
        lines.append(f"[INFO] memory bandwidth (copy test, {seconds:.0f} s): {bw:.1f} GB/s")
    except ImportError:
        lines.append("[INFO] memory bandwidth: not measured (torch is missing)")
        return lines
    lines += kernel_lines()
    return lines


def kernel_lines() -> list[str]:
    """The CPU's instruction sets and, per weight format, whether the default kernels are row-invariant here."""
    from labkit.costmodel.cpu import describe
    from labkit.model.invariance import default_kernels_report
    from labkit.quant import native

    built, line = native.status()
    lines = [f"[INFO] CPU: {describe()}",
             f"[INFO] labkit's block kernels (Q4_1 and Q8_0 weights × int8 activations): {line}"
             + ("" if built else "\n       fix: install a C++ compiler (Debian: apt-get install g++), then run labkit doctor again"),
             "[INFO] row-invariant default kernels (a row's bits alone = among 2..16 rows; "
             "Transformer.batch_invariant makes them so either way):"]
    for r in default_kernels_report():
        if not r["available"]:
            lines.append(f"         {r['format']:16s} no kernel in this torch build")
            continue
        verdict = "yes" if r["invariant"] else "NO "
        lines.append(f"         {r['format']:16s} {verdict}  (products {'yes' if r['products'] else 'no'}, attention "
                     f"{'yes' if r['attention'] else 'no'}; the mode: {r['mode']})")
    return lines


def checks() -> list[Check]:
    out = [check_python()]
    out += [check_package(*spec) for spec in PACKAGES]
    out.append(check_smollm2())
    out.append(check_gemma3())
    out += check_data()
    return out


def run(measure: bool = True, seconds: float = 1.0) -> int:
    results = checks()
    for c in results:
        print(c.line())
    if measure:
        for line in machine_lines(seconds):
            print(line)
    failed = [c for c in results if not c.ok]
    if failed:
        print(f"\n{len(failed)} problem(s). Fix them with the commands above, or run: {SETUP_FIX}")
        return 1
    print("\nAll checks passed: the lab is ready.")
    return 0
