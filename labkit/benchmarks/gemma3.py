"""Gemma 3 270M from the file people download: its bytes per format, its KV cache, and its decode beside llama.cpp.

Three parts, printed and returned:

- the Q4_K_M file's tensors by GGML type (tensors, weights, bytes, bits per weight, share of the file);
- the KV bytes of one sequence with five sliding layers (512 tokens) to every global one, against the same
  model with every layer global (`ModelConfig.kv_bytes_at`);
- greedy decode speed: labkit (the file dequantized to float32, the lab's transformer with Gemma's config)
  and llama.cpp on the same file, each in its own process, rounds alternating (`labkit.benchmarks.workers`),
  the ratio from `labkit.measure.compare` with its interval. Without llama-cpp-python: labkit alone, said so.
"""
from __future__ import annotations

TITLE = "Gemma 3 270M (Q4_K_M): bytes per format, sliding-window KV, decode beside llama.cpp"


def run(quick: bool = False) -> dict:
    from labkit import measure
    from labkit.benchmarks import workers
    from labkit.data import paths
    from labkit.model.gguf import config_from_gguf, format_table, open_gguf

    try:
        path = paths.gemma3_gguf_path()
    except FileNotFoundError as exc:
        print(f"  (skipped: {exc})")
        return {"skipped": str(exc)}
    reader = open_gguf(path)
    table = format_table(reader)
    print(f"  {path.name}: {path.stat().st_size:,} bytes")
    for r in table:
        print(f"    {r['type']:5s} {r['tensors']:4d} tensors {r['weights']:12,d} weights {r['bytes']:12,d} bytes "
              f"{r['bits_per_weight']:6.2f} bits/weight {r['share']:6.1%}")
    cfg = config_from_gguf(reader)
    kv = {n: (cfg.kv_bytes_at(n, 4), cfg.replace(layer_windows=()).kv_bytes_at(n, 4)) for n in (512, 4096, 32768)}
    for n, (local, whole) in kv.items():
        print(f"  KV of {n:6,d} tokens (float32): {local / 2**20:8.1f} MiB with 5:1 sliding layers, "
              f"{whole / 2**20:8.1f} MiB all global ({local / whole:.0%})")
    from labkit.tokenizer.gguf import from_gguf

    ids = from_gguf(path).encode("The history of the printing press begins in the fifteenth century, when")
    # quick: 4 rounds in one process; the full run: every side started afresh 6 times, 2 rounds each (an interval
    # from the 6 process-level medians)
    n, rounds, processes = (16, 4, 1) if quick else (32, 2, measure.MIN_PROCESSES)
    run_, why = workers.rates_in_own_processes({"labkit float32": {"side": "labkit", "model": "gemma3-270m"}}, ids, n,
                                               rounds, peer_name="llama.cpp", peer_model="gemma3-270m",
                                               processes=processes)
    out = {"file": path.name, "formats": table, "kv_bytes": {str(k): v for k, v in kv.items()},
           "decode": run_.as_dict(), "prompt_tokens": len(ids), "new_tokens": n}
    for name, timing in run_.timings.items():
        print(f"  decode {name:15s} {1 / timing.median:7.1f} tok/s (IQR {timing.iqr / timing.median:.0%})")
    if why:
        print(f"  (no llama.cpp row: {why})")
        return out
    cmp = measure.compare_starts(run_, "labkit float32", "llama.cpp", names=("labkit", "llama.cpp"))
    out["labkit_vs_llama_cpp"] = cmp.as_dict()
    print(f"  {cmp}")
    return out
