"""The parts of the serving benchmark that start things: the HTTP endpoint and two processes."""
from __future__ import annotations


import numpy as np

from labkit.measure.clock import now as clock_now

PROMPTS = ["Tell me about the moon.", "What is a prime number?", "Name three rivers.", "Why is the sky blue?",
           "Write a haiku about rain.", "What does a CPU do?", "Give me a tip for sleeping well.", "What is tea?"]


def endpoint(model, tok, quick: bool) -> dict:
    """`labkit serve` in this process, a bounded load test from client threads, then a clean stop."""
    from labkit.serving.http.client import load_test
    from labkit.serving.http.server import Server

    prompts = PROMPTS[:4] if quick else PROMPTS * 2
    out = {}
    for concurrency in (1, 8):
        with Server(model, tok, "smollm2-135m", policy="chunked", max_batch=8, token_budget=64, num_blocks=256) as srv:
            t = clock_now()
            rows = load_test(srv.url, "smollm2-135m", prompts, concurrency=concurrency, max_tokens=24, timeout_s=120)
            wall = clock_now() - t
        errors = [r["error"] for r in rows if "error" in r]
        ttft = [r["ttft_s"] for r in rows if r.get("ttft_s") is not None]
        n_events = sum(len(r.get("times", [])) for r in rows)
        out[concurrency] = {"requests": len(rows), "errors": errors, "wall_s": wall, "events_per_s": n_events / wall,
                            "ttft_p50_s": float(np.median(ttft)), "ttft_p99_s": float(np.percentile(ttft, 99))}
        print(f"  endpoint, {len(rows)} streamed requests at concurrency {concurrency}: {wall:.1f} s, "
              f"{n_events / wall:.1f} text events/s, client TTFT p50 {out[concurrency]['ttft_p50_s']:.2f} s "
              f"p99 {out[concurrency]['ttft_p99_s']:.2f} s, errors {len(errors)}")
    return out


def two_processes(quick: bool) -> dict:
    """TP=2 vs one process, prefill in one process and decode in another, two data-parallel replicas (gloo)."""
    from labkit.costmodel import hardware
    from labkit.serving.studies import parallel

    prompt = list(range(5, 5 + (32 if quick else 128)))
    n_new = 8 if quick else 24
    one = parallel.run_tensor_parallel("shakespeare", prompt, n_new, world=1)
    two = parallel.run_tensor_parallel("shakespeare", prompt, n_new, world=2)
    per_step = two["allreduce_s_per_step"]
    print(f"  tensor parallel (Shakespeare, gloo on 127.0.0.1): 1 process {one['step_s_median'] * 1e3:.1f} ms/step, "
          f"2 processes {two['step_s_median'] * 1e3:.1f} ms/step, of which all-reduce {per_step * 1e3:.1f} ms "
          f"({two['allreduce_count'] // max(n_new, 1)} per step); same tokens: {one['ids'] == two['ids']}")
    dis = parallel.run_disaggregated("shakespeare", prompt, n_new)
    nvlink = hardware("h100-sxm").link_bw_gbs * 1e9
    print(f"  disaggregated: KV cache of {len(prompt)} tokens = {dis['kv_bytes'] / 2**20:.2f} MiB sent in "
          f"{dis['transfer_s'] * 1e3:.1f} ms ({dis['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s here; the H100 profile's "
          f"NVLink {nvlink / 1e9:.0f} GB/s would take {dis['kv_bytes'] / nvlink * 1e6:.1f} us)")
    prompts = [list(range(3 + i, 3 + i + 16)) for i in range(4 if quick else 8)]
    dp1 = parallel.run_data_parallel("shakespeare", prompts, n_new, world=1)
    dp2 = parallel.run_data_parallel("shakespeare", prompts, n_new, world=2)
    print(f"  data parallel: 1 replica {dp1['tokens_per_s']:.0f} tok/s, 2 replicas {dp2['tokens_per_s']:.0f} tok/s "
          f"({dp2['tokens_per_s'] / dp1['tokens_per_s']:.2f}x on 2 cores)")
    strip = lambda d: {k: v for k, v in d.items() if k not in ("prefill_logits",)}  # noqa: E731
    return {"tp1": strip(one), "tp2": strip(two), "disaggregated": dis, "dp1": dp1, "dp2": dp2}
