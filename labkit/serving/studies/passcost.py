"""What one forward pass of the serving engine costs on this machine, by the tokens in it.

A scheduler's choices are only as good or bad as the passes they make: a decode-only pass
of b requests, a pass that carries a prompt chunk next to them, one long prefill. This
module *measures* those passes on the engine's own cache (`PagedBatch`), so a trace can be
replayed through the real scheduler with this machine's measured pass times
(`studies.simulate(requests, step_time(table))`) next to the cost model's times for a GPU:
the same trace, two cost functions.

- `measure_pass_costs(model, decode_rows, prefill_tokens)`: median seconds of a pass of b
  decoding rows (each at `context` tokens) and of one prompt of n tokens, interleaved;
- `step_time(table)`: a `step_time(rows) -> seconds` for `studies.simulate`, linear between
  the measured token counts (and beyond the last, at the last segment's slope).

The table leaves out how a pass's cost grows with the context its rows attend over; at the
few hundred tokens of the chapter's traces that is a small part of a pass on this model.
"""
from __future__ import annotations

import statistics

import numpy as np
import torch

from labkit import checks
from labkit.measure.clock import now as clock_now
from labkit.kvcache.batch import PagedBatch

__all__ = ["measure_pass_costs", "step_time"]


def _check_sizes(name: str, values) -> list[int]:
    values = list(values)
    if not values or any(not checks.is_int(v) or v < 1 for v in values):
        raise ValueError(f"{name} must be a non-empty list of positive integers, got {values!r}")
    return sorted(set(values))


@torch.inference_mode()
def measure_pass_costs(model, decode_rows=(1, 2, 4, 8, 16), prefill_tokens=(32, 128, 512), *, source: list[int],
                       context: int = 64, repeats: int = 5, block_size: int = 16) -> list[dict]:
    """Median seconds of each kind of pass, measured interleaved (every round runs every size once).

    Rows of `{"tokens", "kind", "seconds"}`, sorted by tokens: "decode" passes of b rows, each
    row one token at `context`; "prefill" passes of one prompt of n tokens (from `source`).
    """
    decode_rows, prefill_tokens = _check_sizes("decode_rows", decode_rows), _check_sizes("prefill_tokens", prefill_tokens)
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if len(source) < max(max(prefill_tokens), context + max(decode_rows)):
        raise ValueError(f"source must hold at least {max(max(prefill_tokens), context + max(decode_rows))} token ids")
    per_seq = -(-(max(max(prefill_tokens), context + repeats + 2)) // block_size)
    cache = PagedBatch(model.config, num_blocks=(max(decode_rows) + 1) * per_seq, block_size=block_size,
                       dtype=model.dtype, device=model.device)
    for i in range(max(decode_rows)):  # the decoding requests: a prompt each, computed once
        cache.add(i)
        cache.plan([(i, context)])
        model(torch.tensor([source[i:i + context]], device=model.device), cache=cache, last_only=True)
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats + 1):  # the first round warms up and is dropped
        for b in decode_rows:
            cache.plan([(i, 1) for i in range(b)])
            ids = torch.tensor([[source[context + i] for i in range(b)]], device=model.device)
            t0 = clock_now()
            model(ids, cache=cache, last_only=True)
            times.setdefault(("decode", b), []).append(clock_now() - t0)
            for i in range(b):  # keep every context where it was: drop the token just written
                cache.tables.lengths[i] -= 1
        for n in prefill_tokens:
            cache.add("prompt")
            cache.plan([("prompt", n)])
            t0 = clock_now()
            model(torch.tensor([source[:n]], device=model.device), cache=cache, last_only=True)
            times.setdefault(("prefill", n), []).append(clock_now() - t0)
            cache.free("prompt")
    return sorted(({"tokens": n, "kind": kind, "seconds": statistics.median(t[1:])} for (kind, n), t in times.items()),
                  key=lambda r: (r["tokens"], r["kind"]))


def step_time(table: list[dict]):
    """`step_time(rows) -> seconds` for `studies.simulate`: the measured cost of a pass of that many tokens."""
    if not table:
        raise ValueError("table must hold at least one measured pass (from measure_pass_costs)")
    points = sorted({r["tokens"]: r["seconds"] for r in table}.items())
    xs, ys = np.array([p[0] for p in points], dtype=float), np.array([p[1] for p in points])
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else ys[0] / xs[0]

    def cost(rows) -> float:
        n = sum(k for _, k in rows)
        return float(np.interp(n, xs, ys)) if n <= xs[-1] else float(ys[-1] + slope * (n - xs[-1]))

    return cost
