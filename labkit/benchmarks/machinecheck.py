"""Measured vs modelled on this machine: SmolLM2's prefill and decode steps against the roofline.

The model gets this machine's measured streaming-read bandwidth and matmul FLOP/s
(`labkit.costmodel.profiles.this_machine`) and nothing else; what is left between the two is the
efficiency the lab's own transformer reaches (design target: >= 45 % of the read roofline).

    >>> result = compare(prompt_len=64, n_tokens=16)       # doctest: +SKIP
    >>> result["ratio"]                                     # measured / modelled decode time, e.g. 1.8
"""
from __future__ import annotations

import statistics
import time

import numpy as np

__all__ = ["measure", "compare", "prompt_ids"]


def prompt_ids(prompt_len: int, vocab_size: int) -> list[int]:
    """A fixed prompt of `prompt_len` ordinary token ids (the content does not change the timing)."""
    return [100 + (37 * i) % (vocab_size - 200) for i in range(prompt_len)]


def measure(model, prompt_len: int = 64, n_tokens: int = 16, repeats: int = 2) -> dict:
    """Median prefill time and median time of each decode step over `repeats` runs (after a warm-up)."""
    from labkit.generation import decode, prefill

    if not (isinstance(repeats, int) and repeats >= 1):
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    ids = prompt_ids(prompt_len, model.config.vocab_size)
    state = prefill(model, ids[:8], max_len=8 + 4)
    decode(model, state, 2)
    prefills, steps = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        state = prefill(model, ids, max_len=prompt_len + n_tokens + 1)
        prefills.append(time.perf_counter() - start)
        run = []
        for _ in range(n_tokens):
            start = time.perf_counter()
            decode(model, state, 1)
            run.append(time.perf_counter() - start)
        steps.append(run)
    return {"prefill_s": statistics.median(prefills), "step_s": np.median(np.array(steps), axis=0)}


def compare(model=None, prompt_len: int = 64, n_tokens: int = 16, hw=None, repeats: int = 2) -> dict:
    """Measure SmolLM2 (loaded if `model` is None) and put the roofline's prediction beside it."""
    import torch

    from labkit.costmodel.estimator import estimate
    from labkit.costmodel.profiles import hardware, this_machine

    if model is None:
        from labkit.registry import load

        model, _ = load("smollm2-135m")
    hw = this_machine() if hw is None else hardware(hw)
    bits = 8 * next(model.parameters()).element_size()
    measured = measure(model, prompt_len, n_tokens, repeats)
    # the first decode step runs at context prompt_len: one more token than the steps measured
    est = estimate(model.config, hw, prompt_len, n_tokens + 1, weight_bits=bits, kv_bits=bits, act_bits=bits)
    ratio = float(np.median(measured["step_s"]) / np.mean(est.decode_step_s))
    with torch.no_grad():
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"measured_prefill_s": measured["prefill_s"], "modelled_prefill_s": est.prefill_s,
            "measured_step_s": measured["step_s"], "modelled_step_s": est.decode_step_s, "ratio": ratio,
            "weight_bytes": weight_bytes, "hardware": hw.name, "bits": bits,
            "achieved_read_gb_s": est.weight_bytes / float(np.median(measured["step_s"])) / 1e9}
