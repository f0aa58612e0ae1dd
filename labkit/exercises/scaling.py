"""Exercises of deep dive 09b: the least-work router (a debug exercise), the all-reduces a tensor-parallel decode
step pays in the cost model (a derivation), and how to split workers between prefill and decode (a derivation
by Little's law).

The references are labkit's own where it has one: `serving.studies.router.Router` (`outstanding`, `choose`)
for the router, `costmodel.roofline.allreduce_time` (what `phase_time` charges) for the all-reduces.
"""
from __future__ import annotations

import math

from labkit.exercises._core import Verdict, check

__all__ = ["check_least_work", "check_allreduce_step", "check_pool_sizes"]


def _least_work(replicas, now, prompt_len, max_new):
    from labkit.serving.engine.request import Request
    from labkit.serving.studies.router import Router

    def sent(p, m, finish):
        req = Request(0, [1] * p, m)
        req.finish = finish
        return req

    router = Router(len(replicas), "least_work")  # as `replay_replicas` counts (`Router.outstanding`)
    outstanding = router.outstanding([[sent(*r) for r in mine] for mine in replicas], now)
    return router.choose(Request(0, [1] * prompt_len, max_new), outstanding)


def check_least_work(fn) -> Verdict:
    """Check `fn(replicas, now, prompt_len, max_new) -> replica index`: `replicas[i]` lists the requests already
    sent to replica i as (prompt_len, max_new_tokens, finish) with `finish` the time it finished (None: not yet);
    the new request arrives at `now`. The replica whose unfinished requests hold the fewest tokens (prompt plus
    max_new_tokens, in full until they finish) gets it; ties go to the lowest index."""
    cases = [([[], []], 0.0, 10, 5),
             ([[(100, 10, None)], []], 1.0, 10, 5),
             ([[(100, 10, 0.5)], [(20, 4, None)]], 1.0, 10, 5),          # replica 0's long prompt finished
             ([[(100, 10, 2.0)], [(20, 4, None)]], 1.0, 10, 5),          # ... not yet
             ([[(30, 10, 1.0)], [(20, 4, None)]], 1.0, 10, 5),           # finished exactly when the new one arrives
             ([[(10, 10, None)], [(15, 5, None)], [(5, 5, None)]], 0.3, 8, 8),  # a three-way tie at 20
             ([[(8, 1, None), (8, 1, None)], [(10, 10, None)]], 0.0, 1, 1),     # two requests vs one bigger
             ([[(40, 40, 0.2), (5, 5, None)], [(30, 1, None)]], 0.5, 3, 3),
             ([[(64, 64, None)], [(1, 1, 9.0), (60, 60, None)], []], 4.0, 2, 2)]
    return check("least_work", fn, _least_work, cases,
                 hint="count a request's prompt plus its max_new_tokens until the moment it finishes (a request "
                      "that finished at or before `now` counts nothing); on a tie pick the lowest index")


def _allreduce_step(n_layers, d_model, batch, tp, link_gb_s, latency_us, act_bytes=2):
    from labkit.costmodel.roofline import allreduce_time

    if tp == 1:
        return 0.0
    return float(allreduce_time(2 * n_layers, batch * d_model * act_bytes, tp, link_gb_s, latency_us))


def check_allreduce_step(fn) -> Verdict:
    """Check `fn(n_layers, d_model, batch, tp, link_gb_s, latency_us, act_bytes=2) -> seconds`: what the cost
    model charges one tensor-parallel decode step for its all-reduces. Two per block (after attention, after the
    MLP), each over one activation row of `d_model` values per sequence in the batch; a ring all-reduce sends
    2 (tp - 1) / tp of the message over each GPU's link, and no all-reduce takes less than the link's latency."""
    cases = [(80, 8192, 64, 8, 450, 2.0), (80, 8192, 32, 4, 450, 2.0), (80, 8192, 512, 8, 450, 2.0),
             (80, 8192, 256, 4, 450, 2.0), (32, 4096, 1, 2, 64, 5.0), (32, 4096, 1, 1, 64, 5.0),
             (2, 512, 8, 2, 12.5, 30.0, 4), (24, 2048, 1024, 16, 900, 1.0)]
    return check("allreduce_step", fn, _allreduce_step, cases, compare=_close,
                 hint="bytes per all-reduce = batch * d_model * act_bytes; time = max(ring share * bytes / "
                      "(link_gb_s * 1e9), latency_us * 1e-6) with ring share 2 (tp - 1) / tp; 2 * n_layers of "
                      "them per step, none at tp = 1")


def _close(want, got) -> bool:
    try:
        return math.isclose(float(want), float(got), rel_tol=1e-6, abs_tol=1e-12)
    except (TypeError, ValueError):
        return False


def _pool_sizes(workers, rate, prefill_s, reply_tokens, step_s, max_batch):
    # Little's law: requests decoding at once = arrival rate x time each spends decoding (at a full batch)
    decoding = rate * reply_tokens * step_s(max_batch)
    for p in range(1, workers):
        # the prefill pool below full (at or above it its queue grows without end), the decode pool's slots enough
        if rate * prefill_s / p < 1 and decoding < (workers - p) * max_batch:
            return p, workers - p
    return None


def check_pool_sizes(fn) -> Verdict:
    """Check `fn(workers, rate, prefill_s, reply_tokens, step_s, max_batch) -> (prefill, decode) or None`: split
    `workers` into a prefill pool and a decode pool (at least one each) for requests arriving at `rate` per second.
    A prefill worker runs one prompt at a time for `prefill_s` seconds; a decode worker runs up to `max_batch`
    requests, each decode step taking `step_s(batch)` seconds, and a request decodes `reply_tokens` tokens. Size
    the pools so that neither is overloaded (the prefill pool busy less than all the time; fewer requests decoding
    at once, by Little's law with steps at a full batch, than the decode pool's slots), with the fewest prefill
    workers that allow it; None where no split does."""
    flat = lambda b: 0.02                      # a step limited by reading the weights
    rising = lambda b: 0.02 + 0.002 * b        # each row adds a little
    cases = [(2, 1.0, 0.5, 100, flat, 8), (4, 3.0, 0.5, 100, flat, 8), (4, 3.0, 0.5, 200, flat, 8),
             (8, 6.0, 0.4, 50, rising, 16), (3, 10.0, 0.5, 10, flat, 4), (6, 2.0, 0.5, 400, rising, 8),
             (5, 4.0, 0.25, 64, rising, 4), (1, 1.0, 0.1, 10, flat, 8), (2, 2.0, 0.5, 10, flat, 8),
             (3, 4.0, 0.25, 80, rising, 8)]
    return check("pool_sizes", fn, _pool_sizes, cases,
                 hint="try 1, 2, ... prefill workers: p of them keep up while rate * prefill_s < p; the rest keep "
                      "up while rate * reply_tokens * step_s(max_batch) < (workers - p) * max_batch; a pool of "
                      "zero is not a split")
