"""Disaggregated prefill: the replies of one engine, times that add up, a decode engine that never prefills,
no block leaked, and the KV hand-over refusing what does not fit."""
from __future__ import annotations

import pytest
import torch

from labkit.kvcache.batch import PagedBatch
from labkit.serving import Engine, Request, Status, fresh, studies, summarize
from labkit.serving.studies.disagg import replay_disaggregated
from tests.kvcache_shared import TINY, tiny

LINK = 1e6  # bytes/s: slow, so the modelled wire time is large next to a tiny model's passes
BLOCKS = 120


def _engine(model, **opts) -> Engine:
    return Engine(model, **{"policy": "continuous", "block_size": 4, "num_blocks": BLOCKS, "token_budget": 256,
                            "prefix_cache": False, **opts})


def _trace(**request_opts) -> list[Request]:
    """Short requests decoding, long prompts arriving among them."""
    g = torch.Generator().manual_seed(3)
    shape = [(9, 10, 0.0), (12, 10, 0.0), (11, 9, 0.0), (150, 4, 0.004), (7, 8, 0.005), (120, 5, 0.009)]
    return [Request(i, torch.randint(0, TINY["vocab_size"], (p,), generator=g).tolist(), r, arrival=a, **request_opts)
            for i, (p, r, a) in enumerate(shape)]


def _outputs(requests) -> dict:
    return {r.id: r.output for r in requests}


@pytest.fixture(scope="module")
def model():
    return tiny()


@pytest.fixture(scope="module")
def served(model):
    prefill, decode = _engine(model), _engine(model)
    replay, info = replay_disaggregated(prefill, decode, fresh(_trace()), link_bytes_per_s=LINK)
    return prefill, decode, replay, info


def test_greedy_replies_are_those_of_one_co_located_engine(model, served):
    _, _, replay, _ = served
    alone = _engine(model).replay(fresh(_trace()))
    assert _outputs(replay.requests) == _outputs(alone.requests)
    assert all(r.status == Status.FINISHED and r.finish_reason == "length" and len(r.output) == r.max_new_tokens
               for r in replay.requests)
    assert summarize(replay)["output_tokens"] == sum(r.max_new_tokens for r in replay.requests)


def test_times_add_up_prefill_then_transfer_then_decode(model, served):
    prefill, _, replay, info = served
    sent = {t["id"]: t for t in info["transfers"]}
    assert set(sent) == {r.id for r in replay.requests}  # every reply goes on past its first token
    c = model.config
    for req in replay.requests:
        ran = [s for s in prefill.steps if req.id in dict(s.rows)]
        assert len(ran) == 1 and ran[0].start >= req.arrival  # one whole-prompt pass, after the arrival
        # its tokens are out once the pass and sampling are done; the step ends after handing them on (emit)
        assert ran[0].start < req.first_token <= ran[0].end and req.ttft >= req.first_token - ran[0].start
        assert set(ran[0].parts) >= {"schedule", "pass", "verify and sample", "emit"}
        t = sent[req.id]
        assert t["kv_tokens"] == len(req.prompt)
        assert t["kv_bytes"] == 2 * c.n_layers * len(req.prompt) * c.n_kv_heads * c.head_dim * 4  # float32
        assert t["wire_s"] == t["kv_bytes"] / LINK and t["transfer_s"] > t["wire_s"]  # + the measured copies
        assert t["ready"] >= req.first_token + t["wire_s"]
        assert req.token_times[1] >= req.first_token + t["transfer_s"]
        assert req.token_times == sorted(req.token_times)
    assert info["kv_bytes"] == sum(t["kv_bytes"] for t in sent.values())


def test_the_decode_engine_only_decodes_and_no_block_is_leaked(served):
    prefill, decode, replay, info = served
    assert decode.steps and all(n == 1 for s in decode.steps for _, n in s.rows)
    assert info["decode_prefill_rows"] == 0
    for req in replay.requests:  # one decode row per token after the first
        assert sum(1 for s in decode.steps for key, _ in s.rows if key == req.id) == req.max_new_tokens - 1
    for engine in (prefill, decode):
        assert engine.cache.tables.n_free == BLOCKS and not engine.cache.tables.tables
        assert not engine.scheduler.has_work
    assert len(replay.steps) == len(prefill.steps) + len(decode.steps)


def test_seeded_sampling_gives_the_same_replies_the_sampler_travels_with_the_request(model):
    opts = dict(params={"temperature": 1.0, "top_k": 20})
    replay, _ = replay_disaggregated(_engine(model), _engine(model), fresh(_trace(**opts)), link_bytes_per_s=LINK)
    alone = _engine(model).replay(fresh(_trace(**opts)))
    assert _outputs(replay.requests) == _outputs(alone.requests)
    greedy = _engine(model).replay(fresh(_trace()))
    assert _outputs(alone.requests) != _outputs(greedy.requests)  # the sampling did sample


def test_a_request_done_with_its_first_token_never_leaves_the_prefill_engine(model):
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, TINY["vocab_size"], (20,), generator=g).tolist()
    first = _engine(model).replay([Request(0, list(prompt), 1)]).requests[0].output[0]
    reqs = [Request(0, list(prompt), 1), Request(1, list(prompt), 6, stop_ids=frozenset({first})),
            Request(2, list(prompt), 3)]
    prefill, decode = _engine(model), _engine(model)
    _, info = replay_disaggregated(prefill, decode, reqs, link_bytes_per_s=LINK)
    assert [t["id"] for t in info["transfers"]] == [2]
    assert [r.finish_reason for r in reqs] == ["length", "stop", "length"] and reqs[1].output == [first]
    assert reqs[0].finish == reqs[0].first_token and all(r.status == Status.FINISHED for r in reqs)
    assert prefill.cache.tables.n_free == decode.cache.tables.n_free == BLOCKS


def test_a_full_decode_engine_keeps_arrivals_waiting(model):
    decode = _engine(model, max_batch=1)
    replay, info = replay_disaggregated(_engine(model), decode, fresh(_trace()), link_bytes_per_s=LINK)
    assert all(len(s.rows) == 1 for s in decode.steps)
    assert _outputs(replay.requests) == _outputs(_engine(model).replay(fresh(_trace())).requests)
    # one slot: the requests decode one after another, each waiting (in the inbox) for the one before to end
    spans = sorted((r.token_times[1], r.token_times[-1]) for r in replay.requests)
    assert all(end < start for (_, end), (start, _) in zip(spans, spans[1:]))
    ready = {t["id"]: t["ready"] for t in info["transfers"]}
    assert any(r.token_times[1] - ready[r.id] > r.token_times[-1] - r.token_times[1] for r in replay.requests[1:])


def test_import_kv_refuses_wrong_shapes_and_leaves_nothing_behind(model):
    c = model.config
    batch = PagedBatch(c, num_blocks=8, block_size=4)
    good = torch.zeros(c.n_layers, 5, c.n_kv_heads, c.head_dim)
    for keys, values in ((good[:1], good[:1]), (good[:, :, :1], good[:, :, :1]), (good[..., :4], good[..., :4]),
                         (good, good[:, :4]), (good[0], good[0])):
        with pytest.raises(ValueError, match="n_layers, n, n_kv_heads, head_dim"):
            batch.import_kv("a", keys, values)
    with pytest.raises(ValueError, match="out of KV blocks"):
        batch.import_kv("a", torch.zeros(c.n_layers, 40, c.n_kv_heads, c.head_dim),
                        torch.zeros(c.n_layers, 40, c.n_kv_heads, c.head_dim))
    assert batch.tables.n_free == 8 and not batch.tables.tables
    batch.import_kv("a", good, good + 1)
    keys, values = batch.export_kv("a")
    assert torch.equal(keys, good) and torch.equal(values, good + 1)


def test_the_engine_hand_over_checks_its_request(model):
    engine = _engine(model)
    req = Request(0, [1, 2, 3, 4, 5], 4)
    with pytest.raises(ValueError, match="must be running here"):
        engine.hand_off(req)
    kv = torch.zeros(model.config.n_layers, 5, model.config.n_kv_heads, model.config.head_dim)
    with pytest.raises(ValueError, match="all of request 0's 5 tokens but the last"):
        engine.add_prefilled(req, kv, kv)  # no first token yet: it holds 5 tokens, 4 of them cached at most
    req.output.append(7)
    assert engine.add_prefilled(req, kv, kv) and req.n_cached == 5 and req.status == Status.RUNNING
    assert engine.step().rows == [(0, 1)]
    full = _engine(model, max_batch=1)
    other = Request(1, [1, 2, 3, 4, 5], 4, output=[7])
    assert full.add_prefilled(Request(2, [1, 2, 3, 4, 5], 4, output=[7]), kv, kv)
    assert not full.add_prefilled(other, kv, kv) and 1 not in full.cache.tables.tables  # no slot: nothing changed


def test_bad_arguments_are_refused_by_name(model):
    a, b = _engine(model), _engine(model)
    for link in (0, -1.0, "fast", True):
        with pytest.raises(ValueError, match="link_bytes_per_s must be a positive number"):
            replay_disaggregated(a, b, fresh(_trace()), link_bytes_per_s=link)
    with pytest.raises(ValueError, match="two different engines"):
        replay_disaggregated(a, a, fresh(_trace()))
    with pytest.raises(ValueError, match="distinct ids"):
        replay_disaggregated(a, b, [Request(0, [1, 2], 2), Request(0, [3, 4], 2)])
    with pytest.raises(ValueError, match="same model"):
        replay_disaggregated(a, _engine(tiny(n_layers=1)), fresh(_trace()))
    source = list(range(1, 61)) * 20
    for kwargs, match in ((dict(n_running=0), "n_running"), (dict(reply=1), "reply must be an integer >= 2"),
                          (dict(link_gb_s=-1), "link_gb_s"), (dict(long_prompt=400), "exceeds the model's context"),
                          (dict(source=source[:50]), "source must hold")):
        with pytest.raises(ValueError, match=match):
            studies.disaggregation(model, **{"source": source, "long_prompt": 64, **kwargs})


def test_the_study_replays_one_trace_three_ways(model):
    c = model.config
    got = studies.disaggregation(model, n_running=3, long_prompts=2, long_prompt=96, short_prompt=8, reply=10,
                                 chunk=8, source=list(range(1, 61)) * 10, block_size=8)
    assert got["same_outputs"]
    assert got["kv_bytes_per_token"] == 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4
    dis = got["disaggregated"]
    assert dis["kv_bytes_per_long"] == 96 * got["kv_bytes_per_token"] and dis["decode_prefill_rows"] == 0
    assert dis["wire_s_per_long"] == dis["kv_bytes_per_long"] / 12.5e9 < dis["transfer_s_per_long"]
    for way in ("continuous", "chunked", "disaggregated"):
        row = got[way]
        assert len(row["ttft_long_s"]) == 2 and row["itl_p50_s"] > 0 and row["throughput_tok_s"] > 0
        assert row["itl_p99_s"] >= row["itl_p50_s"]
    # co-located without chunking, a short request's gap on the long prompt's replica spans its whole prefill
    assert got["continuous"]["itl_during_p99_s"] >= min(got["continuous"]["ttft_long_s"]) * 0.5
