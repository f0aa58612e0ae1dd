"""The KV cache under pressure: on-chip placement, spill to a slower level, swap vs recompute.

On-chip SRAM is tiny next to a KV cache: 8 MB of NPU scratchpad holds 73 tokens of
Llama-3.2-3B's fp16 KV. Past DRAM capacity the oldest KV spills to flash (phone) or host
memory (GPU) and is read back every step; or it is dropped and recomputed by a prefill.

    >>> from labkit.costmodel.workload import LLAMA_2_13B_LIKE
    >>> tokens_that_fit(LLAMA_2_13B_LIKE, 8.0)        # 8 MB of SRAM, fp16 KV of a 13B MHA model
    10
"""
from __future__ import annotations

import numpy as np

from labkit.power.energy import awake_power, phase_energy
from labkit.costmodel.profiles import hardware, precision_for
from labkit.costmodel.memlevels import onchip_fraction
from labkit.costmodel.roofline import phase_time
from labkit.costmodel.workload import ModelShape, bits_per_element, check_lengths, decode_work, kv_bytes_per_token, prefill_work

__all__ = ["tokens_that_fit", "max_context", "kv_sweep", "swap_vs_recompute"]


def tokens_that_fit(config, sram_mb: float, kv_bits=16, batch: int = 1) -> int:
    """How many tokens of KV cache fit in `sram_mb` MiB: SRAM / (kv bytes per token * batch)."""
    if not (isinstance(sram_mb, (int, float)) and sram_mb >= 0):
        raise ValueError(f"sram_mb must be a number >= 0, got {sram_mb!r}")
    return int(sram_mb * 2**20 // (kv_bytes_per_token(config, kv_bits) * batch))


def max_context(config, hw, batch: int = 1, weight_bits=16, kv_bits=16, tp: int = 1) -> int:
    """The longest context whose weights + KV still fit in DRAM (per device); 0 if the weights alone do not."""
    hw = hardware(hw)
    shape = ModelShape.of(config)
    w = shape.streamed_params * bits_per_element(weight_bits, 64, 16, 16) / 8 / tp
    kv = 2 * shape.n_layers * max(shape.n_kv_heads / tp, 1) * shape.head_dim * bits_per_element(kv_bits, 64, 16, 0) / 8
    return max(0, int((hw.mem_gb * 1e9 - w) // (kv * batch)))


def kv_sweep(config, hw, contexts, kv_sram_mb: float = 0.0, batch: int = 1, weight_bits=16, kv_bits=16, *, act_bits=16,
             tp: int = 1, core_mhz=None, mem_mhz=None, compute_eff=None, mem_eff=None) -> dict:
    """Time and energy of one decode step at each context, with `kv_sram_mb` of SRAM holding the newest KV.

    Returns contexts, seconds, joules (total and by component), the on-chip fraction s and the spilled bytes.
    """
    hw = hardware(hw)
    ctx = np.asarray(contexts)
    check_lengths(contexts=(ctx, 0))
    if not (isinstance(kv_sram_mb, (int, float)) and 0 <= kv_sram_mb <= hw.onchip_mb):
        raise ValueError(f"kv_sram_mb must be between 0 and {hw.key}'s on-chip {hw.onchip_mb:g} MB, got {kv_sram_mb!r}")
    bits = dict(weight_bits=weight_bits, kv_bits=kv_bits, act_bits=act_bits)
    work = decode_work(config, ctx, batch, tp=tp, **bits)
    pt = phase_time(work, hw, core_mhz=core_mhz, mem_mhz=mem_mhz, compute_eff=compute_eff, mem_eff=mem_eff,
                    sram_kv_bytes=kv_sram_mb * 2**20, tp=tp, **bits)
    en = phase_energy(hw, pt, precision_for(weight_bits, act_bits), core_mhz, mem_mhz, devices=tp)
    return {"contexts": ctx, "seconds": pt.time, "joules": en.joules, "parts": en.parts,
            "onchip_fraction": onchip_fraction(work.kv_read_bytes, kv_sram_mb * 2**20), "spill_bytes": pt.spill}


def swap_vs_recompute(config, hw, n_tokens, batch: int = 1, weight_bits=16, kv_bits=16, *, act_bits=16,
                      compute_eff=None, mem_eff=None) -> dict:
    """Bring back the KV of `n_tokens` evicted tokens: swap (write out + read back over the offload link)
    or recompute (a prefill of those tokens). Seconds and joules of each, per array entry.
    """
    hw = hardware(hw)
    n = np.asarray(n_tokens)
    check_lengths(n_tokens=(n, 1))
    kv = kv_bytes_per_token(config, kv_bits) * batch * n.astype(float)
    swap_s = 2 * kv / (hw.offload_bw_gbs * 1e9)
    swap_j = 2 * kv * 8 * (hw.e_bit("offload") + hw.e_bit("dram")) + awake_power(hw) * swap_s
    bits = dict(weight_bits=weight_bits, kv_bits=kv_bits, act_bits=act_bits)
    pt = phase_time(prefill_work(config, n, batch, **bits), hw, compute_eff=compute_eff, mem_eff=mem_eff, **bits)
    rec_j = phase_energy(hw, pt, precision_for(weight_bits, act_bits)).joules
    return {"n_tokens": n, "swap_s": swap_s, "swap_j": swap_j, "recompute_s": pt.time, "recompute_j": rec_j,
            "faster": np.where(swap_s <= pt.time, "swap", "recompute")}
