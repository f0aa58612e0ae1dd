"""Measured vs modelled on this machine: SmolLM2's prefill and decode steps against the roofline.

The model gets this machine's measured streaming-read bandwidth and matmul FLOP/s
(`labkit.costmodel.profiles.this_machine`) and nothing else; what is left between the two is the
efficiency the lab's own transformer reaches (design target: >= 45 % of the read roofline).

    >>> result = compare(prompt_len=64, n_tokens=16)       # doctest: +SKIP
    >>> result["ratio"]          # measured / modelled decode time   # doctest: +SKIP
"""
from __future__ import annotations

import numpy as np

from labkit.measure.clock import now as clock_now

__all__ = ["measure", "compare", "prompt_ids"]


def prompt_ids(prompt_len: int, vocab_size: int) -> list[int]:
    """A fixed prompt of `prompt_len` ordinary token ids (the content does not change the timing)."""
    return [100 + (37 * i) % (vocab_size - 200) for i in range(prompt_len)]


def busy_reason(samples_gb_s: list[float], reference_gb_s: float, spread: float = 0.3) -> str | None:
    """Why the machine looks busy (None if it does not): bandwidth samples taken around a measurement
    that disagree with each other, or fall well below this machine's own measured bandwidth.

    >>> busy_reason([20.0, 21.0], 20.5) is None
    True
    >>> busy_reason([8.0, 19.0], 20.0)
    'the read bandwidth moved from 8.0 to 19.0 GB/s during the run (this machine: 20.0 GB/s): other programs are competing for memory'
    """
    lo, hi = min(samples_gb_s), max(samples_gb_s)
    if hi <= 0 or reference_gb_s <= 0:
        raise ValueError(f"bandwidths must be > 0, got {samples_gb_s} and {reference_gb_s}")
    first, last = samples_gb_s[0], samples_gb_s[-1]
    if (hi - lo) / hi > spread or lo < (1 - spread) * reference_gb_s:
        return (f"the read bandwidth moved from {first:.1f} to {last:.1f} GB/s during the run (this machine: "
                f"{reference_gb_s:.1f} GB/s): other programs are competing for memory")
    return None


def measure(model, prompt_len: int = 64, n_tokens: int = 16, repeats: int = 2) -> dict:
    """Median prefill time and median time of each decode step over `repeats` rounds of `measure.run` (after a
    warm-up): each round one reply, its prefill and each step timed inside it."""
    from labkit import measure
    from labkit.generation import decode, prefill

    if not (isinstance(repeats, int) and repeats >= 1):
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    ids = prompt_ids(prompt_len, model.config.vocab_size)
    state = prefill(model, ids[:8], max_len=8 + 4)
    decode(model, state, 2)
    prefills, steps = [], []

    def one_reply():
        start = clock_now()
        state = prefill(model, ids, max_len=prompt_len + n_tokens + 1)
        prefills.append(clock_now() - start)
        run = []
        for _ in range(n_tokens):
            start = clock_now()
            decode(model, state, 1)
            run.append(clock_now() - start)
        steps.append(run)

    measure.run({"reply": one_reply}, rounds=repeats, warmup=0, machine=False, loops=1)
    return {"prefill_s": measure.Timing("prefill", tuple(prefills)).median,
            "step_s": np.array([measure.Timing(f"step {i}", tuple(r[i] for r in steps)).median
                                for i in range(n_tokens)])}


def _median_step(measured: dict) -> float:
    """The median over the reply's steps of each step's median (`measure`'s Timing)."""
    from labkit import measure

    return measure.Timing("decode step", tuple(float(x) for x in measured["step_s"])).median


def compare(model=None, prompt_len: int = 64, n_tokens: int = 16, hw=None, repeats: int = 2) -> dict:
    """Measure SmolLM2 (loaded if `model` is None) and put the roofline's prediction beside it."""
    import torch

    from labkit.costmodel.estimator import estimate
    from labkit.costmodel.profiles import hardware, this_machine

    if model is None:
        from labkit.registry import load

        model, _ = load("smollm2-135m")
    from labkit.costmodel.measure import read_bandwidth_gb_s

    hw = this_machine() if hw is None else hardware(hw)
    bits = 8 * next(model.parameters()).element_size()
    before = read_bandwidth_gb_s(seconds=0.25)
    measured = measure(model, prompt_len, n_tokens, repeats)
    after = read_bandwidth_gb_s(seconds=0.25)
    busy = busy_reason([before, after], this_machine().mem_bw_gbs)
    # the first decode step runs at context prompt_len: one more token than the steps measured
    est = estimate(model.config, hw, prompt_len, n_tokens + 1, weight_bits=bits, kv_bits=bits, act_bits=bits)
    ratio = float(_median_step(measured) / np.mean(est.decode_step_s))
    with torch.no_grad():
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"measured_prefill_s": measured["prefill_s"], "modelled_prefill_s": est.prefill_s,
            "measured_step_s": measured["step_s"], "modelled_step_s": est.decode_step_s, "ratio": ratio,
            "weight_bytes": weight_bytes, "hardware": hw.name, "bits": bits, "busy": busy,
            "bandwidth_samples_gb_s": [before, after],
            "achieved_read_gb_s": est.weight_bytes / _median_step(measured) / 1e9}
