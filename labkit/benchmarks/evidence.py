"""The stored evidence: every file in `data/` a chapter reads, what makes it, and whether today's code made it.

Each file a bench writes carries a `provenance` record (`stamp`): the command that made it, the protocol (rounds,
processes, warm-up, as the bench states it), the CPU, the peers it ran beside (llama.cpp's version and
`llama_print_system_info()`), the data files it read (their SHA-256) and a **code record**
(`labkit.measure.provenance.code_record`) over the sources that determine its figures: its declared `sources`,
and once re-made by `run`, only those some process of its run imported (`labkit._loaded`), so that a change to
code the bench never ran leaves the file fresh.

    python -m labkit.benchmarks.evidence check    # = labkit bench --check: fresh / made by older code / no record
    python -m labkit.benchmarks.evidence run      # = make evidence: re-make every file that is not fresh

`check` exits nonzero when a file a chapter reads is not fresh and names the command that re-makes it.
The one exception is `PENDING`: files not yet re-made since provenance records began, each with why. `check` prints
them as pending and fails the moment one of them carries a fresh record (take it off the list) or leaves the
registry; the list only shrinks. `run` re-makes the stale files one after another, each bench in its own process
(its own worker processes inside), writing each file to `.build/evidence/` first and moving it into `data/` only
when the bench finished: a killed run leaves every file whole, and the next `run` starts at the first file that is
still stale (resumable). Its progress goes to the terminal, each bench's output to a log.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from labkit import _loaded
from labkit.measure.clock import now
from labkit.measure.provenance import ROOT, code_record, outdated, scope_or_keep

__all__ = ["Stored", "STORED", "stamp", "status", "check", "remake", "main", "load", "made_by", "decode_runs",
           "peer_table", "DECODE_RUNS", "SAME_FILE", "PEER"]

TIMING = ("labkit/measure/run.py", "labkit/measure/clock.py", "labkit/measure/cpu.py")
MODEL = ("labkit/model", "labkit/quant", "labkit/kvcache", "labkit/generation/stages.py")
PEERS = ("labkit/benchmarks/workers.py", "labkit/benchmarks/peers.py", "labkit/costmodel/measure.py",
         "labkit/measure/replicate.py")
SERVING = ("labkit/serving", "labkit/speculative", "labkit/sampling", "labkit/benchmarks/loading.py")


@dataclass(frozen=True)
class Stored:
    """A stored file: its `command` ({out} is where it writes), the `sources` that determine its figures, the data
    files it reads (`inputs`), the chapters that read it and the protocol, in words."""

    file: str
    command: str
    sources: tuple[str, ...]
    chapters: tuple[str, ...]
    protocol: str
    inputs: tuple[str, ...] = ()
    minutes: int = 5  # about how long it takes on 2 cores


STORED = {s.file: s for s in (
    Stored("step_bench.json", "labkit bench --only step --json {out}",
           ("labkit/benchmarks/step.py", "labkit/benchmarks/step_compiled.py", "labkit/generation/profile.py",
            *PEERS, *MODEL, *TIMING), ("03a", "06b"),
           "every format in one process for calls, splits and T(k); decode rates of the eager formats and llama.cpp, each "
           "side in its own worker process, 6 fresh starts of 2 rounds (labkit.benchmarks.workers)", minutes=45),
    Stored("compiled_bench.json", "labkit bench --only compiled --json {out}",
           ("labkit/benchmarks/compiled.py", "labkit/benchmarks/step.py", "labkit/benchmarks/step_compiled.py",
            "labkit/generation/profile.py", *PEERS, *MODEL, *TIMING), ("03a", "06b"),
           "compile times in fresh processes; decode rates with each side in its own worker process, 6 fresh starts of 2 "
           "rounds (each start compiles both formats from the disk cache)", minutes=78),
    Stored("kernel_bench.json", "labkit bench --only kernel --json {out}",
           ("labkit/benchmarks/kernel.py", "labkit/generation/profile.py", "labkit/benchmarks/speculative.py",
            "labkit/speculative", "labkit/generation/reply.py", *PEERS, *MODEL, *TIMING),
           ("03a", "06a", "06b", "07a"),
           "products and T(k) interleaved in one process; decode and prompt lookup with each side in its own worker "
           "process, 6 fresh starts of 2 rounds; AVX2 emulation against an AVX2-only llama.cpp when LABKIT_LLAMA_AVX2 "
           "names one", minutes=12),
    Stored("kv_compression.json", "python -m labkit.benchmarks.kv_compression --json {out}",
           ("labkit/benchmarks/kv_compression.py", "labkit/benchmarks/kvcache.py", "labkit/metrics",
            "labkit/generation/latency.py", "labkit/generation/compression.py", "labkit/generation/passkey.py",
            "labkit/train/compare.py", *MODEL, *TIMING), ("04a",),
           "quality on fixed windows (deterministic); ITL timed in one process, every step kept", minutes=45),
    Stored("quant_quality.json", "labkit bench --only quality --json {out}",
           ("labkit/benchmarks/quality.py", "labkit/metrics", *MODEL), ("06", "06a"),
           "quality on fixed windows of held-out text (deterministic, no timing)", minutes=35),
    Stored("gemma3_quality.json", "labkit bench --only gemma3_quality --json {out}",
           ("labkit/benchmarks/gemma3_quality.py", "labkit/metrics", "labkit/tokenizer/spm.py", *MODEL), ("06a",),
           "quality on fixed windows of held-out text (deterministic, no timing)", minutes=5),
    Stored("serving_spec.json", "python -m labkit.benchmarks.serving_spec --json {out}",
           ("labkit/benchmarks/serving_spec.py", *SERVING, *MODEL, *TIMING), ("09a",),
           "greedy replies recorded once; pass costs timed in one process; the replay simulated", minutes=15),
    Stored("serving_spec_live.json", "python -m labkit.benchmarks.serving_spec_live --model float32 --drafters "
           "'prompt lookup' --budgets 'fixed:3,auto' --json {out}",
           ("labkit/benchmarks/serving_spec_live.py", *SERVING, *MODEL, *TIMING), ("09a",),
           "live engine runs at each load and seed, interleaved by seed", inputs=("serving_spec.json",), minutes=34),
    Stored("serving_spec_live_native.json", "python -m labkit.benchmarks.serving_spec_live --model native --json {out}",
           ("labkit/benchmarks/serving_spec_live.py", *SERVING, *MODEL, *TIMING), ("09a",),
           "live engine runs at each load and seed, interleaved by seed", inputs=("serving_spec.json",), minutes=30),
)}


# stored files not yet re-made by today's code (no record yet), with why (module docstring)
PENDING: dict = {}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _peers() -> dict:
    from labkit.benchmarks import workers

    return dict(workers.PEERS_SEEN)


def stamp(report: dict, path, command: str | None = None) -> dict:
    """`report` with its `provenance` record (module docstring) for the file `path`; sources and protocol from
    `STORED` when the file is one of its names, else the whole `labkit/` package."""
    from labkit import threads
    from labkit.measure.cpu import cpu_info

    entry = STORED.get(Path(path).name)
    sources = entry.sources if entry else ("labkit",)
    report = dict(report)
    report["provenance"] = {
        "command": command or " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).name, *sys.argv[1:]]),
        "protocol": entry.protocol if entry else "as the bench prints it",
        "cpu": report.get("cpu") or cpu_info(),
        "peers": _peers(),
        "inputs": {f: _sha(ROOT / "data" / f) for f in (entry.inputs if entry else ())},
        "code": code_record(sources),
        "threads": threads.status(),  # the thread count the bench ran on, and why (labkit.threads)
    }
    return report


def status(name: str, data_dir: Path | None = None) -> tuple[str, str]:
    """("fresh" | "older code" | "no record" | "missing", why) for the stored file `name`."""
    entry = STORED[name]
    path = (data_dir or ROOT / "data") / name
    if not path.is_file():
        return "missing", "the file is not there"
    rec = json.loads(path.read_text()).get("provenance")
    if not rec or "code" not in rec:
        return "no record", "the file does not record which code made it"
    moved = outdated(rec["code"], code_record(entry.sources))
    moved += [f"data/{f} (re-made since)" for f, sha in rec.get("inputs", {}).items()
              if not (ROOT / "data" / f).is_file() or _sha(ROOT / "data" / f) != sha]
    moved += [f"data/{f} (read, not recorded)" for f in entry.inputs if f not in rec.get("inputs", {})]
    if moved:
        return "older code", ", ".join(moved[:6]) + (f" and {len(moved) - 6} more" if len(moved) > 6 else "")
    return "fresh", rec.get("command", "")


def check(data_dir: Path | None = None, out=print, pending: dict | None = None) -> int:
    """Print every stored file's status; 1 when a file a chapter reads is not fresh (beyond `PENDING`), else 0."""
    pending = PENDING if pending is None else pending
    bad, waiting = 0, 0
    for name in sorted(set(pending) - set(STORED)):
        bad += 1
        out(f"PENDING lists data/{name}, which is not a stored file: take it off the list")
    for name, entry in STORED.items():
        state, why = status(name, data_dir)
        if name in pending and state == "fresh":
            bad += 1
            out(f"fresh      data/{name}: re-made, but still in PENDING: take it off the list")
            continue
        if name in pending:
            waiting += 1
            out(f"pending    data/{name} (chapters {', '.join(entry.chapters)}): {state}; {pending[name]}")
            continue
        out(f"{state:10s} data/{name} (chapters {', '.join(entry.chapters)}): {why}")
        if state != "fresh":
            bad += 1
            out(f"           re-make it: LABKIT_THREADS=all {entry.command.format(out='data/' + name)}   (or: make "
                "evidence)")
    fresh = len(STORED) - waiting - sum(1 for n in STORED if n not in pending and status(n, data_dir)[0] != "fresh")
    out(f"{fresh} of {len(STORED)} stored files fresh, {waiting} pending" + ("; NOT all checked files fresh" if bad else ""))
    return 1 if bad else 0


def remake(names=None, log_dir: Path | None = None, out=print, force: bool = False) -> int:
    """Re-make each named (default: every) stored file that is not fresh (`force`: fresh ones too, e.g. after a run
    on a machine that was busy), in order, each bench in its own process."""
    from labkit.data.files import write_sums

    names = list(names or STORED)
    unknown = [n for n in names if n not in STORED]
    if unknown:
        raise ValueError(f"names must be stored files among {sorted(STORED)}, got {unknown}")
    log_dir = log_dir or ROOT / ".build" / "evidence"
    log_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for i, name in enumerate(names, 1):
        state, _ = status(name)
        if state == "fresh" and not force:
            out(f"[{i}/{len(names)}] data/{name}: fresh, kept")
            continue
        entry, tmp, log, loaded_log = STORED[name], log_dir / name, *(log_dir / (name + x) for x in (".log", ".loaded"))
        loaded_log.write_text("")
        cmd = entry.command.format(out=shlex.quote(str(tmp)))
        out(f"[{i}/{len(names)}] data/{name}: {state}; running (about {entry.minutes} min; log {log})", flush=True)
        before = code_record(entry.sources)
        start = now()
        with open(log, "w") as f:
            # torch's own thread count, whatever else the machine runs (labkit.threads): the stored figures are a
            # quiet machine's, and a bench that measures a busy one chooses for its own workers
            env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                   "LABKIT_THREADS": "all", _loaded.ENV: str(loaded_log)}
            code = subprocess.call(cmd, shell=True, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
        minutes = (now() - start) / 60
        if code != 0 or not tmp.is_file():
            failed += 1
            out(f"      failed after {minutes:.1f} min (exit {code}); the stored file is unchanged; see {log}")
            continue
        report = json.loads(tmp.read_text())
        # scoped to the declared sources some process of its run loaded (labkit._loaded); if one of them changed
        # while it ran, the record is the code at its start, so the file reads stale
        report["provenance"]["code"], said = scope_or_keep(before, _loaded.read(loaded_log))
        out(f"      {said}")
        if outdated(report["provenance"]["code"], code_record(entry.sources)):
            out(f"      the code it ran changed during the run: data/{name} is recorded as made by the code at its "
                "start (stale now)")
        report["provenance"]["command"] = entry.command.format(out=f"data/{name}")
        report["provenance"]["wall_s"] = minutes * 60
        (ROOT / "data" / name).write_text(json.dumps(report, default=float) + "\n")
        tmp.unlink()
        write_sums()
        out(f"      wrote data/{name} in {minutes:.1f} min", flush=True)
    return 1 if failed else 0


# each stored decode run, where it sits in the file, and the labkit side set against llama.cpp: the one that runs the
# same GGUF file's Q4_1 blocks (named in advance, not picked as the fastest: no winner's curse)
DECODE_RUNS = {"step_bench.json": ("step", "tok_s_run"), "compiled_bench.json": ("compiled", "tok_s_run"),
               "kernel_bench.json": ("kernel", "decode", "native", "run")}
SAME_FILE = {"step_bench.json": "Q4_1 (GGUF)", "compiled_bench.json": "Q4_1 (GGUF) compiled",
             "kernel_bench.json": "labkit Q4_1 × Q8 exported"}
PEER = "llama.cpp"  # a variant whose name starts with this is the peer


def load(name: str) -> dict:
    """The stored report `data/NAME` (one of `STORED`)."""
    if name not in STORED:
        raise ValueError(f"name must be a stored file among {sorted(STORED)}, got {name!r}")
    return json.loads((ROOT / "data" / name).read_text())


def made_by(name: str, builds: bool = True) -> str:
    """One line on what made a stored file: the code (fresh or not), the command, the CPU and the peers' versions,
    with their builds (llama.cpp's `system_info()`) unless `builds` is False."""
    from labkit.measure.cpu import describe

    report, (state, why) = load(name), status(name)
    rec = report.get("provenance") or {}
    code = ("made by today's code" if state == "fresh" else f"NOT made by today's code ({state}: {why})")
    peers = "; ".join(f"{p['name']} {p['version']}" + (f" ({p['system_info'].strip().rstrip('|').strip()})" if builds
                                                      else "") for p in rec.get("peers", {}).values())
    command = rec.get("command") or report.get("command") or "a command it does not record"
    cpu = rec.get("cpu") or report.get("cpu")  # never describe this machine in place of one the file omits
    return (f"data/{name}: {code}, `{command}`, on {describe(cpu) if cpu else 'a CPU it does not record'}"
            + (f"; peer: {peers}" if peers else ""))


def decode_runs() -> dict:
    """{file: `measure.Run`} of every fresh stored decode run that has the peer in it (tokens/s of each side, paired
    rounds), read back with their pairing (`Run.from_dict`); a file not made by today's code is left out."""
    from labkit.measure import Run

    out = {}
    for name, path in DECODE_RUNS.items():
        if not (ROOT / "data" / name).is_file():
            continue
        node = load(name)["results"]
        for key in path:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        if status(name)[0] != "fresh":  # a figure from other code is not shown beside today's
            continue
        if isinstance(node, dict) and "variants" in node and any(v.startswith(PEER) for v in node["variants"]):
            out[name] = Run.from_dict(node)
    return out


def peer_table() -> list[dict]:
    """One row per stored file with a decode run: llama.cpp's tokens/s there, the labkit side that runs the same GGUF
    file (`SAME_FILE`, named in advance) and their `measure.compare_starts` (a ratio with its interval from the
    process-level medians of a run over several starts, else from paired rounds): each file's figures side by side
    in one run, never set against another file's. Tokens/s and rounds are at the level the interval is built at."""
    from labkit import measure

    rows = []
    for name, run in decode_runs().items():
        peer = next(v for v in run if v.startswith(PEER))
        side = SAME_FILE[name]
        if side not in run.timings:
            raise ValueError(f"data/{name}'s decode run has no side {side!r} (it has {list(run)}): update SAME_FILE")
        level, c = measure.at_level(run), measure.compare_starts(run, side, peer)
        rows.append({"file": name, "peer": peer, "peer_tok_s": 1 / level[peer].median, "labkit": side,
                     "labkit_tok_s": 1 / level[side].median, "rounds": c.rounds,
                     "processes": run.machine.get("processes", 1), "compare": c})
    return rows


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("check", "run"))
    p.add_argument("--only", nargs="*", metavar="FILE", help="stored files to re-make (run)")
    p.add_argument("--force", action="store_true", help="re-make the named files even when fresh (run)")
    args = p.parse_args(argv)
    if args.action == "check":
        return check()
    if args.force and not args.only:
        p.error("--force needs --only FILE ...: name the files to re-make")
    return remake(args.only, out=lambda *a, **k: print(*a, flush=True), force=args.force)


if __name__ == "__main__":
    raise SystemExit(main())
