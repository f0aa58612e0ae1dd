"""Fewer bits per weight, faster decode? SmolLM2 at batch 1 in every weight format, next to its peers.

labkit decodes greedily in float32, bfloat16, int8 and int4 (RTN on the packed kernels) and
from the GGUF file's own Q4_1 blocks, with int8 activations and integer dot products (Q8_0 W8A8,

Q4_1 W4A8 on `torch._int_mm`) and in MXFP4 / NVFP4 (their reference path: the dequantized
weights multiplied in float32, so their speed is float32's, listed for the bytes); Hugging Face transformers (float32 and bfloat16, read
from the same file) and llama.cpp (the same Q4_1 file) decode the same prompt when they are
installed. Every timing is one `labkit.measure.run`: each round runs every contender once, in a
fresh random order, its prefill untimed (`setup`), so machine noise hits all alike; every figure
is a median over rounds, and each target is a `measure.claim` on a `measure.compare` of paired
rounds (the peers run in this process, beside labkit: `labkit bench --only kernel` and `step` run
each side in its own process for the stored comparisons). A decode step reads every weight once, so bytes per
token and the GB/s they imply are printed next to the speed, with this machine's
streaming-read bandwidth (sampled every round) as the roofline: the roofline's tokens/s
for a format is bandwidth / bytes per token. Prefill (time to first token) at 64 and 512
prompt tokens of the held-out play follows, for the same contenders.
"""
from __future__ import annotations

import statistics

TITLE = ("SmolLM2 decode tokens/s and prefill TTFT by weight format (fp32, bf16, int8, int4, GGUF Q4_1, W8A8, MXFP4, "
         "NVFP4) vs transformers and llama.cpp, and one product in every kernel")

PROMPT = "What is the capital of France? Answer in one sentence."
PREFILL_TOKENS = (64, 512)
TARGETS = [("bfloat16", "transformers bfloat16", 1.3), ("int8 RTN, bf16 act", "float32", 2.0),
           ("int4 RTN g32, bf16 act", "float32", 2.5)]


def _labkit_decoder(model, ids: list[int], n: int):
    """(setup, call): the prefill (untimed) and `n` greedy decode steps after it."""
    import labkit

    state = {}

    def setup():
        state["s"] = labkit.prefill(model, ids, max_len=len(ids) + n + 1)

    return setup, lambda: labkit.decode(model, state["s"], n)


def _labkit_prefill(model, ids: list[int]) -> None:
    import labkit

    labkit.prefill(model, ids, max_len=len(ids) + 1)


def _transformers_decoder(model, ids: list[int], n: int):
    import inspect

    import torch

    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # renamed in 5.x
    state = {}

    def setup():
        with torch.inference_mode():
            out = model(torch.tensor([ids]), use_cache=True)
        state["past"], state["token"] = getattr(out, key), out.logits[:, -1].argmax(-1, keepdim=True)

    def call():
        with torch.inference_mode():
            for _ in range(n):
                out = model(state["token"], use_cache=True, **{key: state["past"]})
                state["past"], state["token"] = getattr(out, key), out.logits[:, -1].argmax(-1, keepdim=True)

    return setup, call


def _transformers_prefill(model, ids: list[int]) -> None:
    import torch

    with torch.inference_mode():
        model(torch.tensor([ids]), use_cache=True)


def _llama_decoder(llm, ids: list[int], n: int):
    import numpy as np

    def setup():
        llm.reset()
        llm.eval(ids)

    def call():
        for _ in range(n):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])

    return setup, call


def _llama_prefill(llm, ids: list[int]) -> None:
    llm.reset()
    llm.eval(ids)


def _contenders(bf16):
    """name -> (decode runner, prefill runner, model, bytes read per token); labkit first, then the peers found."""
    import torch

    import labkit
    from labkit.benchmarks import peers
    from labkit.benchmarks.smollm2 import load_transformers
    from labkit.quant import intdot, model_nbytes, quantize_model

    sums = intdot.resolve_sums("auto")  # exact float32 block products
    model, tok = labkit.load("smollm2-135m")
    native = labkit.load("smollm2-135m", dtype=bf16, weights="gguf")[0]
    mine = {"float32": model, "bfloat16": labkit.load("smollm2-135m", dtype=bf16)[0],
            "int8 RTN, fp32 act": quantize_model(model, bits=8, act_dtype=torch.float32),
            "int8 RTN, bf16 act": quantize_model(model, bits=8, act_dtype=bf16),
            "int4 RTN g32, bf16 act": quantize_model(model, bits=4, group_size=32, act_dtype=bf16),
            "GGUF Q4_1 as stored": native,
            f"Q8_0 W8A8, {sums}": quantize_model(model, fmt="Q8_0", activations="int8"),
            f"Q4_1 W4A8, {sums}": quantize_model(model, fmt="Q4_1", activations="int8"),
            "MXFP4 (fp32 product)": quantize_model(model, fmt="MXFP4"),
            "NVFP4 (fp32 product)": quantize_model(model, fmt="NVFP4")}
    out = {name: (_labkit_decoder, _labkit_prefill, m, model_nbytes(m)) for name, m in mine.items()}
    for dtype, like in ((model.tok_embeddings.weight.dtype, "float32"), (bf16, "bfloat16")):
        peer = load_transformers(dtype)
        if peer is None:
            print("  transformers (+ accelerate) is not installed: no transformers rows")
            break
        out[f"transformers {like}"] = (_transformers_decoder, _transformers_prefill, peer, out[like][3])
    llm = peers.load_llama_cpp()
    if llm is None:
        print("  llama-cpp-python is not installed (pip install -e '.[peers]'): no llama.cpp row")
    else:
        out["llama.cpp Q4_1"] = (_llama_decoder, _llama_prefill, llm, out["GGUF Q4_1 as stored"][3])
    return out, tok


def products(model, rounds: int = 5) -> dict:
    """One SmolLM2 product (block 0's gate and up projection, one input row) in every kernel, interleaved.

    name -> {"us": microseconds a call, "bytes": the format's bytes, "gb_s": bytes / time}.
    """
    import torch

    from labkit.generation.profile import layer_rates
    from labkit.quant import QuantLinear, intdot
    from labkit.quant.blocklinear import BlockLinear

    w = model.layers[0].mlp.w_gate_up.weight.detach().float()
    x = torch.randn(1, w.shape[1], generator=torch.Generator().manual_seed(0))
    bf = torch.bfloat16
    layers = {"float32 mm": (lambda v, wt=w.t(): v @ wt, w.numel() * 4),
              "bfloat16 mm": (lambda v, wt=w.t().to(bf): v.to(bf) @ wt, w.numel() * 2)}
    for name, q in (("int8 packed, bf16 act", QuantLinear.from_float(w, 8, act_dtype=bf)),
                    ("int4 g32 packed, bf16 act", QuantLinear.from_float(w, 4, 32, act_dtype=bf)),
                    ("Q8_0 W8A8, reference sums", BlockLinear(w, "Q8_0", "int8", "reference")),
                    ("Q8_0 W8A8, float sums", BlockLinear(w, "Q8_0", "int8", "float"))):
        layers[name] = (q, q.nbytes())
    if intdot.has_int_mm() and intdot.int_mm_exact():  # no int_mm rows where its sums are inexact here
        for fmt, kind in (("Q8_0", "W8A8"), ("Q4_1", "W4A8")):
            q = BlockLinear(w, fmt, "int8", "int_mm")
            layers[f"{fmt} {kind}, int_mm"] = (q, q.nbytes())
    layers["Q8_1 activations alone"] = (lambda v: intdot.quantize_activations(v, with_sum=True), 0)
    us = layer_rates({k: f for k, (f, _) in layers.items()}, x, rounds=rounds)
    return {k: {"us": us[k], "bytes": b, "gb_s": b / us[k] / 1e3 if b else None} for k, (_, b) in layers.items()}


def _decode_run(contenders: dict, ids: list[int], n: int, rounds: int, between=None):
    """A `measure.Run` of `n` decode steps of every contender (seconds per token), its prefill untimed before each;
    `between()` runs (untimed) once a round, before the first contender's call."""
    from labkit import measure

    made = {name: e[0](e[2], ids, n) for name, e in contenders.items()}
    first = {"name": next(iter(made))}

    def setup(name):
        if name == first["name"] and between is not None:
            between()
        made[name][0]()

    for warm_setup, warm_call in made.values():  # warm-up, untimed
        warm_setup()
        warm_call()
    return measure.run({name: call for name, (_, call) in made.items()}, rounds=rounds, warmup=0, per=n, unit="token",
                       setup=setup, machine=False, loops=1)


def run(quick: bool = False) -> dict:
    import torch

    from labkit.costmodel.measure import read_bandwidth_gb_s
    from labkit.quant import has_kernel
    from labkit.quant.sweep import held_out_ids

    if not (has_kernel(8) and has_kernel(4)):
        print("  skipped: this torch build has no packed int8/int4 CPU kernels")
        return {"skipped": "no packed kernels"}
    try:
        contenders, tok = _contenders(torch.bfloat16)
    except FileNotFoundError as exc:
        print(f"  skipped: {exc}")
        return {"skipped": str(exc)}
    ids = tok.encode_chat([{"role": "user", "content": PROMPT}])
    n, rounds = (16, 6) if quick else (48, 8)  # 6 paired rounds: the fewest a 95 % interval needs
    roof = []
    steps = _decode_run(contenders, ids, n, rounds, between=lambda: roof.append(read_bandwidth_gb_s(seconds=0.3)))
    bw = statistics.median(roof)  # the streaming read, a roofline sample per round (not a timing of the contenders)
    print(f"  torch threads: {torch.get_num_threads()}; {n} greedy tokens per round, {rounds} rounds, each in a fresh "
          f"random order; streaming read {bw:.1f} GB/s (median of rounds, {min(roof):.1f}-{max(roof):.1f})")
    rate = {name: 1 / t.median for name, t in steps.items()}
    peer = max((r for name, r in rate.items() if name.startswith("transformers")), default=None)
    llama = rate.get("llama.cpp Q4_1")
    print(f"  {'format':24s} {'MB/token':>9s} {'tokens/s':>9s} {'vs fp32':>8s} {'vs HF':>6s} {'vs llama':>8s} "
          f"{'GB/s':>6s} {'roofline tok/s':>15s}")
    rows = {}
    for name, (_, _, _, nbytes) in contenders.items():
        r = rows[name] = {"bytes_per_token": nbytes, "step_s": 1 / rate[name], "tokens_per_s": rate[name],
                          "vs_float32": rate[name] / rate["float32"], "gb_s": nbytes * rate[name] / 1e9,
                          "roofline_tokens_per_s": bw * 1e9 / nbytes,
                          "vs_transformers_best": rate[name] / peer if peer else None,
                          "vs_llama_cpp": rate[name] / llama if llama else None}
        fmt = lambda v: f"{v:5.2f}x" if v else "    - "  # noqa: E731
        print(f"  {name:24s} {nbytes / 1e6:9.1f} {r['tokens_per_s']:9.1f} {r['vs_float32']:7.2f}x "
              f"{fmt(r['vs_transformers_best'])} {fmt(r['vs_llama_cpp']):>8s} {r['gb_s']:6.1f} {r['roofline_tokens_per_s']:15.0f}")
    print("  (vs HF: against transformers' faster dtype on this machine; vs llama: against llama.cpp on the Q4_1 file)")
    targets = []
    from labkit import measure

    labkit_names = [k for k in rows if not k.startswith(("transformers", "llama"))]
    for name, against, goal in TARGETS + ([("fastest labkit", "llama.cpp Q4_1", 0.5)] if llama else []):
        if against not in rate:
            continue
        mine = max(labkit_names, key=rate.get) if name == "fastest labkit" else name
        c = measure.compare(steps[mine], steps[against])
        verdict = measure.claim(f"target {mine} >= {goal}x {against}", c, low=goal,
                                selected_from=len(labkit_names) if name == "fastest labkit" else 1)
        targets.append({"format": mine, "against": against, "compare": c.as_dict(), "target": goal,
                        "claim": verdict.as_dict()})
        print(f"  {verdict}")
    per_product = products(contenders["float32"][2], rounds=3 if quick else 7)
    print(f"  one product, SmolLM2 block 0 gate+up {tuple(contenders['float32'][2].layers[0].mlp.w_gate_up.weight.shape)}, "
          "one input row (interleaved, median):")
    for name, r in per_product.items():
        gbs = f"{r['gb_s']:6.1f} GB/s of the format's bytes" if r["gb_s"] else ""
        print(f"  {name:28s} {r['us']:8.1f} us  {gbs}")
    prefill = {}
    for p in PREFILL_TOKENS:
        pids = held_out_ids(tok, p)
        got = measure.run({name: (lambda e=e: e[1](e[2], pids)) for name, e in contenders.items()},
                          rounds=1 if quick else 3, warmup=0, machine=False, loops=1)
        prefill[p] = {name: t.median for name, t in got.items()}
    print(f"  prefill, time to first token (ms), median of {1 if quick else 3}:")
    print(f"  {'format':24s} " + " ".join(f"{f'{p} tokens':>11s} {'tok/s':>6s}" for p in PREFILL_TOKENS))
    for name in contenders:
        print(f"  {name:24s} " + " ".join(f"{1e3 * prefill[p][name]:11.0f} {p / prefill[p][name]:6.0f}" for p in PREFILL_TOKENS))
    return {"formats": rows, "roofline_gb_s": bw, "threads": torch.get_num_threads(), "tokens_per_round": n,
            "targets": targets, "prefill_ttft_s": {str(p): v for p, v in prefill.items()}, "products": per_product}
