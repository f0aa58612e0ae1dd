"""How labkit's threads wait on a CPU it may share with other work: the OpenMP wait policy, chosen before torch starts.

torch's intra-op threads, and labkit's own block kernels (through `at::parallel_for`), run as one OpenMP team.
At the end of every parallel region the threads that finished wait for the others at a barrier. GNU OpenMP
(the runtime torch's Linux wheels ship) lets a waiting thread *spin* for a while before it sleeps, so that the
next region starts without a wake-up: free on a quiet machine, where every thread has its own core. On a busy
one a thread of the team is sometimes descheduled; its partner then spins at the barrier on a core the
descheduled thread (or the other program) needs, and a decode step, which crosses a barrier hundreds of times,
slows by far more than the share of the CPU it lost.

`apply()` sets `GOMP_SPINCOUNT` (`SPIN_COUNT` spins, then sleep) unless the user set it or `OMP_WAIT_POLICY`:
short enough that a thread waiting for a descheduled partner soon gives its core back, long enough to bridge
the gaps between the regions of one step. It must run before torch loads its OpenMP runtime, which reads the
variables once: `import labkit` calls it (so `labkit serve`, `labkit bench` and scripts that import labkit
first get it); notebooks get it from the kernel's environment (`kernel_env`, which `make setup` writes into
the lab's Jupyter kernel). `status()` says what is in effect and why (`labkit doctor` prints it).
"""
from __future__ import annotations

import os
import sys

__all__ = ["SPIN_COUNT", "apply", "status", "kernel_env", "install_kernel_env", "VARIABLES"]

SPIN_COUNT = 10_000  # spins before a waiting thread sleeps (GNU OpenMP's default: 300,000)
VARIABLES = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
_SET_BY_LABKIT = "_LABKIT_SET_SPINCOUNT"  # marks a GOMP_SPINCOUNT that labkit chose (children inherit it)


def kernel_env() -> dict[str, str]:
    """The variables labkit chooses, for an environment that starts Python (a Jupyter kernel's)."""
    return {"GOMP_SPINCOUNT": str(SPIN_COUNT), _SET_BY_LABKIT: "1"}


def apply(env=None) -> bool:
    """Choose the wait policy in `env` (default `os.environ`) unless the user chose one; True if labkit set it.
    Too late, and so a no-op, once torch is imported in this process (its runtime has read the variables)."""
    env = os.environ if env is None else env
    if any(v in env for v in VARIABLES) or (env is os.environ and "torch" in sys.modules):
        return False
    env.update(kernel_env())
    return True


def status(env=None) -> str:
    """One line: the wait policy in effect for this process and who chose it."""
    env = os.environ if env is None else env
    if env.get(_SET_BY_LABKIT) == "1" and env.get("GOMP_SPINCOUNT") == str(SPIN_COUNT):
        return (f"OpenMP threads spin {SPIN_COUNT:,} times at a barrier, then sleep (GOMP_SPINCOUNT, set by "
                f"labkit: a busy CPU slows a step in proportion, not by a multiple)")
    chosen = {v: env[v] for v in VARIABLES if v in env}
    if chosen:
        return "OpenMP wait policy as you set it: " + ", ".join(f"{k}={v}" for k, v in chosen.items())
    return ("OpenMP's default wait policy (threads spin ~300,000 times at a barrier): torch was imported before "
            "labkit, so labkit could not choose; import labkit first, or start from `labkit` or the lab's kernel")


def install_kernel_env(prefix: str | None = None) -> str:
    """Write `kernel_env()` into the `env` of the Python kernel's spec under `prefix` (default: this environment's,
    `sys.prefix/share/jupyter/kernels/python3`), so that notebooks start with labkit's wait policy even when they
    import torch before labkit; the path written."""
    import json
    from pathlib import Path

    spec = Path(sys.prefix if prefix is None else prefix) / "share" / "jupyter" / "kernels" / "python3" / "kernel.json"
    if not spec.is_file():
        raise FileNotFoundError(f"no Python kernel spec at {spec}; install ipykernel in this environment first")
    data = json.loads(spec.read_text())
    data["env"] = {**data.get("env", {}), **kernel_env()}
    spec.write_text(json.dumps(data, indent=1) + "\n")
    return str(spec)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="labkit's OpenMP wait policy: say what is in effect, or write it into "
                                            "this environment's Jupyter kernel")
    p.add_argument("--install-kernel-env", action="store_true", help="write it into the python3 kernel's spec")
    args = p.parse_args()
    if args.install_kernel_env:
        print(f"wrote labkit's wait policy into {install_kernel_env()}")
    else:
        print(status())
