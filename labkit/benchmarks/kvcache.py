"""SmolLM2 on this machine: the KV cache's speed-up vs generated length, TTFT vs prompt length, ITL vs position."""
from __future__ import annotations

TITLE = "KV cache: speed-up over no cache vs length (where it crosses 5x), TTFT vs prompt, ITL vs position"

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def run(quick: bool = False) -> dict:
    import torch

    from labkit.benchmarks._models import load_or_skip
    from labkit.generation import latency

    model, tok, skipped = load_or_skip("smollm2-135m")
    if skipped:
        return skipped
    print(f"  torch threads: {torch.get_num_threads()}, SmolLM2-135M float32")
    ids = tok.encode_chat([{"role": "user", "content": PROMPT}])

    n, repeat = (48, 1) if quick else (128, 3)
    rows = latency.speedup_run(model, ids, n, repeat=repeat)
    print(f"  speed-up of the KV cache over re-running the sequence (greedy, prompt {len(ids)} tokens, median of {repeat}):")
    print(f"  {'new tokens':>10s} {'cached s':>9s} {'no cache s':>10s} {'speed-up':>8s}")
    for r in rows:
        if r["new_tokens"] in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128):
            print(f"  {r['new_tokens']:10d} {r['cached_s']:9.2f} {r['uncached_s']:10.2f} {r['speedup']:7.1f}x")
    cross = latency.crossing(rows, "new_tokens", "speedup", 5.0)
    where = f"at about {cross:.0f} new tokens" if cross is not None else f"not within {n} new tokens"
    print(f"  the speed-up crosses 5x {where} (sequence of {len(ids)} + n tokens)")

    prompt_lens = [16, 64, 256] if quick else [16, 64, 256, 1024, 2048]
    ttft = latency.ttft_sweep(model, prompt_lens, repeat=2 if quick else 3)
    print("  TTFT (prefill) vs prompt length:")
    for r in ttft:
        print(f"  {r['prompt_len']:6d} tokens  {r['ttft_s'] * 1e3:8.1f} ms  ({r['prompt_len'] / r['ttft_s']:6.0f} tokens/s)")

    positions = [16, 256, 1024] if quick else [16, 256, 1024, 2048, 4096]
    itl = latency.itl_sweep(model, positions, steps=3 if quick else 7)
    print("  ITL (one decode step) vs position:")
    for r in itl:
        print(f"  {r['position']:6d}         {r['itl_s'] * 1e3:8.1f} ms  ({1 / r['itl_s']:5.1f} tokens/s)")

    kinds = {}
    if not quick:
        print("  ITL at position 1024 by cache kind (steps interleaved across kinds):")
        for row in latency.itl_sweep(model, [1024], steps=7, cache=["contiguous", "paged", "sliding", "quantized"]):
            kinds[row["cache"]] = row["itl_s"]
            print(f"  {row['cache']:12s}   {row['itl_s'] * 1e3:8.1f} ms")
    return {"prompt_len": len(ids), "speedup": rows, "crosses_5x_at": cross, "ttft": ttft, "itl": itl,
            "itl_by_kind_at_1024": kinds, "threads": torch.get_num_threads()}
