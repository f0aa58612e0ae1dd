"""Serving: the packed paged batch equals one sequence at a time; the schedulers do what is derived by
hand; blocks are never leaked or freed twice; the engine's replies equal plain generation."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.kvcache.batch import BlockTables, PagedBatch
from labkit.model import ModelConfig
from labkit.model.transformer import Transformer
from labkit.serving import Engine, Replay, Request, Scheduler, fresh, poisson_trace, studies, summarize

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=128)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return Transformer(CFG).eval()


def _ids(n, seed):
    return torch.randint(0, CFG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.inference_mode()
def test_packed_rows_at_mixed_positions_equal_each_row_alone(tiny):
    prompts = {k: _ids(n, k) for k, n in enumerate((5, 9, 17, 3))}
    batch = PagedBatch(CFG, num_blocks=32, block_size=4)
    for k in prompts:
        batch.add(k)
    batch.plan([(0, 5), (1, 9)])  # two prompts
    out = tiny(torch.tensor([prompts[0] + prompts[1]]), cache=batch, last_only=True)
    assert out.shape == (1, 2, CFG.vocab_size)
    for row, k in enumerate((0, 1)):
        torch.testing.assert_close(out[0, row], tiny(torch.tensor([prompts[k]]))[0, -1], atol=1e-5, rtol=0)
    # decode rows at positions 5 and 9, a 10-token chunk of a third prompt, a whole fourth prompt
    batch.plan([(0, 1), (1, 1), (2, 10), (3, 3)])
    out = tiny(torch.tensor([[7, 8] + prompts[2][:10] + prompts[3]]), cache=batch, last_only=True)
    alone = [prompts[0] + [7], prompts[1] + [8], prompts[2][:10], prompts[3]]
    for row, ids in enumerate(alone):
        torch.testing.assert_close(out[0, row], tiny(torch.tensor([ids]))[0, -1], atol=1e-5, rtol=0)
    assert [batch.length(k) for k in range(4)] == [6, 10, 10, 3]


@torch.inference_mode()
def test_chunked_prefill_equals_one_shot_prefill(tiny):
    ids = _ids(23, 5)
    batch = PagedBatch(CFG, num_blocks=16, block_size=4)
    batch.add("x")
    chunks = []
    for lo, hi in ((0, 6), (6, 7), (7, 16), (16, 23)):
        batch.plan([("x", hi - lo)])
        chunks.append(tiny(torch.tensor([ids[lo:hi]]), cache=batch))
    torch.testing.assert_close(torch.cat(chunks, 1), tiny(torch.tensor([ids])), atol=1e-5, rtol=0)


def test_packed_batch_refuses_bad_plans(tiny):
    batch = PagedBatch(CFG, num_blocks=4, block_size=4)
    batch.add("a")
    with pytest.raises(ValueError, match="not in the batch"):
        batch.plan([("b", 1)])
    with pytest.raises(ValueError, match="context window"):
        batch.plan([("a", CFG.max_seq_len + 1)])
    batch.plan([("a", 3)])
    with pytest.raises(ValueError, match="planned rows add up to 3"):
        tiny(torch.tensor([[1, 2]]), cache=batch)
    batch.plan([("a", 17)])
    with pytest.raises(ValueError, match="out of KV blocks"):
        tiny(torch.tensor([_ids(17, 1)]), cache=batch)


# ---- the schedulers, on a scripted trace, without a model --------------------------------------------


def simulate(policy, requests, check=None, **limits) -> tuple[list[list[tuple[int, int]]], Replay]:
    """The scheduler with a fake model (token 0, one second a step): each step's rows, and the replay."""
    replay = studies.simulate(requests, lambda rows: 1.0, policy=policy, on_step=check, **limits)
    return [s.rows for s in replay.steps], replay


def five_requests():
    return [Request(i, [1, 2, 3, 4], r) for i, r in enumerate((2, 3, 1, 2, 2))]


@pytest.mark.parametrize("policy, budget, expected", [
    # 4 slots, 5 four-token prompts with replies of 2, 3, 1, 2, 2 tokens (derivation in the docstring below)
    ("continuous", 16, [[(0, 4), (1, 4), (2, 4), (3, 4)], [(4, 4)], [(0, 1), (1, 1), (3, 1), (4, 1)], [(1, 1)]]),
    ("chunked", 16, [[(0, 4), (1, 4), (2, 4), (3, 4)], [(0, 1), (1, 1), (3, 1), (4, 4)], [(1, 1), (4, 1)]]),
    ("static", 16, [[(0, 4), (1, 4), (2, 4), (3, 4)], [(0, 1), (1, 1), (3, 1)], [(1, 1)], [(4, 4)], [(4, 1)]]),
    ("chunked", 8, [[(0, 4), (1, 4)], [(0, 1), (1, 1), (2, 4), (3, 2)], [(1, 1), (3, 2), (4, 4)], [(3, 1), (4, 1)]]),
    ("orca", 16, [[(0, 4), (1, 4), (2, 4), (3, 4)], [(0, 1), (1, 1), (3, 1), (4, 4)], [(1, 1), (4, 1)]]),
    ("orca", 8, [[(0, 4), (1, 4)], [(0, 1), (1, 1), (2, 4)], [(1, 1), (3, 4)], [(3, 1), (4, 4)], [(4, 1)]]),
])
def test_scheduler_batches_match_the_hand_derivation(policy, budget, expected):
    """continuous: request 2 ends after its prefill, its free slot admits 4 in a prefill-only step, then all
    decode. chunked: the free slot's prefill rides along with the decodes. static: 4 waits until the whole
    first batch is done. chunked at budget 8: decodes first, then whole prompts, then a 2-token chunk of 3.
    orca: the decodes and whole new prompts share a pass; at budget 8 a prompt that does not fit whole waits."""
    steps, _ = simulate(policy, five_requests(), max_batch=4, token_budget=budget, block_size=4, num_blocks=100)
    assert steps == expected


def block_invariants(scheduler: Scheduler) -> None:
    blocks = scheduler.blocks
    held = [b for table in blocks.tables.values() for b in table]
    assert len(held) == len(set(held)), "a block is in two tables"
    free = list(blocks.manager.free)
    assert len(free) == len(set(free)), "a block is on the free list twice"
    assert set(held).isdisjoint(free), "a held block is also free"
    assert len(held) + len(free) == blocks.num_blocks, "a block leaked"
    for key, table in blocks.tables.items():
        assert len(table) * blocks.block_size >= blocks.lengths[key]


@settings(max_examples=60, deadline=None)
@given(policy=st.sampled_from(["static", "continuous", "orca", "chunked"]), num_blocks=st.integers(6, 24),
       max_batch=st.integers(1, 6), lengths=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 9)), min_size=1, max_size=10))
def test_blocks_are_never_leaked_or_freed_twice(policy, num_blocks, max_batch, lengths):
    reqs = [Request(i, list(range(1, p + 1)), r) for i, (p, r) in enumerate(lengths)]
    seen = []
    simulate(policy, reqs, check=lambda s: (block_invariants(s), seen.append(s)), max_batch=max_batch,
             token_budget=24, block_size=4, num_blocks=num_blocks)
    assert seen[-1].blocks.n_free == num_blocks and not seen[-1].blocks.tables
    assert all(len(r.output) == r.max_new_tokens for r in reqs)


def test_a_full_pool_preempts_the_newest_request_and_recomputes_it():
    # 2 requests of 4 + up to 8 tokens on 4 blocks of 4: both fit at first, then one must give way
    reqs = [Request(0, [1, 2, 3, 4], 8), Request(1, [5, 6, 7, 8], 8)]
    steps, replay = simulate("continuous", reqs, check=block_invariants, max_batch=2, token_budget=16, block_size=4,
                             num_blocks=4)
    assert replay.preemptions >= 1 and reqs[1].preemptions >= 1 and reqs[0].preemptions == 0
    assert any((1, n) in s for s in steps for n in range(5, 12)), "the preempted request's prompt + output is prefilled again"


def test_bad_settings_name_the_parameter():
    tables = BlockTables(8, 16)
    with pytest.raises(ValueError, match="max_batch"):
        Scheduler(tables, max_batch=0)
    with pytest.raises(ValueError, match="token_budget"):
        Scheduler(tables, token_budget=8)
    with pytest.raises(ValueError, match="policy"):
        Scheduler(tables, policy="fifo")
    sched = Scheduler(tables, token_budget=64, context=100)
    with pytest.raises(ValueError, match="exceeds the context"):
        sched.add(Request(0, list(range(90)), 20))
    with pytest.raises(ValueError, match="token_budget"):
        sched.add(Request(1, list(range(60)), 20))
    with pytest.raises(ValueError, match="max_new_tokens"):
        Request(2, [1], 0)
    with pytest.raises(ValueError, match="seed of request 3 must be None or an integer, got 'abc'"):
        Request(3, [1], 2, seed="abc")
    with pytest.raises(TypeError, match=r"unknown sampling parameter\(s\): \['temp'\]"):
        Request(4, [1], 2, params={"temp": 0.5})
    with pytest.raises(TypeError, match="must be a SamplingParams or a dict"):
        Request(5, [1], 2, params=0.5)
    assert Request(6, [1], 2, params={"temperature": 0.5}).params.temperature == 0.5  # a dict is read as the fields


# ---- the engine ------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["static", "continuous", "orca", "chunked"])
def test_engine_replies_equal_generating_each_request_alone(tiny, policy):
    trace = poisson_trace(7, 50.0, prompt_len=(3, 30), reply_len=(1, 12), source=_ids(200, 9), seed=3)
    engine = Engine(tiny, policy=policy, max_batch=3, token_budget=48, block_size=4, num_blocks=40)
    replay = engine.replay(fresh(trace))
    for req in replay.requests:
        want = list(req.prompt)  # greedy, one request alone, the whole sequence every step (no cache at all)
        with torch.inference_mode():
            for _ in range(req.max_new_tokens):
                want.append(int(tiny(torch.tensor([want]))[0, -1].argmax()))
        assert req.output == want[len(req.prompt):], req.id
        assert req.first_token >= req.arrival and len(req.token_times) == req.max_new_tokens
    summary = summarize(replay)
    assert summary["output_tokens"] == sum(r.max_new_tokens for r in trace)
    assert 0 < summary["kv_util_paged"] <= 1


def test_preallocation_reserves_the_cap_clients_ask_for_not_the_reply_they_get():
    """kv_util_prealloc reserves prompt + max_tokens per running request; kv_util_oracle the exact reply."""
    equal = studies.simulate([Request(i, [1, 2, 3, 4], 5) for i in range(3)], lambda rows: 1.0, max_batch=4, block_size=4)
    s = summarize(equal)
    assert s["max_tokens"] == 5 and s["kv_util_prealloc"] == pytest.approx(s["kv_util_oracle"])  # every reply is the cap
    mixed = studies.simulate(five_requests(), lambda rows: 1.0, max_batch=4, block_size=4)
    s, capped = summarize(mixed), summarize(mixed, max_tokens=64)
    assert s["max_tokens"] == 3 and s["kv_util_prealloc"] < s["kv_util_oracle"]
    assert capped["kv_util_prealloc"] < s["kv_util_prealloc"]
    # by hand, after the first pass: four prompts ran, request 2 ended at its first token, three run on
    step = mixed.steps[0]
    assert (step.n_running, step.prompt_tokens, step.kv_tokens) == (3, 12, 12)
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        summarize(mixed, max_tokens=0)
