"""Where the bytes of a phase come from: on-chip SRAM, DRAM (HBM/LPDDR), or an offload level.

Placement rules (per device):
  - weights live in DRAM; what does not fit in DRAM is streamed from the offload level
    (flash on a phone, host memory over PCIe on a GPU);
  - the KV cache keeps its most recent tokens in the on-chip SRAM given to it
    (`sram_kv_bytes`, a sliding "recent window"), the rest in DRAM; when DRAM is full the
    oldest KV spills to the offload level first, then weights;
  - the fraction of the cache on chip is s = min(1, SRAM / KV bytes) (research note §2.6).
Time per level: on-chip and DRAM reads are serial; offload reads overlap them
(GenZ's offload formula: time = max(t_onchip + t_dram, t_offload)).

    >>> b = split_bytes(weight_bytes=4e9, act_bytes=0, kv_read=1e9, kv_write=0, kv_resident=1e9,
    ...                 dram_capacity=4.5e9, sram_kv_bytes=0)
    >>> float(b["linear"]["dram"]), float(b["attention"]["offload"])   # 0.5 GB of KV spilled to offload
    (4000000000.0, 500000000.0)
"""
from __future__ import annotations

import numpy as np

__all__ = ["split_bytes", "memory_time", "onchip_fraction"]


def onchip_fraction(kv_bytes, sram_bytes: float):
    """s = min(1, SRAM / KV): the share of the KV cache that fits on chip."""
    kv = np.asarray(kv_bytes, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(kv > 0, np.minimum(1.0, sram_bytes / np.where(kv > 0, kv, 1.0)), 1.0)
    return s if s.ndim else float(s)


def split_bytes(weight_bytes, act_bytes, kv_read, kv_write, kv_resident, dram_capacity: float, sram_kv_bytes: float = 0.0) -> dict:
    """Bytes per level for the linear group (weights + activations) and the attention group (KV).

    Returns {"linear": {"onchip", "dram", "offload"}, "attention": {...}, "spill": bytes over DRAM capacity}.
    """
    kv_res = np.asarray(kv_resident, dtype=float)
    kv_read = np.asarray(kv_read, dtype=float) + 0 * kv_res
    kv_write = np.asarray(kv_write, dtype=float) + 0 * kv_res
    act = np.asarray(act_bytes, dtype=float) + 0 * kv_res
    w = float(weight_bytes)
    on_res = np.minimum(float(sram_kv_bytes), kv_res)
    overflow = np.maximum(0.0, w + kv_res - on_res - float(dram_capacity))
    off_kv = np.minimum(overflow, kv_res - on_res)
    off_w = np.minimum(overflow - off_kv, w)
    # reads: the recent window from SRAM, the oldest tokens from offload, the rest from DRAM
    rd_on = np.minimum(on_res, kv_read)
    rd_off = np.minimum(kv_read - rd_on, off_kv)
    rd_dram = kv_read - rd_on - rd_off
    # writes land where the resident cache is (an eviction cascade moves one entry per level)
    with np.errstate(divide="ignore", invalid="ignore"):
        f_on = np.where(kv_res > 0, on_res / np.where(kv_res > 0, kv_res, 1), 0.0)
        f_off = np.where(kv_res > 0, off_kv / np.where(kv_res > 0, kv_res, 1), 0.0)
    wr_on, wr_off = kv_write * f_on, kv_write * f_off
    wr_dram = kv_write - wr_on - wr_off
    return {
        "linear": {"onchip": 0 * kv_res, "dram": w - off_w + act, "offload": off_w + 0 * kv_res},
        "attention": {"onchip": rd_on + wr_on, "dram": rd_dram + wr_dram, "offload": rd_off + wr_off},
        "spill": overflow,
    }


def memory_time(level_bytes: dict, hw, mem_eff: float, mem_scale: float = 1.0):
    """Seconds to move `level_bytes` on `hw`: DRAM at mem_eff * BW * mem_scale, offload overlapped."""
    t_on = level_bytes["onchip"] / (hw.onchip_bw_gbs * 1e9)
    t_dram = level_bytes["dram"] / (hw.mem_bw_gbs * 1e9 * mem_eff * mem_scale)
    t_off = level_bytes["offload"] / (hw.offload_bw_gbs * 1e9)
    return np.maximum(t_on + t_dram, t_off)
