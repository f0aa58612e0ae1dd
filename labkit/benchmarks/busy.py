"""Decode on a busy CPU: SmolLM2 with one core kept busy by another program, against the same on a quiet one.

Each side runs in its own worker process (`labkit.benchmarks.workers`), rounds alternating, twice: once on
a quiet machine and once while a second program keeps one core busy (a Python loop, started before the
workers, so that their `import labkit` sees it). The sides: labkit's float32 model, labkit's block kernels
on the Q4_1 file (eager) and llama.cpp on the same file, each with the threads labkit chooses
(`labkit.threads`, `LABKIT_THREADS=auto`) and with torch's own count (`LABKIT_THREADS=all`; llama.cpp
takes torch's count in its worker). Printed and returned: tokens/s per side and condition, each side's
busy/quiet speed (unpaired: the two conditions are separate runs) and, on the quiet machine, labkit's choice
against torch's own count, with the claims the choice is made for:

- with one core busy, a step runs at >= 0.4x its quiet speed (labkit's choice);
- on a quiet machine the choice costs nothing: it is torch's own count, the same configuration (printed; the
  two quiet rows of a side then differ by the run's noise alone, which the bench shows).

    labkit bench --only busy [--json FILE]
"""
from __future__ import annotations

import os
import subprocess
import sys

TITLE = "decode with one core kept busy by another program: labkit's thread choice against torch's own count"

PROMPT = "Explain in two sentences why the sky is blue."
SIDES = {"float32": {"side": "labkit"}, "Q4_1 × Q8 kernels": {"side": "labkit", "weights": "gguf"},
         "llama.cpp Q4_1": {"side": "llama.cpp"}}
POLICIES = {"labkit's choice": "auto", "torch's count": "all"}
BUSY_LOOP = "while True: pass"


def _busy_core() -> subprocess.Popen:
    """Another program that keeps one core busy until killed."""
    return subprocess.Popen([sys.executable, "-c", BUSY_LOOP])


def _sides() -> tuple[dict, str | None]:
    """The sides this machine can run, and why llama.cpp is left out (None: it is in)."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return {k: v for k, v in SIDES.items() if v["side"] != "llama.cpp"}, \
            "llama-cpp-python is not installed (pip install -e '.[peers]')"
    return SIDES, None


def _condition(busy: bool, ids: list[int], n: int, rounds: int, sides: dict) -> dict:
    """One run of every side under both policies (each its own worker), with or without a busy core."""
    from labkit import threads
    from labkit.benchmarks import workers

    hog = _busy_core() if busy else None
    try:
        chosen = threads.choose({threads.VARIABLE: "auto"})  # what a worker's `import labkit` sees now
        procs = {}
        try:
            for side, spec in sides.items():
                for policy, value in POLICIES.items():
                    procs[f"{side}, {policy}"] = workers.Worker(spec, env={threads.VARIABLE: value})
            run = workers.alternate(procs, ids, n, rounds=rounds, warmup=1)
        finally:
            for w in procs.values():
                w.close()
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    return {"run": run, "chosen": chosen}


def run(quick: bool = False) -> dict:
    import labkit
    from labkit import measure
    from labkit.measure.cpu import describe

    env_omp = os.environ.get("OMP_NUM_THREADS")
    if env_omp and os.environ.get("_LABKIT_CHOSE_THREADS") != env_omp:
        why = f"OMP_NUM_THREADS={env_omp} is set: every worker would use it; unset it to compare thread choices"
        print(f"  skipped: {why}")
        return {"skipped": why}
    tok = labkit.load("smollm2-135m")[1]
    ids = tok.encode(PROMPT)
    n, rounds = (16, 4) if quick else (32, 8)
    print(f"  {describe()}\n  {n} tokens a round, {rounds} rounds after 1 warm-up, every side in its own process")
    sides, why = _sides()
    if why:
        print(f"  (no llama.cpp rows: {why})")
    out: dict = {"cpu": describe(), "tokens": n, "rounds": rounds, "llama_cpp": why}
    runs = {}
    for busy in (False, True):
        name = "one core busy" if busy else "quiet"
        got = _condition(busy, ids, n, rounds, sides)
        runs[name] = got["run"]
        print(f"  {name}: labkit's choice, sampled in this process as each worker's `import labkit` samples it "
              f"(the workers do not report theirs): {got['chosen'].why}")
        for side, t in got["run"].timings.items():
            print(f"    {side:40s} {1 / t.median:7.1f} tok/s (IQR {t.iqr / t.median:.0%})")
        out[name] = {"run": got["run"].as_dict(), "threads": got["chosen"].threads, "why": got["chosen"].why,
                     "tok_s": {side: 1 / t.median for side, t in got["run"].timings.items()}}
    out["claims"] = {}
    print("  busy / quiet speed (unpaired: separate runs), and what labkit chose on the quiet machine:")
    for side in sides:
        for policy in POLICIES:
            key = f"{side}, {policy}"
            c = measure.compare(runs["one core busy"][key], runs["quiet"][key], names=("busy", "quiet"))
            ours = policy == "labkit's choice" and side != "llama.cpp Q4_1"  # the claim is labkit's
            verdict = measure.claim(f"{key}: busy >= 0.4x quiet", c, low=0.4) if ours else None
            out["claims"][f"{key}: busy/quiet"] = {"comparison": c.as_dict(), "speed": c.speedup,
                                                  "claim": verdict.as_dict() if verdict else None}
            print(f"    {key:40s} busy/quiet {c.speedup:.2f} ({1 / c.high:.2f}–{1 / c.low:.2f})"
                  + (f": {verdict.verdict}" if verdict else ""))
    same = out["quiet"]["threads"] is None
    out["quiet_choice_is_torchs"] = same
    print("  quiet: labkit's choice " + ("is torch's own count, the same configuration (each side's two quiet rows "
                                         "differ by the run's noise alone)" if same else
                                         f"is {out['quiet']['threads']} threads: the machine was not quiet"))
    return out
