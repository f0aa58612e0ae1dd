"""Automatic prefix caching: hits derived by hand, block bookkeeping that never leaks, double-frees or shares a
block someone writes, and replies identical with and without the cache."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.kvcache.batch import BlockTables
from labkit.model import ModelConfig
from labkit.model.transformer import Transformer
from labkit.serving import Engine, Request, fresh, studies, summarize

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=128)


def test_hits_derived_by_hand():
    t = BlockTables(num_blocks=16, block_size=4)
    a = list(range(10))
    t.add("a")
    t.reserve("a", 10)
    t.commit("a", 10)
    t.register_full("a", a)  # blocks 0..3 and 4..7 are full; 8, 9 are not
    assert t.cached_prefix(a[:8] + [99, 98]) == t.tables["a"][:2]  # two full blocks match
    assert t.cached_prefix(a[:8]) == t.tables["a"][:1]  # a prompt cached whole keeps its last block to run
    assert t.cached_prefix([0, 1, 2, 3, 7, 7, 7, 7, 7]) == t.tables["a"][:1]  # the second block differs
    assert t.cached_prefix([1, 0, 2, 3, 4, 5, 6, 7, 8]) == []  # the chain starts at the first block
    t.free("a")  # nobody holds them now: free, but still findable until allocated again
    assert t.n_free == 16 and t.cached_prefix(a[:8] + [99]) != []
    cached = t.cached_prefix(a[:8] + [99])
    assert t.fits_after(cached, 1) and t.adopt("b", cached) == 8
    assert t.n_free == 14 and t.lengths["b"] == 8
    for _ in range(14):  # allocating every other block evicts nothing held
        t.manager.allocate()
    assert not t.fits_after([], 1) and t.cached_prefix(a[:8] + [99]) == cached


def _invariants(sched) -> None:
    blocks = sched.blocks
    manager, bs = blocks.manager, blocks.block_size
    holders: dict[int, list] = {}
    for key, table in blocks.tables.items():
        assert len(table) == len(set(table)) and len(table) * bs >= blocks.lengths[key]
        for i, b in enumerate(table):
            holders.setdefault(b, []).append((key, i))
    free = list(manager.free)
    assert len(free) == len(set(free)), "a block is on the free list twice"
    for b in range(blocks.num_blocks):
        assert manager.ref_count[b] == len(holders.get(b, [])), f"block {b}: count {manager.ref_count[b]}"
        assert (manager.ref_count[b] == 0) == (b in free), f"block {b} is held and free, or neither"
        if len(holders.get(b, [])) > 1:  # shared: registered, and full in every holder, so nobody writes it
            assert manager.block_hash[b] is not None
            assert all((i + 1) * bs <= blocks.lengths[key] for key, i in holders[b])


@settings(max_examples=60, deadline=None)
@given(policy=st.sampled_from(["static", "continuous", "orca", "chunked"]), num_blocks=st.integers(8, 30),
       max_batch=st.integers(1, 5),
       reqs=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 9), st.integers(1, 8), st.floats(0, 3)),
                     min_size=1, max_size=10))
def test_shared_blocks_are_never_leaked_freed_twice_or_written(policy, num_blocks, max_batch, reqs):
    prefixes = [list(range(1, 13)), list(range(20, 26)), []]  # two shared system prompts and none
    requests = [Request(i, prefixes[p] + [40 + i] * s + [50], r, arrival=t) for i, (p, s, r, t) in enumerate(reqs)]
    seen = []
    replay = studies.simulate(requests, lambda rows: 0.01, policy=policy, max_batch=max_batch, token_budget=32,
                              block_size=4, num_blocks=num_blocks, prefix_cache=True,
                              on_step=lambda s: (_invariants(s), seen.append(s)))
    assert all(r.finish is not None for r in requests)
    assert seen[-1].blocks.n_free == num_blocks and not seen[-1].blocks.tables  # everything given back
    assert all(r.cached_tokens % 4 == 0 and r.cached_tokens < len(r.tokens) for r in requests)
    assert 0.0 <= summarize(replay)["prefix_hit_rate"] < 1.0


def _trace(system, n=4, gap=50.0):
    g = torch.Generator().manual_seed(5)
    return [Request(i, system + torch.randint(0, CFG.vocab_size, (5,), generator=g).tolist(), 6, arrival=i * gap)
            for i in range(n)]


def test_the_engine_reuses_a_shared_system_prompt_and_replies_alike():
    torch.manual_seed(0)
    model = Transformer(CFG).eval()
    system = torch.randint(0, CFG.vocab_size, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    trace = _trace(system)
    runs = {on: Engine(model, policy="continuous", block_size=4, num_blocks=40, prefix_cache=on).replay(fresh(trace))
            for on in (True, False)}
    with_cache, without = runs[True].requests, runs[False].requests
    assert [r.output for r in with_cache] == [r.output for r in without]  # the same replies
    # requests arrive one at a time: the first computes the 3 system blocks, each later one finds them
    assert [r.cached_tokens for r in with_cache] == [0, 12, 12, 12] and all(r.cached_tokens == 0 for r in without)
    assert summarize(runs[True])["prefix_hit_rate"] == 36 / (4 * 17)
    assert sum(n for s in runs[True].steps for _, n in s.rows) == sum(n for s in runs[False].steps for _, n in s.rows) - 36


def test_preempted_requests_come_back_on_their_own_cached_blocks():
    torch.manual_seed(0)
    model = Transformer(CFG).eval()
    system = list(range(3, 15))
    trace = _trace(system, n=5, gap=0.0)  # all at once, into too few blocks: some are preempted
    runs = {on: Engine(model, policy="chunked", max_batch=4, token_budget=16, block_size=4, num_blocks=12,
                       prefix_cache=on).replay(fresh(trace)) for on in (True, False)}
    assert runs[True].preemptions + runs[False].preemptions >= 1
    assert [r.output for r in runs[True].requests] == [r.output for r in runs[False].requests]


def test_the_shared_prefix_study_counts_what_the_cache_saves():
    torch.manual_seed(0)
    model = Transformer(CFG).eval()
    system = list(range(1, 41))  # 40 tokens: 2 full blocks of 16 are reusable, 8 tokens are not
    questions = [[50 + i, 51, 52] for i in range(3)]
    got = studies.shared_prefix(model, system, questions, max_new_tokens=3)
    assert got["same_replies"]
    assert got["off"]["prefilled_tokens"] - got["on"]["prefilled_tokens"] == 2 * 32  # two later requests, 32 each
    assert got["on"]["summary"]["prefix_hit_rate"] == 64 / (3 * 43) and got["off"]["summary"]["prefix_hit_rate"] == 0


# ---- routing across data-parallel replicas ----------------------------------------------------


def test_routers_assign_as_derived_by_hand():
    from labkit.serving import Router

    reqs = [Request(i, [1] * p, 10) for i, p in enumerate((100, 10, 10, 10))]
    rr = Router(2, "round_robin")
    assert [rr.choose(r, [0, 0]) for r in reqs] == [0, 1, 0, 1]
    lw, out, got = Router(2, "least_work"), [0, 0], []
    for r in reqs:  # nothing finishes in between: the work piles up where it was sent
        i = lw.choose(r, out)
        out[i] += lw.work(r)
        got.append(i)
    assert got == [0, 1, 1, 1] and out == [110, 60]
    import pytest
    with pytest.raises(ValueError, match="policy must be one of"):
        Router(2, "random")
    with pytest.raises(ValueError, match="one number per replica"):
        lw.choose(reqs[0], [0])


def test_replicas_serve_every_request_where_the_router_sent_it():
    from labkit.serving import Router, replay_replicas

    torch.manual_seed(0)
    model = Transformer(CFG).eval()
    g = torch.Generator().manual_seed(2)
    lengths = (60, 8, 8, 60, 8, 8)
    trace = [Request(i, torch.randint(0, 64, (p,), generator=g).tolist(), 4, arrival=0.0) for i, p in enumerate(lengths)]
    routes = {}
    for policy in ("round_robin", "least_work"):
        engines = [Engine(model, policy="chunked", block_size=4, num_blocks=64, token_budget=32) for _ in range(2)]
        replay, routes[policy] = replay_replicas(engines, fresh(trace), Router(2, policy))
        assert all(r.finish is not None for r in replay.requests) and len(replay.requests) == len(trace)
        alone = Engine(model, policy="chunked", block_size=4, num_blocks=64, token_budget=32).replay(fresh(trace))
        assert [r.output for r in sorted(replay.requests, key=lambda r: r.id)] == [r.output for r in alone.requests]
    assert routes["round_robin"] == [0, 1, 0, 1, 0, 1]
    # all arrive at once, so nothing finishes in between: work 64, 12, 12, 64, 12, 12 goes to the lighter replica
    assert routes["least_work"] == [0, 1, 1, 1, 0, 0]
    work = [sum(lengths[k] + 4 for k, r in enumerate(routes["least_work"]) if r == i) for i in range(2)]
    assert work == [88, 88]


def test_the_routing_study_runs_both_routers_on_one_trace():
    torch.manual_seed(0)
    model = Transformer(CFG).eval()
    g = torch.Generator().manual_seed(3)
    trace = [Request(i, torch.randint(0, 64, (p,), generator=g).tolist(), 3, arrival=0.01 * i)
             for i, p in enumerate((50, 6, 6, 50, 6))]
    got = studies.routing(model, trace, 2, block_size=4, token_budget=32, max_batch=4)
    assert set(got) == {"round_robin", "least_work"} and got["round_robin"]["route"] == [0, 1, 0, 1, 0]
    assert all(v["summary"]["requests"] == 5 for v in got.values())


def test_a_waiting_request_is_hashed_once_not_at_every_step(monkeypatch):
    """The head of the queue is looked up at every step while it cannot fit; its block hashes are computed once."""
    import labkit.kvcache.blocks as blocks_module
    from labkit.serving import Scheduler

    calls = []
    real = blocks_module.hash_block
    monkeypatch.setattr(blocks_module, "hash_block", lambda parent, tokens: calls.append(1) or real(parent, tokens))
    sched = Scheduler(BlockTables(num_blocks=12, block_size=4), policy="continuous", max_batch=2, prefix_cache=True)
    sched.add(Request("a", list(range(40)), 4))
    assert sched.schedule() == [(sched.running[0], 40)]  # a takes 10 of the 12 blocks
    sched.add(Request("b", list(range(100, 140)), 4))  # b needs 10: it waits at the head
    before = len(calls)
    for _ in range(5):
        sched.schedule()
    assert sched.waiting[0].id == "b" and len(calls) - before == (40 - 1) // 4  # 9 blocks hashed once, not 5 times
