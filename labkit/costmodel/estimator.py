"""What a request costs: prefill and decode time from a roofline, per phase, on any hardware profile.

    >>> from types import SimpleNamespace
    >>> llama13b = SimpleNamespace(n_layers=40, d_model=5120, n_heads=40, n_kv_heads=40, head_dim=128,
    ...                            d_ff=13824, vocab_size=32000, tie_embeddings=False)
    >>> est = estimate(llama13b, "a100-sxm", prompt_len=512, reply_len=32, compute_eff=0.7, mem_eff=0.9)
    >>> round(est.prefill_s * 1e3), round(est.decode_s_per_token * 1e3, 1), est.bound
    (60, 14.2, {'prefill': 'compute', 'decode': 'memory'})

The first token comes out of the prefill; each of the other reply_len - 1 tokens is one
decode step at a context one longer than the last. Formulas: `labkit.costmodel.workload` (work),
`labkit.costmodel.roofline` (time), `labkit.costmodel.memlevels` (which memory the bytes come from).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from labkit import checks
from labkit.costmodel.profiles import HARDWARE, Hardware, hardware, precision_for
from labkit.costmodel.roofline import PhaseTime, phase_time
from labkit.costmodel.workload import ModelShape, bits_per_element, check_lengths, decode_work, kv_bytes_per_token, prefill_work

__all__ = ["estimate", "Estimate", "hardware", "HARDWARE", "Hardware", "ridge_tokens", "kv_bytes_per_token",
           "check_settings", "diagnose"]


def check_settings(hw: Hardware, *, batch=1, weight_bits=16, kv_bits=16, act_bits=16, tp=1,
                   compute_eff=None, mem_eff=None, kv_sram_mb=0.0) -> None:
    """Raise a ValueError naming the first setting outside what the model allows."""
    check_lengths(batch=(batch, 1), tp=(tp, 1))
    for name, bits in (("weight_bits", weight_bits), ("kv_bits", kv_bits), ("act_bits", act_bits)):
        checks.number(name, bits, 1, 32, why="bits per value")
    for name, eff in (("compute_eff", compute_eff), ("mem_eff", mem_eff)):
        if eff is not None and not (isinstance(eff, (int, float)) and 0 < eff <= 1):
            raise ValueError(f"{name} must be in (0, 1], got {eff!r}")
    if not (isinstance(kv_sram_mb, (int, float)) and 0 <= kv_sram_mb <= hw.onchip_mb):
        raise ValueError(f"kv_sram_mb must be between 0 and {hw.key}'s on-chip {hw.onchip_mb:g} MB, got {kv_sram_mb!r}")
    if tp > 1 and hw.link_bw_gbs <= 0:
        raise ValueError(f"tp must be 1 on {hw.key} (it has no chip-to-chip link), got {tp}")


@dataclass
class Estimate:
    """Times in seconds, sizes in bytes, FLOPs per device. `decode_step_s[i]` is step i (context prompt_len + i)."""

    prompt_len: int
    reply_len: int
    batch: int
    prefill_s: float
    decode_s_per_token: float
    ttft_s: float
    total_s: float
    decode_step_s: np.ndarray
    prefill_flops: float
    prefill_bytes: float
    decode_flops: float          # per step, mean over the reply
    decode_bytes: float          # per step, mean over the reply
    kv_bytes: float              # KV cache at the end of the reply, all devices
    kv_bytes_per_token: float
    weight_bytes: float          # all devices
    bound: dict
    mfu_prefill: float
    mfu_decode: float
    mbu_decode: float
    ridge_tokens: float
    spill_bytes: float           # most bytes that did not fit in DRAM (per device), 0 if all fit
    prefill: PhaseTime = field(repr=False)
    decode: PhaseTime = field(repr=False)

    @property
    def itl_s(self) -> float:
        return self.decode_s_per_token

    @property
    def prefill_share(self) -> float:
        """Share of the request's time spent in prefill."""
        return self.prefill_s / self.total_s

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: batch / inter-token latency."""
        return self.batch / self.decode_s_per_token

    def summary(self) -> str:
        return (f"TTFT {self.ttft_s * 1e3:,.1f} ms | ITL {self.itl_s * 1e3:,.2f} ms | total {self.total_s:,.3f} s | "
                f"prefill {self.prefill_share:.0%} of the time | prefill {self.bound['prefill']}-bound, "
                f"decode {self.bound['decode']}-bound | MFU prefill {self.mfu_prefill:.0%}, decode {self.mfu_decode:.2%} | "
                f"MBU decode {self.mbu_decode:.0%}")


def ridge_tokens(hw, weight_bits=16, act_bits=16, compute_eff=None, mem_eff=None, weight_group=64) -> float:
    """Tokens per weight read at which a linear layer turns compute-bound: F * bytes_per_weight / (2 BW).

    Below it (decode at a small batch) the weights' bytes set the time; above it (a long prefill) the FLOPs do.
    A100 in fp16: 312e12 * 2 / (2 * 2039e9) = 153 tokens (at equal efficiencies).
    """
    hw = hardware(hw)
    bpw = bits_per_element(weight_bits, weight_group, 16, 16) / 8
    return hw.ridge_intensity(precision_for(weight_bits, act_bits), compute_eff, mem_eff) * bpw / 2


def estimate(config, hw, prompt_len: int, reply_len: int, batch: int = 1, weight_bits: float = 16,
             kv_bits: float = 16, tp: int = 1, *, act_bits: float = 16, weight_group: int = 64, kv_group: int = 64,
             compute_eff: float | None = None, mem_eff: float | None = None, core_mhz=None, mem_mhz=None,
             kv_sram_mb: float = 0.0) -> Estimate:
    """Roofline estimate of one request: TTFT, inter-token latency, total time, FLOPs and bytes per phase.

    config: a model config (n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab_size) or a preset name.
    hw: a profile name (see `HARDWARE`) or a `Hardware`. weight_bits/kv_bits: storage bits (group scales are
    added: `labkit.costmodel.workload.bits_per_element`); act_bits picks the arithmetic (fp16 unless both are <= 8 bits).
    compute_eff/mem_eff: achieved fractions of peak (default: the profile's). core_mhz/mem_mhz: clocks
    (default: the top). kv_sram_mb: on-chip SRAM given to the most recent KV entries.
    """
    hw = hardware(hw)
    check_lengths(prompt_len=(prompt_len, 1), reply_len=(reply_len, 1))
    check_settings(hw, batch=batch, weight_bits=weight_bits, kv_bits=kv_bits, act_bits=act_bits, tp=tp,
                   compute_eff=compute_eff, mem_eff=mem_eff, kv_sram_mb=kv_sram_mb)
    shape = ModelShape.of(config)
    prompt_len, reply_len, batch, tp = int(prompt_len), int(reply_len), int(batch), int(tp)
    bits = dict(weight_bits=weight_bits, kv_bits=kv_bits, act_bits=act_bits)
    common = dict(tp=tp, weight_group=weight_group, kv_group=kv_group, **bits)
    timing = dict(compute_eff=compute_eff, mem_eff=mem_eff, core_mhz=core_mhz, mem_mhz=mem_mhz,
                  sram_kv_bytes=kv_sram_mb * 2**20, tp=tp, **bits)

    pw = prefill_work(shape, prompt_len, batch, **common)
    pre = phase_time(pw, hw, **timing)
    n_steps = max(reply_len - 1, 1)  # a 1-token reply has no decode step; report the step it would take
    contexts = prompt_len + np.arange(n_steps)
    dw = decode_work(shape, contexts, batch, **common)
    dec = phase_time(dw, hw, **timing)

    steps = dec.time if reply_len > 1 else dec.time[:0]
    prefill_s = float(pre.time)
    total_s = prefill_s + float(steps.sum())
    me = hw.mem_eff if mem_eff is None else mem_eff
    precision = precision_for(weight_bits, act_bits)
    kv_tok = kv_bytes_per_token(shape, kv_bits, kv_group)
    dec_bytes = sum(dec.level_bytes.values())
    return Estimate(
        prompt_len=prompt_len, reply_len=reply_len, batch=batch,
        prefill_s=prefill_s, decode_s_per_token=float(dec.time.mean()), ttft_s=prefill_s, total_s=total_s,
        decode_step_s=steps,
        prefill_flops=float(pre.flops), prefill_bytes=float(sum(pre.level_bytes.values())),
        decode_flops=float(np.mean(dec.flops)), decode_bytes=float(np.mean(dec_bytes)),
        kv_bytes=kv_tok * batch * (prompt_len + reply_len), kv_bytes_per_token=kv_tok,
        weight_bytes=pw.weight_bytes * tp,
        bound={"prefill": str(pre.bound), "decode": _majority(dec.bound)},
        mfu_prefill=float(pre.flops / (pre.time * hw.peak_flops(precision))),
        mfu_decode=float(np.mean(dec.flops / (dec.time * hw.peak_flops(precision)))),
        mbu_decode=float(np.mean(dec.level_bytes["dram"] / (dec.time * hw.mem_bw_gbs * 1e9))),
        ridge_tokens=ridge_tokens(hw, weight_bits, act_bits, compute_eff, me, weight_group),
        spill_bytes=float(max(np.max(pre.spill), np.max(dec.spill))),
        prefill=pre, decode=dec,
    )


def _majority(bounds) -> str:
    arr = np.atleast_1d(bounds)
    return "compute" if np.mean(arr == "compute") > 0.5 else "memory"


def diagnose(est: Estimate, ttft_slo_s: float = 1.0, itl_slo_s: float = 0.05) -> list[str]:
    """The diagnosis flow of the source articles, applied to an estimate: which phase hurts, and why.

    1. Is the first token slow (TTFT) or the stream (ITL)?  2. Which roof limits that phase?
    3. Name the metric: low compute use in decode is bandwidth, not missing compute.
    """
    lines = []
    slow_first = est.ttft_s > ttft_slo_s
    slow_stream = est.itl_s > itl_slo_s
    if slow_first:
        lines.append(f"TTFT {est.ttft_s:.3f} s > {ttft_slo_s} s: the prompt is long or compute is scarce; "
                     f"prefill is {est.bound['prefill']}-bound -> shorten the prompt, batch prompts, faster matmuls.")
    if slow_stream:
        lines.append(f"ITL {est.itl_s * 1e3:.1f} ms > {itl_slo_s * 1e3:.0f} ms: decode is {est.bound['decode']}-bound "
                     f"(MBU {est.mbu_decode:.0%}) -> fewer bytes per token: quantize weights/KV, GQA, more bandwidth.")
    if not (slow_first or slow_stream):
        lines.append("both TTFT and ITL meet their targets.")
    lines.append(f"decode compute utilisation (MFU) is {est.mfu_decode:.2%} while bandwidth utilisation (MBU) is "
                 f"{est.mbu_decode:.0%}: the idle ALUs wait for memory; more compute would not help.")
    if est.spill_bytes > 0:
        lines.append(f"{est.spill_bytes / 1e9:.2f} GB do not fit in DRAM and are read from the offload level every step.")
    lines.append(f"prefill is {est.prefill_share:.0%} of the request's time at prompt {est.prompt_len} / reply {est.reply_len}.")
    return lines


def sweep_estimates(config, hw, prompt_lens, positions, bits: float = 32, **settings) -> tuple[list[dict], list[dict]]:
    """The roofline's TTFT for each prompt length and its decode step at each position, as rows shaped like
    `labkit.generation.latency.ttft_sweep` / `itl_sweep` ({prompt_len, ttft_s} and {position, itl_s})."""
    kw = dict(weight_bits=bits, kv_bits=bits, act_bits=bits, **settings)
    ttft = [{"prompt_len": int(p), "ttft_s": float(estimate(config, hw, int(p), 1, **kw).prefill_s)} for p in prompt_lens]
    itl = [{"position": int(q), "itl_s": float(estimate(config, hw, int(q), 2, **kw).decode_step_s[0])} for q in positions]
    return ttft, itl
