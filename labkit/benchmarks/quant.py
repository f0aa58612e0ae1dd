"""Fewer bits per weight, faster decode? SmolLM2 at batch 1 in float32, int8 and int4 (RTN), side by side.

Each format decodes greedily after the same prompt; rounds are interleaved across formats so
machine noise hits all alike, and each figure is a median over rounds. A decode step reads
every weight once, so the bytes per token and the GB/s they imply are printed next to the
speed, with this machine's streaming-read bandwidth (sampled every round) as the roofline:
the roofline's tokens/s for a format is bandwidth / bytes per token.
"""
from __future__ import annotations

import statistics
import time

TITLE = "SmolLM2 decode tokens/s by weight format (float32, int8, int4 RTN, the GGUF Q4_1 blocks): bytes/token, GB/s, roofline"

PROMPT = "What is the capital of France? Answer in one sentence."


def _decode_s(model, ids: list[int], n: int) -> float:
    import labkit

    state = labkit.prefill(model, ids, max_len=len(ids) + n + 1)
    start = time.perf_counter()
    labkit.decode(model, state, n)
    return (time.perf_counter() - start) / n


def run(quick: bool = False) -> dict:
    import torch

    import labkit
    from labkit.costmodel.measure import read_bandwidth_gb_s
    from labkit.quant import has_kernel, model_nbytes, quantize_model

    from labkit.benchmarks._models import load_or_skip

    model, tok, skipped = load_or_skip("smollm2-135m")
    if skipped:
        return skipped
    if not (has_kernel(8) and has_kernel(4)):
        print("  skipped: this torch build has no packed int8/int4 CPU kernels")
        return {"skipped": "no packed kernels"}
    bf16 = torch.bfloat16
    native, _ = labkit.load("smollm2-135m", dtype=bf16, weights="gguf")
    formats = {"float32": model,
               "int8 RTN, fp32 act": quantize_model(model, bits=8),
               "int8 RTN, bf16 act": quantize_model(model, bits=8, act_dtype=bf16),
               "int4 RTN g32, bf16 act": quantize_model(model, bits=4, group_size=32, act_dtype=bf16),
               "GGUF Q4_1 as stored": native}
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]))
    reply = {name: labkit.decode(m, labkit.prefill(m, ids), 8) for name, m in formats.items()}
    n, rounds = (16, 3) if quick else (48, 7)
    steps = {name: [] for name in formats}
    roof = []
    for name, m in formats.items():  # warm-up
        _decode_s(m, ids, 4)
    for _ in range(rounds):
        roof.append(read_bandwidth_gb_s(seconds=0.3))
        for name, m in formats.items():
            steps[name].append(_decode_s(m, ids, n))
    bw = statistics.median(roof)
    print(f"  torch threads: {torch.get_num_threads()}; {n} greedy tokens per round, {rounds} rounds interleaved; "
          f"streaming read {bw:.1f} GB/s (median of rounds, {min(roof):.1f}-{max(roof):.1f})")
    print(f"  {'format':24s} {'MB/token':>9s} {'tokens/s':>9s} {'vs fp32':>8s} {'GB/s':>6s} {'roofline tok/s':>15s}  first 8 tokens")
    rows = {}
    base = statistics.median(steps["float32"])
    for name, m in formats.items():
        step = statistics.median(steps[name])
        nbytes = model_nbytes(m)
        rows[name] = {"bytes_per_token": nbytes, "step_s": step, "tokens_per_s": 1 / step, "vs_float32": base / step,
                      "gb_s": nbytes / step / 1e9, "roofline_tokens_per_s": bw * 1e9 / nbytes,
                      "same_tokens_as_float32": reply[name] == reply["float32"]}
        r = rows[name]
        print(f"  {name:24s} {nbytes / 1e6:9.1f} {r['tokens_per_s']:9.1f} {r['vs_float32']:7.2f}x {r['gb_s']:6.1f} "
              f"{r['roofline_tokens_per_s']:15.0f}  {'same' if r['same_tokens_as_float32'] else 'differs'}")
    return {"formats": rows, "roofline_gb_s": bw, "threads": torch.get_num_threads(), "tokens_per_round": n}
