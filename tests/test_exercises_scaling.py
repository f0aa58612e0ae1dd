"""The checkers of the scaling-out deep dive (09b) pass the answer derived from the statement and fail the
plausible wrong ones; the all-reduce reference is what the cost model charges a tensor-parallel plan."""
import math

import pytest

from tests.conftest import assert_checker_separates


def _route(replicas, now, prompt_len, max_new, *, forget=True, strict=True, reply=True, last_tie=False):
    def live(finish):
        return finish is None or (finish > now if strict else finish >= now) or not forget
    work = [sum(p + (m if reply else 0) for p, m, f in sent if live(f)) for sent in replicas]
    order = range(len(work) - 1, -1, -1) if last_tie else range(len(work))
    return min(order, key=lambda i: work[i])


@pytest.mark.parametrize("wrong", [
    lambda *a: _route(*a, forget=False),       # finished requests still counted
    lambda *a: _route(*a, strict=False),       # a request finishing as the new one arrives still counted
    lambda *a: _route(*a, reply=False),        # input length only
    lambda *a: _route(*a, last_tie=True),      # ties to the highest index
    lambda r, *a: min(range(len(r)), key=lambda i: len(r[i])),  # fewest requests, not fewest tokens
])
def test_the_router_checker_separates(wrong, capsys):
    assert_checker_separates("check_least_work", _route, wrong, capsys)


def _allreduce(n_layers, d_model, batch, tp, link_gb_s, latency_us, act_bytes=2, *, ring=True, floor=True,
               per_layer=2):
    if tp == 1:
        return 0.0
    share = 2 * (tp - 1) / tp if ring else 1.0
    one = share * batch * d_model * act_bytes / (link_gb_s * 1e9)
    one = max(one, latency_us * 1e-6) if floor else one + latency_us * 1e-6
    return per_layer * n_layers * one


@pytest.mark.parametrize("wrong", [
    lambda *a: _allreduce(*a, ring=False),      # the whole message over each link
    lambda *a: _allreduce(*a, floor=False),     # latency added to every transfer instead of a floor
    lambda *a: _allreduce(*a, per_layer=1),     # one all-reduce per block
])
def test_the_allreduce_checker_separates(wrong, capsys):
    assert_checker_separates("check_allreduce_step", _allreduce, wrong, capsys)


def test_the_allreduce_reference_is_what_the_cost_model_charges():
    from labkit import costmodel
    from labkit.costmodel.profiles import hardware
    from labkit.exercises.scaling import _allreduce_step

    hw = hardware("h100-sxm")
    cfg = costmodel.LLAMA3_70B
    pairs = ((8, 1), (4, 2), (2, 4))
    for batch in (64, 512):
        plans = costmodel.compare_plans(cfg, "h100-sxm", plans=pairs, batch=batch, prompt_len=1024, reply_len=2)
        for (tp, dp), plan in zip(pairs, plans):
            want = _allreduce_step(cfg.n_layers, cfg.d_model, batch // dp, tp, hw.link_bw_gbs, hw.link_latency_us)
            assert math.isclose(plan["allreduce_s"], want, rel_tol=1e-6), (batch, plan["plan"])


def _pools(workers, rate, prefill_s, reply_tokens, step_s, max_batch, *, batch_of_one=False, le=False,
           most=False):
    for p in (range(workers - 1, 0, -1) if most else range(1, workers)):
        d = workers - p
        busy = rate * prefill_s / p
        if busy > 1 if le else busy >= 1:
            continue
        decoding = rate * reply_tokens * step_s(1 if batch_of_one else max_batch)
        if decoding < d * max_batch:
            return p, d
    return None


@pytest.mark.parametrize("wrong", [
    lambda *a: _pools(*a, batch_of_one=True),   # decode steps priced at a batch of one
    lambda *a: _pools(*a, le=True),             # a prefill pool busy all the time counted as keeping up
    lambda *a: _pools(*a, most=True),           # the most prefill workers that keep up, not the fewest
])
def test_the_pool_checker_separates(wrong, capsys):
    assert_checker_separates("check_pool_sizes", _pools, wrong, capsys)
