"""The serving half of the cost model: batch, parallel layout and price, from the same roofline as `estimate`.

Three questions a serving team asks, answered without running a model:

1. At what decode batch does a step stop being limited by memory? (`critical_batch`)
2. How many tokens per second does a batch give? (`decode_throughput`)
3. Eight GPUs: one tensor-parallel group of 8, or two groups of 4 each serving half the requests?
   (`parallel_plan`, `compare_plans`), and what does a million tokens cost? (`cost_per_million_tokens`)

Llama-3-70B in 16-bit on eight H100s, 64 requests of 1024 prompt tokens and 256 reply tokens:

    >>> def show(plans):
    ...     for p in plans:
    ...         print(f"{p['plan']:8s} ITL {p['itl_s'] * 1e3:4.1f} ms | TTFT {p['ttft_s']:.2f} s | "
    ...               f"{p['tokens_per_s']:,.0f} tok/s | {p['mem_per_gpu_gb']:.1f} GB/GPU | "
    ...               f"all-reduce {p['allreduce_s'] * 1e3:4.1f} ms/step")
    >>> show(compare_plans(LLAMA3_70B, "h100-sxm", [(8, 1), (4, 2)], batch=64, prompt_len=1024, reply_len=256))
    TP8      ITL 11.7 ms | TTFT 2.96 s | 5,489 tok/s | 21.0 GB/GPU | all-reduce  1.3 ms/step
    TP4xDP2  ITL 20.2 ms | TTFT 2.58 s | 3,165 tok/s | 38.6 GB/GPU | all-reduce  1.3 ms/step
    >>> show(compare_plans(LLAMA3_70B, "h100-sxm", [(8, 1), (4, 2)], batch=512, prompt_len=1024, reply_len=256))
    TP8      ITL 35.2 ms | TTFT 23.67 s | 14,533 tok/s | 44.5 GB/GPU | all-reduce  5.2 ms/step
    TP4xDP2  ITL 32.7 ms | TTFT 20.61 s | 15,636 tok/s | 62.1 GB/GPU | all-reduce  2.2 ms/step

At batch 64 decode is memory-bound: each TP8 GPU reads half the weight bytes per step, so TP8 gives
the shorter inter-token latency (and, for the same 64 requests, more tokens per second). At batch
512 the linear layers of both plans are compute-bound, each GPU does 1/8 of the FLOPs either way,
and only the all-reduces differ: TP8 all-reduces twice the rows, so TP4xDP2 delivers more tokens per
second. TP8 buys latency at a moderate batch; TP4xDP2 buys throughput once the batch is large (while
its doubled weights per GPU leave room for the KV cache: at batch 1024 they no longer do).
"""
from __future__ import annotations

import math

import numpy as np

from labkit import checks
from labkit.costmodel.estimator import check_settings, estimate
from labkit.costmodel.profiles import hardware
from labkit.costmodel.roofline import phase_time
from labkit.costmodel.workload import ModelShape, bits_per_element, check_lengths, decode_work
from labkit.model.config import ModelConfig

__all__ = ["critical_batch", "decode_throughput", "pass_time", "parallel_plan", "compare_plans", "cost_per_million_tokens",
           "LLAMA3_70B"]

# Meta-Llama-3-70B, from the config.json on its model card (meta-llama/Meta-Llama-3-70B):
# hidden_size 8192, num_hidden_layers 80, num_attention_heads 64, num_key_value_heads 8 (GQA, head_dim 128),
# intermediate_size 28672, vocab_size 128256, rope_theta 500000, max_position_embeddings 8192, untied embeddings.
LLAMA3_70B = ModelConfig(name="llama-3-70b", vocab_size=128256, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8,
                         head_dim=128, ffn_dim=28672, rope_base=500000.0, max_seq_len=8192, tie_embeddings=False)

# the settings of `estimate` that keep a decode step's times affine in the batch (kv_sram_mb does not)
_STEP_SETTINGS = ("act_bits", "tp", "weight_group", "kv_group", "compute_eff", "mem_eff", "core_mhz", "mem_mhz")


def _step(shape, hw, context, batch, weight_bits, kv_bits, settings):
    """(compute time, memory time, bytes spilled) of one decode step of `batch` sequences, per device."""
    s = {"act_bits": 16, "tp": 1, "weight_group": 64, "kv_group": 64, **settings}
    work = decode_work(shape, context, batch, weight_bits, kv_bits, s["act_bits"], s["tp"], s["weight_group"], s["kv_group"])
    pt = phase_time(work, hw, weight_bits=weight_bits, kv_bits=kv_bits, act_bits=s["act_bits"], tp=s["tp"],
                    compute_eff=s.get("compute_eff"), mem_eff=s.get("mem_eff"),
                    core_mhz=s.get("core_mhz"), mem_mhz=s.get("mem_mhz"))
    return float(pt.t_compute), float(pt.t_memory), float(pt.spill)


def critical_batch(config, hw, context: int, weight_bits: float = 16, kv_bits: float = 16, **eff) -> float:
    """The decode batch at which a step turns compute-bound (`estimate(...).bound['decode']` flips).

    A decode step of B sequences at `context` cached tokens, on one device (tensor parallelism splits both sides):
        compute  t_c(B) = B * f / F,        f = 2 N (linear layers) + 4 n_layers n_heads head_dim (context + 1)
        memory   t_m(B) = (W + B * m) / BW, m = KV read + written + activations, bytes per sequence
    The weights W are read once for the whole batch; each sequence brings its own FLOPs f and bytes m.
    Setting t_c = t_m:
        B* = (W / BW) / (f / F - m / BW),   and infinity when f / F <= m / BW
    (each extra sequence adds as much memory time as compute time: the step never turns compute-bound).
    Without KV (m = 0) this is the ridge in tokens, `ridge_tokens`; the batch's own KV pushes it up, and at a long
    context with full multi-head attention it can push it to infinity. F and BW are the achieved rates
    (efficiencies, clocks) and f, m, W the counts of `labkit.costmodel.workload.decode_work`, read off the
    roofline at batches 0 and 1, so the result agrees with `estimate`. If the batch at B* no longer fits in
    DRAM (KV spills to the offload level), the crossing is searched on the roofline itself instead.

    This is the one-roof view (the whole step's FLOPs against its bytes), the one `bound` reports. The
    roofline `estimate` uses is per operator, and attention, reading a cache per sequence, never leaves its
    memory roof; so tokens/s stop growing earlier, where the linear layers alone turn compute-bound (near
    `ridge_tokens`, whatever the context), and are already flat at B* (see `decode_throughput`).

    eff: estimate's act_bits, tp, weight_group, kv_group, compute_eff, mem_eff, core_mhz, mem_mhz.

        >>> round(critical_batch("llama-2-7b", "h100-sxm", context=32, compute_eff=1, mem_eff=1), 1)
        554.5
        >>> critical_batch("llama-2-7b", "h100-sxm", context=2048)     # 1 MiB of KV per token: never
        inf
    """
    hw = hardware(hw)
    check_lengths(context=(context, 1))
    unknown = sorted(set(eff) - set(_STEP_SETTINGS))
    if unknown:
        raise ValueError(f"critical_batch got the setting {unknown[0]!r}; allowed settings: {', '.join(_STEP_SETTINGS)}")
    check_settings(hw, weight_bits=weight_bits, kv_bits=kv_bits,
                   **{k: v for k, v in eff.items() if k in ("act_bits", "tp", "compute_eff", "mem_eff")})
    shape = ModelShape.of(config)
    c0, m0, _ = _step(shape, hw, context, 0, weight_bits, kv_bits, eff)   # batch 0: the weights alone
    c1, m1, _ = _step(shape, hw, context, 1, weight_bits, kv_bits, eff)
    per_seq = (c1 - c0) - (m1 - m0)        # compute time minus memory time that one more sequence adds
    b_star = m0 / per_seq if per_seq > 0 else math.inf
    if math.isfinite(b_star) and _step(shape, hw, context, b_star, weight_bits, kv_bits, eff)[2] == 0:
        return b_star

    def compute_bound(b):
        t_c, t_m, _ = _step(shape, hw, context, b, weight_bits, kv_bits, eff)
        return t_c >= t_m

    hi = 1.0                               # spill: double until compute-bound, then bisect
    while not compute_bound(hi):
        hi *= 2
        if hi > 2.0**40:
            return math.inf
    lo = 0.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if compute_bound(mid) else (mid, hi)
    return hi


def _check_batches(batches) -> list[int]:
    try:
        values = list(batches)
    except TypeError:
        raise ValueError(f"batches must be a non-empty list of integers >= 1, got {batches!r}") from None
    if not values:
        raise ValueError(f"batches must be a non-empty list of integers >= 1, got {batches!r}")
    check_lengths(batches=(values, 1))
    return [int(b) for b in values]


def decode_throughput(config, hw, batches, context: int, **settings) -> list[dict]:
    """Modelled decode speed per batch size: one step at `context` cached tokens, from `estimate`.

    Each row: batch, step_s (seconds per step = the inter-token latency of every sequence in the batch),
    tokens_per_s (batch / step_s: the server's output rate), bound ('memory' or 'compute'), mbu and mfu.
    While the linear layers are memory-bound (batch below about `ridge_tokens`) the step time barely grows:
    the batch shares one read of the weights, and tokens/s rise almost in proportion to the batch. Past that
    knee each sequence adds its own time, 2 N / F for its FLOPs plus its KV bytes / BW (attention stays
    memory-bound), and tokens/s flatten at 1 / (2 N / F + KV bytes / BW). The step's `bound` label flips
    later, at `critical_batch`, once the summed compute time overtakes the summed memory time.
    settings: estimate's weight_bits, kv_bits, tp, act_bits, compute_eff, mem_eff, ...

        >>> [round(r["tokens_per_s"]) for r in decode_throughput("llama-2-7b", "h100-sxm", [1, 8, 64], context=512)]
        [149, 1044, 4195]
    """
    batches = _check_batches(batches)
    check_lengths(context=(context, 1))
    rows = []
    for b in batches:
        est = estimate(config, hw, prompt_len=context, reply_len=2, batch=b, **settings)
        step = float(est.decode_step_s[0])
        rows.append({"batch": b, "step_s": step, "tokens_per_s": b / step, "bound": est.bound["decode"],
                     "mbu": est.mbu_decode, "mfu": est.mfu_decode})
    return rows


def pass_time(config, hw, n_tokens: int, cached_tokens: int = 0, **settings) -> float:
    """Modelled seconds of one serving pass over `n_tokens` new tokens that also reads `cached_tokens` of KV.

    A scheduler's pass packs decode tokens and prompt chunks of many requests: the linear layers see
    `n_tokens` tokens (one weight read, 2 FLOPs per weight per token: the roofline of a prefill of that
    many tokens), and attention reads every cached key and value its rows attend over. So: the prefill
    time of `n_tokens` + cached_tokens x KV bytes per token / bandwidth. An approximation (each prompt
    chunk's attention to itself is charged as if it were one prompt), close where the linear layers
    dominate, which they do at the lengths a serving trace has.
    """
    checks.positive_int("n_tokens", n_tokens)
    if not (isinstance(cached_tokens, int) and cached_tokens >= 0):
        raise ValueError(f"cached_tokens must be an integer >= 0, got {cached_tokens!r}")
    hw = hardware(hw)
    est = estimate(config, hw, prompt_len=n_tokens, reply_len=1, **settings)
    mem_eff = settings.get("mem_eff") or hw.mem_eff
    return est.prefill_s + cached_tokens * est.kv_bytes_per_token / (hw.mem_bw_gbs * 1e9 * mem_eff)


def parallel_plan(config, hw, n_gpus: int = 8, tp: int = 8, batch: int = 64, prompt_len: int = 1024,
                  reply_len: int = 256, weight_bits: float = 16, **settings) -> dict:
    """One layout of `n_gpus` GPUs: dp = n_gpus / tp replicas, each a tensor-parallel group of `tp` GPUs.

    Requests are split across the replicas (batch / dp each); every replica holds a full copy of the weights,
    split over its tp GPUs, and pays two all-reduces per layer per step over the GPU link.
    Returns a dict (times in seconds, memory in GB = 1e9 bytes, per GPU unless said otherwise):
        plan ("TP8", "TP4xDP2"), tp, dp, n_gpus, batch, replica_batch,
        itl_s (per-token latency of every request), ttft_s (prefill of the replica's batch),
        tokens_per_s (whole system: dp * replica_batch / itl_s), tokens_per_s_per_gpu,
        weight_gb_per_gpu (all weights / tp), kv_gb_per_gpu (the replica's KV at the end of the reply, split over
        its KV heads: tp GPUs, or one head each when tp > n_kv_heads), mem_per_gpu_gb (their sum), fits
        (mem_per_gpu_gb <= the profile's mem_gb), allreduce_s (all-reduce time per decode step, from the
        estimate's breakdown), allreduce_share (its share of itl_s), bound (the decode step's, comparing the summed
        compute and memory times: a label for the whole step), decode_parts ({"linear", "attention"} -> (compute s,
        memory s) of the mean decode step: the roofline bounds each part on its own).
    settings: estimate's kv_bits, act_bits, compute_eff, mem_eff, ...
    """
    hw = hardware(hw)
    checks.positive_int("n_gpus", n_gpus)
    checks.positive_int("tp", tp)
    checks.positive_int("batch", batch)
    if n_gpus % tp:
        raise ValueError(f"tp must divide n_gpus = {n_gpus} (tp x dp = n_gpus), got tp = {tp}")
    dp = n_gpus // tp
    if batch % dp:
        raise ValueError(f"batch must be a multiple of dp = n_gpus / tp = {dp} (requests split evenly), got {batch}")
    if "tp" in settings or "batch" in settings:
        raise ValueError("tp and batch are arguments of parallel_plan, not settings")
    shape = ModelShape.of(config)
    if shape.n_heads % tp:
        raise ValueError(f"tensor parallelism gives each GPU whole attention heads: tp must divide n_heads = "
                         f"{shape.n_heads}, got tp = {tp}")
    if tp < shape.n_kv_heads and shape.n_kv_heads % tp:
        raise ValueError(f"tp must divide n_kv_heads = {shape.n_kv_heads} (or exceed it, each GPU then holding a "
                         f"copy of one KV head), got tp = {tp}")
    replica_batch = batch // dp
    est = estimate(config, hw, prompt_len, reply_len, batch=replica_batch, weight_bits=weight_bits, tp=tp, **settings)
    # resident weights, the input embedding included (est.weight_bytes counts only the streamed ones)
    weight_gb = shape.n_params * bits_per_element(weight_bits, settings.get("weight_group", 64), 16, 16) / 8 / tp / 1e9
    kv_gb = est.kv_bytes * max(shape.n_kv_heads / tp, 1) / shape.n_kv_heads / 1e9
    allreduce_s = float(est.decode.t_comm.mean()) if reply_len > 1 else 0.0
    tokens_per_s = dp * replica_batch / est.itl_s
    return {
        "plan": f"TP{tp}" if dp == 1 else f"TP{tp}xDP{dp}", "tp": tp, "dp": dp, "n_gpus": n_gpus,
        "batch": batch, "replica_batch": replica_batch,
        "itl_s": est.itl_s, "ttft_s": est.ttft_s,
        "tokens_per_s": tokens_per_s, "tokens_per_s_per_gpu": tokens_per_s / n_gpus,
        "weight_gb_per_gpu": weight_gb, "kv_gb_per_gpu": kv_gb, "mem_per_gpu_gb": weight_gb + kv_gb,
        "fits": weight_gb + kv_gb <= hw.mem_gb,
        "allreduce_s": allreduce_s, "allreduce_share": allreduce_s / est.itl_s, "bound": est.bound["decode"],
        # the mean decode step's parts, each (compute s, memory s): the roofline takes each part's larger one
        "decode_parts": {k: (float(np.mean(c)), float(np.mean(m))) for k, (c, m) in est.decode.parts.items()},
    }


def compare_plans(config, hw, plans=((8, 1), (4, 2)), batch: int = 64, prompt_len: int = 1024, reply_len: int = 256,
                  weight_bits: float = 16, **settings) -> list[dict]:
    """`parallel_plan` for each (tp, dp) in `plans` (n_gpus = tp * dp), the same total batch for all.

    At one total batch the whole system's tokens/s is batch / ITL for every plan, so the plan with the
    shorter step also has the higher throughput; the two part ways across batches (see the module's example).
    """
    try:
        pairs = [tuple(p) for p in plans]
    except TypeError:
        raise ValueError(f"plans must be a non-empty list of (tp, dp) pairs, got {plans!r}") from None
    if not pairs or any(len(p) != 2 for p in pairs):
        raise ValueError(f"plans must be a non-empty list of (tp, dp) pairs, got {plans!r}")
    rows = []
    for tp, dp in pairs:
        checks.positive_int("tp", tp)
        checks.positive_int("dp", dp)
        rows.append(parallel_plan(config, hw, n_gpus=tp * dp, tp=tp, batch=batch, prompt_len=prompt_len,
                                  reply_len=reply_len, weight_bits=weight_bits, **settings))
    return rows


def cost_per_million_tokens(tokens_per_s: float, price_per_hour: float) -> float:
    """Dollars per million tokens: price_per_hour / (tokens_per_s * 3600) * 1e6.

    price_per_hour is for whatever produces tokens_per_s (all eight GPUs of a plan, not one).

        >>> cost_per_million_tokens(1000, 3.6)        # 3.6 M tokens an hour for $3.60
        1.0
    """
    checks.positive("tokens_per_s", tokens_per_s)
    checks.number("price_per_hour", price_per_hour, 0, why="dollars per hour")
    return price_per_hour / (tokens_per_s * 3600) * 1e6
