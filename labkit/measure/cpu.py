"""Which CPU this is, as far as the lab's numbers are concerned: model, instruction sets, libraries, threads.

Every figure the lab stores names the machine it was measured on with `cpu_info()`, and a
chapter that shows a stored figure compares it with the learner's (`provenance`). What
matters for speed and for the last bits of a result is not the product name but what the
kernels can use:

  * AVX2 (every x86 laptop of the last decade) or AVX-512 (servers, some recent laptops);
  * VNNI (int8 dot products: AVX512-VNNI or AVX-VNNI) and AMX (int8 and bfloat16 tiles, Intel
    servers since Sapphire Rapids): without them an int8 matmul is slower than a float one;
  * AVX512-BF16 (native bfloat16 dot products): without it bfloat16 is converted to float32;
  * the capability ATen dispatches to (`torch.backends.cpu.get_cpu_capability()`), which the
    environment can lower to emulate a smaller CPU (`ISA_EMULATION`).

    >>> info = cpu_info()
    >>> sorted(info["flags"]) == sorted(FLAGS)
    True
"""
from __future__ import annotations

import os
import platform
import re

__all__ = ["read_cpuinfo", "last_level_cache_bytes", "cpu_info", "describe", "differences", "provenance", "FLAGS", "ISA_EMULATION", "emulated_isa"]

# what the lab reports, by name: the /proc/cpuinfo flags that stand for it (any one of them)
FLAGS = {
    "avx2": ("avx2",),
    "avx512": ("avx512f",),
    "avx512_bf16": ("avx512_bf16",),
    "vnni": ("avx512_vnni", "avx_vnni"),
    "amx": ("amx_tile",),
}
# the environment that makes one process use a smaller instruction set than its CPU has
ISA_EMULATION = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}


def read_cpuinfo() -> tuple[str, set]:
    """(model name, set of flags) from /proc/cpuinfo; (platform name, empty set) where it cannot be read."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return model, flags
    name = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    found = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    return (name.group(1).strip() if name else model), (set(found.group(1).split()) if found else flags)


def last_level_cache_bytes() -> int | None:
    """Size of the largest cache level CPU 0 reports (Linux sysfs), in bytes; None where it cannot be read.

    One instance of that cache, as the kernel reports it (a VM reports what its hypervisor passes on).
    """
    import glob

    best = None
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(f"{d}/level") as f:
                level = int(f.read())
            with open(f"{d}/size") as f:
                text = f.read().strip()
        except (OSError, ValueError):
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", text)
        if not m:
            continue
        size = int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
        if best is None or (level, size) > best:
            best = (level, size)
    return None if best is None else best[1]


def emulated_isa() -> str | None:
    """The name in `ISA_EMULATION` whose settings this process runs under, or None."""
    for name, env in ISA_EMULATION.items():
        if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == env["ATEN_CPU_CAPABILITY"]:
            return name
    return None


def cpu_info() -> dict:
    """This machine as the lab's stored figures record it (JSON-ready)."""
    import torch

    model, flags = read_cpuinfo()
    mkl = None
    if torch.backends.mkl.is_available():
        m = re.search(r"Math Kernel Library Version ([\d.]+)", torch.__config__.show())
        mkl = m.group(1) if m else "yes"
    return {
        "cpu": model,
        "arch": platform.machine(),
        "flags": {name: any(f in flags for f in names) for name, names in FLAGS.items()},
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "emulated_isa": emulated_isa(),
        "torch": torch.__version__,
        "mkl": mkl,
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
    }


def describe(info: dict | None = None) -> str:
    """One line: 'AMD EPYC, AVX-512 (+VNNI, +BF16, no AMX), ATen AVX2 (emulated), torch 2.13.0, 2 threads'."""
    info = info or cpu_info()
    f = info.get("flags", {})
    if f.get("avx512"):
        simd = "AVX-512"
    elif f.get("avx2"):
        simd = "AVX2"
    else:
        simd = "no AVX2"
    extras = ", ".join(("+" if f.get(k) else "no ") + label for k, label in
                       (("vnni", "VNNI"), ("avx512_bf16", "BF16"), ("amx", "AMX")))
    cap = info.get("aten_capability", "?")
    emulated = f" (emulated: {info['emulated_isa']})" if info.get("emulated_isa") else ""
    return (f"{info.get('cpu', '?')}, {simd} ({extras}), ATen {cap}{emulated}, torch {info.get('torch', '?')}, "
            f"{info.get('threads', '?')} threads")


def differences(stored: dict | None, here: dict | None = None) -> list[str]:
    """What differs between the machine a figure was measured on and this one (empty: the same kind)."""
    here = here or cpu_info()
    if not stored:
        return ["the file does not say which CPU it was measured on"]
    out = []
    if stored.get("cpu") != here.get("cpu"):
        out.append(f"CPU {stored.get('cpu')!r} there, {here.get('cpu')!r} here")
    if stored.get("aten_capability") != here.get("aten_capability"):
        out.append(f"ATen capability {stored.get('aten_capability')} there, {here.get('aten_capability')} here")
    for name in FLAGS:
        a, b = stored.get("flags", {}).get(name), here.get("flags", {}).get(name)
        if a != b:
            out.append(f"{name} {'yes' if a else 'no'} there, {'yes' if b else 'no'} here")
    if stored.get("threads") != here.get("threads"):
        out.append(f"{stored.get('threads')} threads there, {here.get('threads')} here")
    return out


def provenance(stored: dict | None, here: dict | None = None) -> str:
    """Where a stored figure was measured and, when this machine differs, how: for a chapter to print beside it."""
    where = describe(stored) if stored else "an unrecorded machine"
    diff = differences(stored, here)
    if not diff:
        return f"measured on {where}: the same kind of machine as this one"
    return f"measured on {where}; NOT this machine ({'; '.join(diff)}): your numbers will differ"
