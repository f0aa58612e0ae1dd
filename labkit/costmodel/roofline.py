"""Roofline time of a phase: each part takes max(compute time, memory time), then the parts add up.

    time = max(block linear FLOPs / F, block weight + activation bytes / BW)
         + max(LM head FLOPs / F, LM head bytes / BW)
         + max(attention FLOPs / F, KV bytes / BW)
         + tensor-parallel all-reduces
with F = peak(precision) * compute_eff * f/fmax (the core clock; for the linear part, a profile with a
measured `compute_eff_rows` table takes the efficiency at the product's rows, tokens per weight read) and
BW = DRAM bandwidth * mem_eff * f_mem/fmax_mem (the memory clock): two clock domains, each
moving only its own roof. Splitting linear from attention keeps the per-operator roofline of
LLM-Viewer: at a large batch the linear layers turn compute-bound while attention, which
reads a KV cache per sequence, stays memory-bound. The LM head is its own part because a prefill
runs it on the last position only: one row that reads the head's bytes while the blocks' products
have a row per prompt token.

All-reduce (ring, tp devices): max(2 (tp-1)/tp * bytes / link bandwidth, link latency), twice per
layer, not overlapped with compute (llm-analysis's rule: its `intra_node_min_message_latency` is a floor
per all-reduce, which small decode messages hit; NCCL switches to low-latency algorithms for them rather
than paying 2 (tp-1) ring hops of latency each).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labkit.costmodel.profiles import precision_for
from labkit.costmodel.memlevels import memory_time, split_bytes

__all__ = ["PhaseTime", "phase_time", "clock_scales", "allreduce_time"]


@dataclass
class PhaseTime:
    """Times in seconds and bytes per level of one phase (arrays broadcast over the lengths asked for)."""

    time: np.ndarray
    t_compute: np.ndarray   # sum over parts of the compute time
    t_memory: np.ndarray    # sum over parts of the memory time
    t_comm: np.ndarray
    flops: np.ndarray
    level_bytes: dict       # {"onchip", "dram", "offload"} -> bytes
    spill: np.ndarray       # bytes that did not fit in DRAM
    parts: dict = None      # {"linear", "attention"} -> (compute time, memory time): the roofline takes each part's max

    @property
    def bound(self):
        """'compute' where compute time exceeds memory time, else 'memory' (array or str)."""
        out = np.where(self.t_compute >= self.t_memory, "compute", "memory")
        return str(out) if out.ndim == 0 else out


def clock_scales(hw, core_mhz=None, mem_mhz=None) -> tuple:
    """(f/fmax, f_mem/fmax_mem), validated against the hardware's tables."""
    f = 1.0 if core_mhz is None else np.asarray(hw.vf.check_freq(core_mhz, "core_mhz")) / hw.vf.fmax
    if mem_mhz is None:
        m = 1.0
    else:
        m_arr = np.asarray(mem_mhz, dtype=float)
        if not np.all(np.isfinite(m_arr)) or np.any(m_arr <= 0) or np.any(m_arr > hw.fmax_mem * (1 + 1e-9)):
            raise ValueError(f"mem_mhz must be in (0, {hw.fmax_mem:g}] MHz for {hw.key}, got {mem_mhz!r}")
        m = m_arr / hw.fmax_mem
    return f, m


def allreduce_time(n, message_bytes, tp: int, link_gb_s: float, latency_us: float):
    """Seconds for `n` ring all-reduces of `message_bytes` each over `tp` GPUs: a ring sends 2 (tp - 1) / tp of the
    message over each GPU's link (reduce-scatter, then all-gather), and none takes less than the link's latency."""
    ring = 2 * (tp - 1) / tp
    return n * np.maximum(ring * message_bytes / (link_gb_s * 1e9), latency_us * 1e-6)


def phase_time(work, hw, *, weight_bits=16, kv_bits=16, act_bits=16, compute_eff=None, mem_eff=None,
               core_mhz=None, mem_mhz=None, sram_kv_bytes: float = 0.0, tp: int = 1) -> PhaseTime:
    """Roofline time of `work` (a `labkit.costmodel.workload.Work`) on `hw` at one operating point."""
    ce = hw.compute_eff if compute_eff is None else compute_eff
    me = hw.mem_eff if mem_eff is None else mem_eff
    f_scale, m_scale = clock_scales(hw, core_mhz, mem_mhz)
    peak_lin = hw.peak_flops(precision_for(weight_bits, act_bits)) * f_scale
    eff = hw.compute_eff_at if compute_eff is None else (lambda rows: compute_eff)  # a measured table, if any
    f_att = hw.peak_flops(precision_for(kv_bits, act_bits)) * ce * f_scale
    parts = split_bytes(work.weight_bytes, work.act_bytes, work.kv_read_bytes, work.kv_write_bytes,
                        work.kv_resident_bytes, hw.mem_gb * 1e9, sram_kv_bytes)
    tc_body = (work.linear_flops - work.head_flops) / (peak_lin * eff(work.rows))
    tc_head = work.head_flops / (peak_lin * eff(work.head_rows))
    tc_lin, tc_att = tc_body + tc_head, work.attn_flops / f_att
    tm_lin = memory_time(parts["linear"], hw, me, m_scale)
    tm_head = tm_lin * work.head_bytes / (work.weight_bytes + work.act_bytes)  # its share of the linear bytes
    tm_att = memory_time(parts["attention"], hw, me, m_scale)
    if work.n_allreduce:
        t_comm = allreduce_time(work.n_allreduce, work.comm_bytes, tp, hw.link_bw_gbs, hw.link_latency_us)
    else:
        t_comm = 0 * np.asarray(work.comm_bytes, dtype=float)
    time = (np.maximum(tc_body, tm_lin - tm_head) + np.maximum(tc_head, tm_head)
            + np.maximum(tc_att, tm_att) + t_comm)
    levels = {k: parts["linear"][k] + parts["attention"][k] for k in ("onchip", "dram", "offload")}
    return PhaseTime(time=time, t_compute=tc_lin + tc_att, t_memory=tm_lin + tm_att, t_comm=t_comm,
                     flops=work.flops, level_bytes=levels, spill=parts["spill"],
                     parts={"linear": (tc_lin, tm_lin), "attention": (tc_att, tm_att)})
