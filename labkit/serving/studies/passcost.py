"""What one forward pass of the serving engine costs on this machine, by the tokens in it.

A scheduler's choices are only as good or bad as the passes they make: a decode-only pass
of b requests, a pass that carries a prompt chunk next to them, one long prefill. This
module *measures* those passes on the engine's own cache (`PagedBatch`), so a trace can be
replayed through the real scheduler with this machine's measured pass times
(`studies.simulate(requests, step_time(table))`) next to the cost model's times for a GPU:
the same trace, two cost functions.

- `measure_pass_costs(model, decode_rows, prefill_tokens)`: median seconds of a pass of b
  decoding rows (each at `context` tokens) and of one prompt of n tokens, interleaved; with
  `verify_rows` and `gammas`, also of b rows that each verify γ drafted tokens (1 + γ tokens a row,
  every position's logits kept), and with `batch_invariant` in the mode exact replies are served in;
- `step_time(table)`: a `step_time(rows) -> seconds` for `studies.simulate`, linear between
  the measured token counts (and beyond the last, at the last segment's slope); a pass with drafted
  tokens in it is priced on the verify passes' curve where the table has them.

The table leaves out how a pass's cost grows with the context its rows attend over; at the
few hundred tokens of the chapter's traces that is a small part of a pass on this model.
"""
from __future__ import annotations

import statistics

import numpy as np
import torch

from labkit import checks, measure
from labkit.kvcache.batch import PagedBatch

__all__ = ["measure_pass_costs", "step_time"]


def _check_sizes(name: str, values) -> list[int]:
    values = list(values)
    if not values or any(not checks.is_int(v) or v < 1 for v in values):
        raise ValueError(f"{name} must be a non-empty list of positive integers, got {values!r}")
    return sorted(set(values))


@torch.inference_mode()
def measure_pass_costs(model, decode_rows=(1, 2, 4, 8, 16), prefill_tokens=(32, 128, 512), *, source: list[int],
                       context: int = 64, repeats: int = 5, block_size: int = 16, verify_rows=(), gammas=(),
                       batch_invariant: bool = False) -> list[dict]:
    """Median seconds of each kind of pass: one `labkit.measure.run`, every round runs every size once in a fresh
    order, the cache planned (and the last pass's tokens dropped) untimed before each.

    Rows of `{"tokens", "kind", "seconds", "samples"}`, sorted by tokens: "decode" passes of b rows, each
    row one token at `context`; "prefill" passes of one prompt of n tokens (from `source`); "verify" passes
    of b rows (`verify_rows`) each holding its last token and γ drafted ones (`gammas`), all their logits kept
    (their rows also name `rows` and `gamma`). `batch_invariant`: every pass in that mode (`Engine`'s).
    """
    from contextlib import nullcontext

    from labkit.model.kernels import batch_invariant as invariant

    decode_rows, prefill_tokens = _check_sizes("decode_rows", decode_rows), _check_sizes("prefill_tokens", prefill_tokens)
    verify_rows, gammas = list(verify_rows), list(gammas)
    if bool(verify_rows) != bool(gammas):
        raise ValueError(f"verify_rows and gammas go together (passes of b rows verifying γ drafts each), got "
                         f"verify_rows={verify_rows!r} and gammas={gammas!r}")
    if verify_rows:
        verify_rows, gammas = _check_sizes("verify_rows", verify_rows), _check_sizes("gammas", gammas)
    checks.flag("batch_invariant", batch_invariant)
    with invariant(model) if batch_invariant else nullcontext():
        return _measure(model, decode_rows, prefill_tokens, source, context, repeats, block_size, verify_rows, gammas)


def _measure(model, decode_rows, prefill_tokens, source, context, repeats, block_size, verify_rows, gammas):
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    most = max(decode_rows + verify_rows)
    width = 1 + max(gammas, default=0)
    if len(source) < max(max(prefill_tokens), context + most + width):
        raise ValueError(f"source must hold at least {max(max(prefill_tokens), context + most + width)} token ids")
    per_seq = -(-(max(max(prefill_tokens), context + repeats + 2 + width)) // block_size)
    cache = PagedBatch(model.config, num_blocks=(most + 1) * per_seq, block_size=block_size,
                       dtype=model.dtype, device=model.device)
    for i in range(most):  # the decoding requests: a prompt each, computed once
        cache.add(i)
        cache.plan([(i, context)])
        model(torch.tensor([source[i:i + context]], device=model.device), cache=cache, last_only=True)
    plans, undo = {}, []  # per pass kind: (plan the cache, the ids); undo: what the last pass wrote, to drop

    def decode_pass(b):
        def plan():
            cache.plan([(i, 1) for i in range(b)])
            undo.append(lambda: [cache.tables.lengths.__setitem__(i, cache.tables.lengths[i] - 1) for i in range(b)])
        return plan, torch.tensor([[source[context + i] for i in range(b)]], device=model.device)

    def verify_pass(b, g):
        def plan():
            cache.plan([(i, 1 + g) for i in range(b)], logits={i: 1 + g for i in range(b)})
            undo.append(lambda: [cache.tables.truncate(i, context) for i in range(b)])
        return plan, torch.tensor([[t for i in range(b) for t in source[context + i:context + i + 1 + g]]],
                                  device=model.device)

    def prefill_pass(n):
        def plan():
            cache.add("prompt")
            cache.plan([("prompt", n)])
            undo.append(lambda: cache.free("prompt"))
        return plan, torch.tensor([source[:n]], device=model.device)

    for b in decode_rows:
        plans[("decode", b)] = decode_pass(b)
    for b in verify_rows:
        for g in gammas:
            plans[("verify", b, g)] = verify_pass(b, g)
    for n in prefill_tokens:
        plans[("prefill", n)] = prefill_pass(n)
    names = {key: " ".join(map(str, key)) for key in plans}

    def setup(name):  # untimed: drop what the last pass wrote, then plan this one
        while undo:
            undo.pop()()
        plans[keys[name]][0]()

    keys = {v: k for k, v in names.items()}
    run = measure.run({names[key]: (lambda ids=ids: model(ids, cache=cache, last_only=True))
                       for key, (_, ids) in plans.items()}, rounds=repeats, warmup=1, setup=setup, machine=False,
                      loops=1)
    while undo:
        undo.pop()()
    times = {key: list(run[names[key]].samples) for key in plans}
    rows = []
    for key, t in times.items():
        kind, n = key[0], key[1] * (1 + key[2]) if key[0] == "verify" else key[1]
        extra = {"rows": key[1], "gamma": key[2]} if kind == "verify" else {}
        rows.append({"tokens": n, "kind": kind, "seconds": run[names[key]].median, "samples": t, **extra})
    return sorted(rows, key=lambda r: (r["tokens"], r["kind"]))


def _curve(table: list[dict], pool: bool = False):
    """Seconds by tokens, linear between the measured counts (`pool`: the median where several passes share a count;
    otherwise the table's last row at that count)."""
    by: dict[int, list[float]] = {}
    for r in table:
        by.setdefault(r["tokens"], []).append(r["seconds"])
    points = sorted((n, statistics.median(v) if pool else v[-1]) for n, v in by.items())
    xs, ys = np.array([p[0] for p in points], dtype=float), np.array([p[1] for p in points])
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else ys[0] / xs[0]
    return lambda n: float(np.interp(n, xs, ys)) if n <= xs[-1] else float(ys[-1] + slope * (n - xs[-1]))


def step_time(table: list[dict]):
    """`step_time(rows) -> seconds` for `studies.simulate`: the measured cost of a pass of that many tokens. Where the
    table has verify passes, the rows carrying drafted tokens (a request with a `draft`: 1 + k tokens, every logit
    kept) are priced on their curve and the pass's other tokens at the plain curve's cost beyond them."""
    if not table:
        raise ValueError("table must hold at least one measured pass (from measure_pass_costs)")
    plain = _curve([r for r in table if r["kind"] != "verify"] or table)
    verify = [r for r in table if r["kind"] == "verify"]
    one = [r for r in table if r["kind"] == "decode" and r["tokens"] == 1]  # a one-token pass is all kinds at once
    drafted = _curve(one + verify, pool=True) if verify else None

    def cost(rows) -> float:
        n = sum(k for _, k in rows)
        d = sum(k for req, k in rows if getattr(req, "draft", None)) if drafted is not None else 0
        return plain(n) if not d else drafted(d) + plain(n) - plain(d)

    return cost
