"""Exercises of chapter 03's modelled half: a new device's ridge point, and the prompt that costs a reply.

Neither answer is printed in the chapter: the ridge of a device the lab has no profile for, with its
bit widths, group scales and efficiencies, is checked against `labkit.costmodel.ridge_tokens` on a
profile built from the same spec; the prompt length at which a prefill costs as much as N decode steps
is derived from the roofline, including the devices whose single decode step is compute-bound.
"""
from __future__ import annotations

import math
import numbers

from labkit import checks
from labkit.exercises._core import check

__all__ = ["check_device_ridge", "check_equal_time_prompt"]

# Two devices the profiles do not hold (invented for the exercise): an NPU with integer peaks and a
# small accelerator that lists only fp16 and fp32.
NPU = {"peak_tflops": {"int4": 160.0, "int8": 80.0, "fp16": 40.0}, "mem_bw_gbs": 120.0,
       "compute_eff": 0.5, "mem_eff": 0.7}
EDGE = {"peak_tflops": {"fp16": 26.0, "fp32": 13.0}, "mem_bw_gbs": 204.8, "compute_eff": 0.4, "mem_eff": 0.8}


def _reference_device_ridge(spec: dict, weight_bits: float, act_bits: float) -> float:
    from labkit.costmodel import hardware, ridge_tokens

    hw = hardware("h100-sxm").replace(key="exercise-device", name="exercise device", peak_tflops=dict(spec["peak_tflops"]),
                                      mem_bw_gbs=spec["mem_bw_gbs"], compute_eff=spec["compute_eff"],
                                      mem_eff=spec["mem_eff"])
    return ridge_tokens(hw, weight_bits, act_bits)


def check_device_ridge(fn) -> bool:
    """Check `fn(spec, weight_bits, act_bits) -> tokens per pass at the ridge`, as labkit's cost model
    computes it for a device described by `spec` ({"peak_tflops": {precision: TFLOP/s}, "mem_bw_gbs",
    "compute_eff", "mem_eff"}): the arithmetic runs in the wider of the two bit widths (int4, int8, fp16,
    fp32; a precision the device does not list runs at the next wider one it lists), and weights below
    16 bits carry a 16-bit scale and a 16-bit zero point per group of 64."""
    cases = [(NPU, 16, 16), (NPU, 4, 16), (NPU, 8, 8), (NPU, 4, 8), (NPU, 4, 4),
             (EDGE, 16, 16), (EDGE, 8, 8), (EDGE, 32, 32)]
    return check("device_ridge", fn, _reference_device_ridge, cases, compare=lambda a, b: abs(a - b) <= 1e-6 * abs(a),
                 hint="which precision does the arithmetic run in (the weights' or the activations'?), how many "
                      "bytes does a weight cost with its group's scale and zero point, and which fraction of each "
                      "peak does the device reach?")


def _reference_equal_time_prompt(peak_flops: float, bandwidth: float, bytes_per_weight: float, n_tokens: int) -> float:
    # W weights, batch 1, weights only. One decode step: max(2W/F, W b/BW). A prefill of P tokens:
    # max(2 P W/F, W b/BW). The longest P with prefill(P) <= n steps: 2 P W/F = n max(2W/F, W b/BW).
    ridge = peak_flops * bytes_per_weight / (2 * bandwidth)
    return n_tokens * max(1.0, ridge)


def _exact_or_whole(want: float, got) -> bool:
    """The exact length, or its whole part (the longest prompt in whole tokens), give or take rounding."""
    real = checks.is_number(got) or isinstance(got, numbers.Real) and not isinstance(got, int)  # numpy too; no bool
    return real and math.isfinite(got) and -1e-6 * abs(want) <= want - got < 1 - 1e-6


def check_equal_time_prompt(fn) -> bool:
    """Check `fn(peak_flops, bandwidth, bytes_per_weight, n_tokens) -> prompt tokens`: the longest prompt
    whose prefill takes no longer than `n_tokens` decode steps at batch 1, on the roofline with the
    weights only (attention and the KV cache left out, no efficiencies). The exact (fractional) length
    and its whole part are both accepted."""
    cases = [
        (312e12, 2039e9, 2.0, 32),      # A100, fp16: 32 reply tokens
        (989e12, 3350e9, 2.0, 1),       # H100, one step: the prompts a single step's weight read hides
        (45e12, 76.8e9, 0.5625, 100),   # a phone NPU, 4.5-bit weights in int8 arithmetic
        (1e9, 10e9, 2.0, 50),           # a tiny core with fast memory: even one decode step is compute-bound
        (200e9, 40e9, 4.0, 7),          # a CPU in float32
    ]
    return check("equal_time_prompt", fn, _reference_equal_time_prompt, cases, compare=_exact_or_whole,
                 hint="write the time of one decode step and of a P-token prefill as max(compute, memory), "
                      "set P-token prefill = n steps and solve; mind the devices where a step is not memory-bound")
