"""Each side of a comparison in its own process, taking turns: the peer comparisons and the compile times.

Two runtimes in one process disturb each other: torch's OpenMP pool and llama.cpp's threads both
keep spinning for a while after their work, so whichever runs next shares the cores with a spinning
pool and runs slower than it does alone (the chapters and `data/` record by how much, with the CPU). So
a comparison here starts one long-lived **worker** process per side. A worker builds its model
once (and compiles it, if asked), says it is ready, then runs one timed round each time the parent
asks. The parent asks the sides in turn, round after round, and waits `settle_s` between turns so
the side that just ran has gone idle before the other starts; `alternate` returns a
`labkit.measure.Run` whose rounds are paired, so `measure.compare` gives the ratio with its interval.

A compile is timed the same way: `compile_times` starts a worker with an empty inductor cache (cold:
nothing on disk, nothing in memory) and then a second one on the same cache (cached: what a second
process pays), and reads each one's compile seconds.

Specs (JSON-ready dicts): {"side": "labkit", "model": "smollm2-135m", "dtype": ..., "weights": ...,
"bits": 4 or 8 (quantize, group 32), "compile": bool (`compile_step`), "export": bool (`export_step`)} or
{"side": "llama.cpp"}.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time

from labkit import checks, measure

__all__ = ["Worker", "alternate", "compile_times", "rates_in_own_processes", "peer_record", "SIDES", "LLAMA_CPP",
           "PEERS_SEEN"]

LLAMA_CPP = "llama.cpp Q4_1"

SIDES = ("labkit", "llama.cpp")
PEERS_SEEN: dict = {}  # every peer build a worker of this process ran: what a stored file's provenance names


def peer_record() -> dict:
    """llama.cpp as this process imports it: name, version, where it was loaded from and its build
    (`llama_print_system_info()`: the instruction sets its kernels were compiled for)."""
    import llama_cpp
    from llama_cpp import llama_cpp as low_level

    info = low_level.llama_print_system_info()
    where = os.path.realpath(llama_cpp.__file__)
    return {"name": "llama.cpp (llama-cpp-python)", "version": getattr(llama_cpp, "__version__", "?"),
            "from": "this environment's site-packages" if where.startswith(os.path.realpath(sys.prefix)) else
            f"the folder {os.path.basename(os.path.dirname(os.path.dirname(where)))!r} on PYTHONPATH",
            "system_info": info.decode() if isinstance(info, bytes) else str(info)}


def _build(spec: dict):
    """The child's side: a callable run(ids, n) -> seconds per token, and what building it cost."""
    if spec["side"] == "llama.cpp":
        from labkit.benchmarks.peers import llama_cpp_decode, load_llama_cpp

        llm = load_llama_cpp(model=spec.get("model", "smollm2-135m"))
        if llm is None:
            raise RuntimeError("llama-cpp-python is not installed (pip install -e '.[peers]')")
        return (lambda ids, n: llama_cpp_decode(llm, ids, n)), {"peer": peer_record()}
    import labkit
    from labkit.generation.stages import decode, prefill

    opts = {k: spec[k] for k in ("dtype", "weights") if spec.get(k)}
    model = labkit.load(spec.get("model", "smollm2-135m"), **opts)[0]
    if spec.get("bits"):
        from labkit.quant.apply import quantize_model

        import torch

        model = quantize_model(model, bits=spec["bits"], group_size=32, inplace=True,
                               act_dtype=getattr(torch, spec.get("act_dtype", "bfloat16")))
    info = {}
    if spec.get("compile") or spec.get("export"):
        model.export_step(progress=False) if spec.get("export") else model.compile_step(progress=False)
        state = prefill(model, [1, 2, 3, 4], max_len=24)
        decode(model, state, 2)  # the one-token program
        import torch

        with torch.inference_mode():  # the program for passes of 2..16 tokens
            model.step(torch.full((1, 2), 5), state.cache)
        info["compile_s"] = sum(model.compiled.compile_s)
        info["load_s"] = sum(getattr(model.compiled, "load_s", []))  # exported packages already on disk

    def run(ids, n):
        state = prefill(model, ids, max_len=len(ids) + n + 1)
        with measure.timer() as t:
            decode(model, state, n)
        return t.seconds / n

    return run, info


def _child(spec_json: str) -> int:
    spec = json.loads(spec_json)
    try:
        run, info = _build(spec)
    except Exception as exc:  # tell the parent why, in one line
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps({"ready": True, **info}), flush=True)
    for line in sys.stdin:
        ids, n = json.loads(line)
        print(json.dumps({"seconds_per_token": run(ids, n)}), flush=True)
    return 0


class Worker:
    """One side in its own process: `Worker(spec)` builds it (waits for "ready"), `round(ids, n)` times one run."""

    def __init__(self, spec: dict, env: dict | None = None, timeout_s: float = 900.0):
        if not isinstance(spec, dict) or spec.get("side") not in SIDES:
            raise ValueError(f"spec must be a dict with side one of {SIDES}, got {spec!r}")
        self.spec, self.timeout_s = spec, timeout_s
        self.proc = subprocess.Popen([sys.executable, "-m", "labkit.benchmarks.workers", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.info = self._read()
        if "error" in self.info:
            self.close()
            raise RuntimeError(f"the {spec['side']} worker could not start: {self.info['error']}")
        if "peer" in self.info:
            rec = self.info["peer"]
            PEERS_SEEN[f"{rec['name']} {rec['version']} from {rec['from']}"] = rec

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(timeout=self.timeout_s)
            tail = (self.proc.stderr.read() or "").strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"the {self.spec['side']} worker exited with code {code}: {tail[0][:200]}")
        return json.loads(line)

    def round(self, ids: list[int], n: int) -> float:
        self.proc.stdin.write(json.dumps([list(ids), n]) + "\n")
        self.proc.stdin.flush()
        return self._read()["seconds_per_token"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def alternate(workers: dict, ids: list[int], n: int, rounds: int = 5, warmup: int = 1,
              settle_s: float = 0.5, seed: int = 0) -> measure.Run:
    """Seconds per token of each name -> `Worker`, one round each in turn (in a fresh random order each round,
    `seed`), `settle_s` idle before each turn: a `labkit.measure.Run` of the workers' own timings, paired by round,
    with the machine's state around the run."""
    if not workers:
        raise ValueError("workers must name at least one Worker")
    names = list(workers)
    state = measure.machine_state()
    samples = {name: [] for name in names}
    rng, order = random.Random(seed), []
    for r in range(warmup + rounds):
        this = names[:]
        rng.shuffle(this)  # a fresh order each round: no side always runs after the same one
        for name in this:
            time.sleep(settle_s)  # the side that ran last goes idle before this one starts
            seconds = workers[name].round(ids, n)
            if r >= warmup:
                samples[name].append(seconds)
        if r >= warmup:
            order.append(this)
    state["loadavg_after"] = measure.machine_state(cpu=False)["loadavg"]
    state["protocol"] = (f"each side in its own worker process, every side in each round in a fresh random order, "
                         f"{settle_s:g} s idle before each turn, {warmup} warm-up round(s)")
    run = measure.Run.from_samples(samples, warmup, state, unit="token")
    run.order = order
    return run


def rates_in_own_processes(specs: dict, ids: list[int], n: int, rounds: int = 5, peer: bool = True,
                           settle_s: float = 0.5, *, env: dict | None = None, peer_env: dict | None = None,
                           peer_name: str = LLAMA_CPP, peer_model: str = "smollm2-135m",
                           infos: dict | None = None, processes: int = 1) -> tuple[measure.Run | None, str | None]:
    """Decode seconds per token of each name -> labkit spec and, with `peer`, of llama.cpp on SmolLM2's GGUF file
    (`peer_name`, default "llama.cpp Q4_1"), every side in its own worker, rounds alternating (`alternate`). Returns
    (the Run, why llama.cpp is missing or None). Workers start one after another, so no side compiles or loads while
    another is timed. `env` / `peer_env`: extra environment for the labkit workers / the peer's (an emulated
    instruction set, another llama.cpp build on PYTHONPATH); `peer_model`: the model whose GGUF file llama.cpp runs;
    `infos`, when given, receives each worker's ready message (its compile and load seconds). `processes`: start
    every side that many times afresh, `rounds` rounds each (`measure.replicate`: compare the result with
    `measure.compare_starts`, which builds the interval from the process-level medians). A peer that does not
    start in the first start is left out of every start (and why is returned); one that started there and fails in a
    later start stops the run with a RuntimeError (its starts would not be paired)."""
    checks.positive_int("processes", processes)
    if processes > 1:
        why_seen: list = []

        def one_start(p: int) -> measure.Run:
            run, why = _rates_once(specs, ids, n, rounds, peer and not why_seen, settle_s, env, peer_env, peer_name,
                                   peer_model, infos if p == 0 else None, seed=p)
            if why is not None:
                why_seen.append(why)  # the peer failed to start: every later start leaves it out too
                if p:
                    raise RuntimeError(f"the peer started in start 0 but not in start {p}: {why}")
            return run

        return measure.replicate(one_start, processes), (why_seen[0] if why_seen else None)
    return _rates_once(specs, ids, n, rounds, peer, settle_s, env, peer_env, peer_name, peer_model, infos)


def _rates_once(specs, ids, n, rounds, peer, settle_s, env, peer_env, peer_name, peer_model, infos, seed: int = 0):
    workers, why = {}, None
    try:
        for name, spec in specs.items():
            workers[name] = Worker(spec, env=env)
        if peer:
            try:
                workers[peer_name] = Worker({"side": "llama.cpp", "model": peer_model}, env=peer_env)
            except RuntimeError as exc:
                why = str(exc)
        if infos is not None:
            infos.update({name: w.info for name, w in workers.items()})
        return alternate(workers, ids, n, rounds, settle_s=settle_s, seed=seed), why
    finally:
        for w in workers.values():
            w.close()


def compile_times(spec: dict, timeout_s: float = 1800.0) -> dict:
    """{"cold_s", "cached_s"}: the compile seconds of a worker on an empty inductor cache, then of a second worker
    on the cache the first one left (each a fresh process: no code cached in memory)."""
    spec = {**spec, "compile": True}
    with tempfile.TemporaryDirectory(prefix="labkit-inductor-") as cache_dir:
        env = {"TORCHINDUCTOR_CACHE_DIR": cache_dir}
        out = {}
        for label in ("cold", "cached"):
            with Worker(spec, env=env, timeout_s=timeout_s) as w:
                out[f"{label}_s"] = w.info["compile_s"]
    return out


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
