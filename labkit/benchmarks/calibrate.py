"""Calibrate the roofline for one model on this machine: time its linear products alone, on random weights.

`this_machine()` measures two peaks: the streaming-read bandwidth and a 1024 x 1024 float32 matmul.
A model's products are neither. A prompt of 16 tokens makes every product a 16-row one, which the
BLAS runs at a fraction of the big-matmul rate, and a decode step's matrix-vector products stream
their weights at a rate of their own, which may be below or above what a plain `sum` reads. So this
module measures, the way the bandwidth is measured and without running the model:

- for each row count (tokens per product), the FLOP/s of one pass through the model's own linear
  shapes (q, k, v, o, gate, up, down), stored and multiplied as the loaded model does it
  (`labkit.model.transformer.linear`, column-major float32 weights);
- for one row, the bytes per second those products stream.

`calibrate` returns the profile with those two measurements in it: `compute_eff_rows` (the
linear layers' efficiency by rows, used by `labkit.costmodel.roofline.phase_time`) and `mem_eff`.
Both are model inputs and capped at 1: where the products beat the `sum` the calibrated decode
equals the peaks' roofline. The measured rate itself, uncapped, is kept as `.stream_gb_s` (and is
the rate the profile's name prints); report that one, not `mem_bw_gbs * mem_eff`.
What it still leaves out (attention's kernels, norms, RoPE, the Python between operators) is what
a comparison with the real model shows as the remaining gap.

    >>> hw = calibrate(model.config)                        # doctest: +SKIP
    >>> costmodel.estimate(model.config, hw, 64, 2, weight_bits=32, kv_bits=32, act_bits=32).prefill_s  # doctest: +SKIP
"""
from __future__ import annotations

import math

from labkit import checks

__all__ = ["linear_shapes", "product_times", "calibrate", "ROWS", "run"]

ROWS = (16, 32, 64, 128, 256, 512)   # the prompt lengths the table covers; shorter ones take the 16-row value


def linear_shapes(config) -> list[tuple[int, int]]:
    """(in_features, out_features) of one block's products: q, k, v, o, gate, up, down (a config or a preset name)."""
    from labkit.costmodel.workload import ModelShape

    s = ModelShape.of(config)
    d, q, kv, ff = s.d_model, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim, s.d_ff
    return [(d, q), (d, kv), (d, kv), (q, d), (d, ff), (d, ff), (ff, d)]


def _config_name(config) -> str:
    return config if isinstance(config, str) else getattr(config, "name", "the model")


def _check(rows, seconds, megabytes) -> tuple[int, ...]:
    rows = tuple(rows)
    if not rows or any(not (checks.is_int(r) and r >= 1) for r in rows):
        raise ValueError(f"rows must be a non-empty list of integers >= 1, got {rows!r}")
    if not (isinstance(seconds, (int, float)) and seconds > 0):
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    if not (isinstance(megabytes, (int, float)) and megabytes >= 1):
        raise ValueError(f"megabytes must be >= 1, got {megabytes!r}")
    return rows


def product_times(config, rows=(1,) + ROWS, seconds: float = 0.1, megabytes: float = 128) -> dict:
    """Median seconds of one pass through all of `config`'s block products at each row count.

    Enough layers of random float32 weights are allocated to exceed `megabytes` (more than the
    last-level cache, so a one-row pass streams from DRAM as decode does); the time is scaled to
    all `config.n_layers`. Returns {"rows": {r: seconds}, "flops": {r: FLOPs of that pass},
    "bytes": weight bytes of one pass, "layers_timed": how many distinct layers were timed}.
    """
    import torch

    from labkit.costmodel.measure import median_seconds
    from labkit.costmodel.workload import ModelShape
    from labkit.model.transformer import linear

    rows = _check(rows, seconds, megabytes)
    shapes = linear_shapes(config)
    n_layers = ModelShape.of(config).n_layers
    layer_params = sum(i * o for i, o in shapes)
    layers = min(n_layers, max(1, math.ceil(megabytes * 2**20 / (4 * layer_params))))
    gen = torch.Generator().manual_seed(0)
    # column-major ([out, in] whose transpose is contiguous), the layout the loaders give float32 weights
    weights = [[(torch.randn(i, o, generator=gen) * i ** -0.5).t() for i, o in shapes] for _ in range(layers)]
    scale = n_layers / layers
    out = {}
    with torch.inference_mode():
        for r in rows:
            xs = {i: torch.randn(1, r, i, generator=gen) for i, _ in shapes}

            def one_pass():
                for layer in weights:
                    for w in layer:
                        linear(xs[w.shape[1]], w)

            out[r] = median_seconds(one_pass, seconds) * scale  # after a warm-up pass: page in, thread pool
    return {"rows": out, "flops": {r: 2.0 * r * layer_params * n_layers for r in rows},
            "bytes": 4.0 * layer_params * n_layers, "layers_timed": layers}


def calibrate(config, hw=None, rows=ROWS, seconds: float = 0.1, megabytes: float = 128, times: dict | None = None):
    """`hw` (default: this machine's measured profile) with its linear-layer efficiencies measured on
    `config`'s shapes: `compute_eff_rows` from the FLOP/s at each of `rows` against the profile's fp32
    peak, `mem_eff` from the bytes per second of one-row products against its read bandwidth.

    `times`: a `product_times` result to reuse instead of measuring again.
    """
    from labkit.costmodel.profiles import hardware, this_machine

    hw = this_machine() if hw is None else hardware(hw)
    rows = _check(rows, seconds, megabytes)
    if times is None:
        times = product_times(config, (1,) + tuple(r for r in rows if r != 1), seconds, megabytes)
    peak = hw.peak_flops("fp32")
    effs = tuple((float(r), min(1.0, times["flops"][r] / (times["rows"][r] * peak))) for r in rows if r in times["rows"])
    if 1 not in times["rows"] or not effs:
        raise ValueError(f"times must hold a one-row time and at least one of rows {rows}, got rows {sorted(times['rows'])}")
    stream_gb_s = times["bytes"] / times["rows"][1] / 1e9
    mem_eff = min(1.0, stream_gb_s / hw.mem_bw_gbs)
    name = (f"{hw.name}, calibrated: products at {stream_gb_s:.1f} GB/s (1 row) and "
            f"{times['flops'][rows[-1]] / times['rows'][rows[-1]] / 1e9:.0f} GFLOP/s ({rows[-1]} rows)")
    src = f"labkit.benchmarks.calibrate: {_config_name(config)}'s products on random weights"
    provenance = {**hw.provenance, "compute_eff_rows": ("measured", src), "mem_eff": ("measured", src),
                  "name": ("measured", src)}
    calibrated = hw.replace(compute_eff_rows=effs, mem_eff=mem_eff, name=name, provenance=provenance)
    object.__setattr__(calibrated, "product_times", times)
    object.__setattr__(calibrated, "stream_gb_s", stream_gb_s)  # measured; mem_eff is this over the sum's rate, capped at 1
    if hasattr(hw, "copy_bw_gbs"):
        object.__setattr__(calibrated, "copy_bw_gbs", hw.copy_bw_gbs)
    return calibrated


TITLE = "SmolLM2's TTFT and ITL: measured vs the roofline at this machine's peaks and calibrated on its products"


def run(quick: bool = False) -> dict:
    from labkit.costmodel.estimator import sweep_estimates
    from labkit.costmodel.profiles import this_machine
    from labkit.generation import latency
    from labkit.registry import load

    model, _ = load("smollm2-135m")
    lens, positions = ([16, 64, 256] if quick else [16, 32, 64, 128, 256, 512]), [16, 128, 512]
    ttft = latency.ttft_sweep(model, lens, repeat=2 if quick else 3)
    itl = latency.itl_sweep(model, positions, steps=4 if quick else 8)
    profiles = {"peaks": this_machine(), "calibrated": calibrate(model.config)}
    print(f"  {profiles['calibrated'].name}")
    report = {"ttft": ttft, "itl": itl, "modelled": {}}
    for name, hw in profiles.items():
        m_ttft, m_itl = sweep_estimates(model.config, hw, lens, positions, bits=32)
        ratios = [r["ttft_s"] / m["ttft_s"] for r, m in zip(ttft, m_ttft)] + [r["itl_s"] / m["itl_s"] for r, m in zip(itl, m_itl)]
        report["modelled"][name] = {"ttft": m_ttft, "itl": m_itl, "ratios": ratios}
    for kind, key, what, label in (("ttft", "prompt_len", "ttft_s", "TTFT {:4d} tokens:"), ("itl", "position", "itl_s", "ITL at {:4d}:      ")):
        for i, r in enumerate(report[kind]):
            p, c = (report["modelled"][k][kind][i][what] for k in profiles)
            print(f"  {label.format(r[key])} measured {r[what] * 1e3:7.1f} ms | peaks {p * 1e3:7.1f} ms "
                  f"({r[what] / p:4.2f}x) | calibrated {c * 1e3:7.1f} ms ({r[what] / c:4.2f}x)")
    for name in profiles:
        ratios = report["modelled"][name]["ratios"]
        print(f"  {name}: measured / modelled {min(ratios):.2f} to {max(ratios):.2f}")
    return report
