"""The budgeted eviction kinds, H2O and SnapKV: what they keep (derived by hand), what they hold, and that an
unbounded budget is the contiguous cache."""
import doctest
import importlib

import pytest
import torch

import labkit
from labkit.kvcache import kinds
from labkit.kvcache.base import attention, causal_mask
from labkit.kvcache.h2o import H2OCache
from labkit.kvcache.snapkv import SnapKVCache
from labkit.model import ModelConfig
from tests.kvcache_shared import fail_second_layer_then_retry, ids, run_pieces, tiny

SPLITS = [7, 1, 1, 1, 3, 1, 5, 1, 4, 1, 5]  # a prompt, decode steps and chunks: 30 tokens
UNBOUNDED = {"h2o": {"budget": 30}, "snapkv": {"prompt_budget": 30, "obs_window": 4}}
BOUND = {"h2o": "budget", "snapkv": "prompt_budget"}  # what each kind calls its bound
ATOL = 1e-5  # float32 logits of the same keys in the same order; measured equal to the bit


@torch.inference_mode()
def greedy(model, cache, prompt: torch.Tensor, n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens after `prompt` [1, T] and the logits [n + 1, V] they were chosen from."""
    logits = [model(prompt, cache=cache)[0, -1]]
    tokens = []
    for _ in range(n):
        tokens.append(int(logits[-1].argmax()))
        logits.append(model(torch.tensor([[tokens[-1]]]), cache=cache)[0, -1])
    return tokens, torch.stack(logits)


def pass_through(cache, q, k, layer: int = 0) -> None:
    """One forward pass of a one-layer cache with hand-made queries q [1, T, H, D] and keys (= values) [1, T, Hkv, D]."""
    cache.begin(q.shape[1])
    cache.attend(layer, q, k, k, None)  # keys arrive rotated (rotate_new_keys): rope is never called
    cache.end()


def hand_config(n_heads: int = 2) -> ModelConfig:
    return ModelConfig(d_model=4 * n_heads, n_layers=1, n_heads=n_heads, n_kv_heads=n_heads, vocab_size=10, ffn_dim=8)


def test_the_eviction_kinds_are_registered():
    assert {"h2o", "snapkv"} <= set(kinds())
    assert isinstance(tiny().new_cache(kind="h2o", budget=8), H2OCache)
    assert isinstance(tiny().new_cache(kind="snapkv", prompt_budget=8, obs_window=2), SnapKVCache)


@pytest.mark.parametrize("kind", UNBOUNDED)
@pytest.mark.parametrize("batch", [1, 2])
def test_an_unbounded_budget_gives_the_contiguous_logits(kind, batch):
    model = tiny(seed=3)
    x = ids(30, seed=4, batch=batch)
    reference = run_pieces(model, x, model.new_cache("contiguous", max_len=40, batch_size=batch), SPLITS)
    for budget in (30, 1000):  # exactly the sequence, and far more
        cache = model.new_cache(kind, max_len=40, batch_size=batch, **{**UNBOUNDED[kind], BOUND[kind]: budget})
        assert torch.allclose(run_pieces(model, x, cache, SPLITS), reference, atol=ATOL, rtol=0)
        assert cache.n_cached == cache.seq_len == 30
        assert torch.equal(cache.kept_positions(1), torch.arange(30).expand(batch, 2, 30))


@pytest.mark.parametrize("kind", UNBOUNDED)
def test_an_unbounded_budget_decodes_the_contiguous_greedy_tokens(kind):
    model = tiny(seed=5)
    prompt = ids(12, seed=6)
    want, want_logits = greedy(model, model.new_cache("contiguous", max_len=40), prompt, 20)
    cache = model.new_cache(kind, max_len=40, **{**UNBOUNDED[kind], BOUND[kind]: 32})  # 12 + 20 tokens: all kept
    got, got_logits = greedy(model, cache, prompt, 20)
    assert got == want
    assert torch.allclose(got_logits, want_logits, atol=ATOL, rtol=0)
    assert cache.n_cached == cache.seq_len == 32


@pytest.mark.slow
def test_an_unbounded_budget_decodes_the_contiguous_greedy_tokens_of_the_shakespeare_model():
    model, tok = labkit.load("shakespeare")
    prompt = torch.tensor([tok.encode("ROMEO:\nWhat light through yonder window breaks?")])
    n = 24
    want, want_logits = greedy(model, model.new_cache("contiguous", max_len=128), prompt, n)
    room = prompt.shape[1] + n
    for kind, opts in (("h2o", {"budget": room}), ("snapkv", {"prompt_budget": room, "obs_window": 8})):
        cache = model.new_cache(kind, max_len=128, **opts)
        got, got_logits = greedy(model, cache, prompt, n)
        assert got == want, kind
        assert torch.allclose(got_logits, want_logits, atol=1e-4, rtol=0), kind


def test_h2o_keeps_the_heavy_hitter_each_head_chose_and_the_recent_tokens_by_hand():
    """Every query looks for one key (logit 50 against 0, so it takes all the probability once it
    sees it): head 0's favourite is token 2, head 1's token 4. Column sums over the 8 prompt queries:
    head 0: token 0 gets 1 (query 0) + 1/2 (query 1) = 1.5, token 1 1/2, token 2 one per query 2..7 = 6;
    head 1: token 0 1 + 1/2 + 1/3 + 1/4 = 25/12, token 1 13/12, token 2 7/12, token 3 1/4, token 4 = 4.
    budget 4 = 2 recent (6, 7) + 2 heavy hitters among 0..5: head 0 keeps 0 and 2, head 1 keeps 4 and 0."""
    cache = H2OCache(hand_config(), budget=4)
    assert (cache.recent, cache.heavy, cache.sinks) == (2, 2, 0)  # half and half
    q, k = torch.zeros(1, 8, 2, 4), torch.zeros(1, 8, 2, 4)
    q[..., 0] = 1.0
    k[0, 2, 0, 0] = k[0, 4, 1, 0] = 100.0
    pass_through(cache, q, k)
    assert cache.kept_positions()[0].tolist() == [[0, 2, 6, 7], [0, 4, 6, 7]]
    torch.testing.assert_close(cache.scores[0][0], torch.tensor([[1.5, 6, 0, 0], [25 / 12, 4, 0, 0]]), atol=1e-6, rtol=0)
    for t in range(8, 14):  # decode: each new query adds ~1 to its head's favourite, ~0 elsewhere
        pass_through(cache, q[:, :1], torch.zeros(1, 1, 2, 4))
        assert cache.kept_positions()[0].tolist() == [[0, 2, t - 1, t], [0, 4, t - 1, t]], t
    assert cache.scores[0][0, :, 1].tolist() == pytest.approx([12, 10], abs=1e-5)
    assert cache.seq_len == 14 and cache.n_cached == 4


def test_h2o_never_evicts_a_sink_or_a_recent_token_and_never_grows_past_the_budget():
    model = tiny(seed=7)
    x = ids(60, seed=8, batch=2)
    cache = model.new_cache("h2o", max_len=64, batch_size=2, budget=10, recent=3, sinks=2)
    assert cache.heavy == 5
    seen = 0
    for n in [17] + [1] * 20 + [4, 1, 6] + [1] * 12:
        with torch.inference_mode():
            model(x[:, seen:seen + n], cache=cache)
        seen += n
        for layer in range(model.config.n_layers):
            kept = cache.kept_positions(layer)  # [B, Hkv, n_cached]
            assert kept.shape[-1] == min(seen, 10)
            assert torch.equal(kept[..., :2], torch.tensor([0, 1]).expand(2, 2, 2))  # the sinks
            assert torch.equal(kept[..., -3:], torch.arange(seen - 3, seen).expand(2, 2, 3))  # the recent
            assert bool((kept.diff(dim=-1) > 0).all())  # each head's tokens in text order, no repeats
    assert not torch.equal(cache.kept_positions(0)[0, 0], cache.kept_positions(0)[0, 1])  # heads chose apart


def test_snapkv_keeps_what_the_observation_window_reads_per_head_by_hand():
    """The window's 2 queries (positions 8, 9) read head 0's keys 3, 6, 1 (logits 50, 49, 48) and head 1's
    keys 5, 0, 7: the 3 = budget − window best of the 8 tokens before the window, plus the window.
    Max pooling with kernel 3 spreads each score over its neighbours: head 0's pooled scores are
    (c, c, a, a, a, b, b, b) for a > b > c, head 1's (b, b, 0, 0, a, a, a, c), so the best token's
    neighbourhood wins: 2, 3, 4 and 4, 5, 6."""
    q, k = torch.zeros(1, 10, 2, 4), torch.zeros(1, 10, 2, 4)
    q[0, 8:, :, 0] = 1.0  # the window's queries; the others do not vote
    for head, tokens in ((0, (3, 6, 1)), (1, (5, 0, 7))):
        for token, key in zip(tokens, (100.0, 98.0, 96.0)):
            k[0, token, head, 0] = key
    cache = SnapKVCache(hand_config(), prompt_budget=5, obs_window=2, kernel=1)
    pass_through(cache, q, k)
    assert cache.kept_positions()[0].tolist() == [[1, 3, 6, 8, 9], [0, 5, 7, 8, 9]]
    assert cache.scores[0].numel() == 0  # no score outlives the prompt's pass
    pooled = SnapKVCache(hand_config(), prompt_budget=5, obs_window=2, kernel=3, pooling="max")
    pass_through(pooled, q, k)
    assert pooled.kept_positions()[0].tolist() == [[2, 3, 4, 8, 9], [4, 5, 6, 8, 9]]
    for _ in range(3):  # generation is appended, nothing evicted again
        pass_through(pooled, q[:, :1], torch.zeros(1, 1, 2, 4))
    assert pooled.kept_positions()[0].tolist() == [[2, 3, 4, 8, 9, 10, 11, 12], [4, 5, 6, 8, 9, 10, 11, 12]]


def test_snapkv_keeps_the_window_and_bounds_the_prompt_on_a_model():
    model = tiny(seed=9)
    x = ids(50, seed=10)
    cache = model.new_cache("snapkv", max_len=64, prompt_budget=12, obs_window=4)
    run_pieces(model, x, cache, [40] + [1] * 10)
    for layer in range(model.config.n_layers):
        kept = cache.kept_positions(layer)[0]  # [Hkv, 22]: 8 voted prompt tokens, the window 36..39, 10 generated
        assert kept.shape == (2, 22)
        assert bool((kept[:, :8] < 36).all()) and torch.equal(kept[:, 8:], torch.arange(36, 50).expand(2, 14))
    short = model.new_cache("snapkv", max_len=64, prompt_budget=12, obs_window=4)
    run_pieces(model, x[:, :10], short, [10])  # a prompt within the budget is kept whole
    assert short.kept_positions()[0, 0].tolist() == list(range(10))


def test_attention_weights_are_the_probabilities_attention_runs_on():
    """Summed over a GQA group, the weights times the values are the group's summed attention outputs."""
    from labkit.kvcache.eviction import attention_weights

    g = torch.Generator().manual_seed(0)
    q, keys, values = torch.randn(2, 5, 6, 8, generator=g), torch.randn(2, 2, 9, 8, generator=g), torch.randn(2, 2, 9, 8, generator=g)
    mask = causal_mask(5, 9)
    w = attention_weights(q, keys, mask)  # [B, Hkv, T, S]
    assert w.shape == (2, 2, 5, 9) and torch.allclose(w.sum(-1), torch.full((2, 2, 5), 3.0))  # 3 query heads per group
    out = attention(q, keys, values, mask).view(2, 5, 2, 3, 8).sum(3)  # [B, T, Hkv, D]
    torch.testing.assert_close(w @ values, out.transpose(1, 2), atol=1e-5, rtol=0)
    assert not bool(w[..., 0, 5:].any())  # the first query sees the 5 keys before it only


@torch.inference_mode()
def test_evicted_keys_keep_their_true_positions():
    """One layer: a token's key depends on its id and position only, so each head's kept keys must be the
    contiguous cache's keys at the kept positions (rotated there, never re-rotated), and new queries
    get the next text position, not the next slot."""
    model = tiny(seed=11, n_layers=1)
    x = ids(30, seed=12)
    full = model.new_cache("contiguous", max_len=40)
    run_pieces(model, x, full, [20] + [1] * 10)  # the same passes: the same products, the same bits
    for cache in (model.new_cache("h2o", max_len=40, budget=6), model.new_cache("snapkv", max_len=40, prompt_budget=6, obs_window=2)):
        run_pieces(model, x, cache, [20] + [1] * 10)
        kept = cache.kept_positions()  # [1, Hkv, n]
        keys, values = cache.layer_kv(0)
        assert torch.equal(keys, full.keys[0, :, :, :30].gather(2, kept[..., None].expand(*kept.shape, 8)))
        assert torch.equal(values, full.values[0, :, :, :30].gather(2, kept[..., None].expand(*kept.shape, 8)))
        assert cache.begin(1).tolist() == [30] and cache.n_cached < 30
        cache.abort()


def test_bytes_allocated_counts_keys_values_positions_and_scores():
    model = tiny()
    c = model.config  # 2 layers, 2 KV heads, head_dim 8, float32
    per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4  # keys and values
    bookkeeping = c.n_layers * c.n_kv_heads * 4  # an int32 position (and for H2O a float32 score) per layer and head
    h2o, snap = model.new_cache("h2o", budget=10), model.new_cache("snapkv", prompt_budget=10, obs_window=3)
    assert h2o.bytes_allocated() == snap.bytes_allocated() == 0
    run_pieces(model, ids(25), h2o, [20, 1, 1, 1, 1, 1])
    run_pieces(model, ids(25), snap, [20, 1, 1, 1, 1, 1])
    assert h2o.bytes_allocated() == h2o.bytes_used() == 10 * (per_token + 2 * bookkeeping)
    assert snap.bytes_allocated() == snap.bytes_used() == 15 * (per_token + bookkeeping)  # 10 prompt + 5 generated
    assert h2o.fragmentation() == 0.0
    h2o.reset()
    assert h2o.seq_len == h2o.n_cached == h2o.bytes_allocated() == 0


@torch.inference_mode()
def test_a_pass_that_fails_midway_leaves_the_cache_as_it_was():
    model = tiny()
    x = ids(30)
    for kind, opts in (("h2o", {"budget": 8}), ("snapkv", {"prompt_budget": 8, "obs_window": 2})):
        cache, after, retried, reference = fail_second_layer_then_retry(model, x, kind, opts)
        assert after == (13, 8) and torch.equal(retried, reference)
        with pytest.raises(RuntimeError, match="needs every layer's keys"):
            model(x[:, :1], cache=cache, n_layers=1)
        assert cache.seq_len == 30


@pytest.mark.parametrize("kind,opts,message", [
    ("h2o", {}, r"budget must be a positive integer \(tokens kept per layer and KV head\), got None"),
    ("h2o", {"budget": 0}, "budget must be a positive integer.*got 0"),
    ("h2o", {"budget": 2.5}, "budget must be a positive integer.*got 2.5"),
    ("h2o", {"budget": True}, "budget must be a positive integer.*got True"),
    ("h2o", {"budget": 8, "recent": 0}, r"recent must be an integer in \[1, 8\].*got 0"),
    ("h2o", {"budget": 8, "sinks": 4, "recent": 5}, r"recent must be an integer in \[1, 4\] \(budget - sinks.*got 5"),
    ("h2o", {"budget": 4, "sinks": 4}, r"sinks must be an integer in \[0, 3\].*got 4"),
    ("snapkv", {"prompt_budget": -3}, "prompt_budget must be a positive integer.*got -3"),
    ("snapkv", {"prompt_budget": 32}, r"obs_window must be an integer in \[1, 31\] \(below prompt_budget=32.*got 32"),
    ("snapkv", {"prompt_budget": 8, "obs_window": 2, "kernel": 4}, "kernel must be odd.*got 4"),
    ("snapkv", {"prompt_budget": 8, "obs_window": 2, "kernel": 0}, "kernel must be a positive integer, got 0"),
    ("snapkv", {"prompt_budget": 8, "obs_window": 2, "pooling": "sum"},
     r"pooling must be one of \('avg', 'max'\), got 'sum'"),
    ("snapkv", {"budget": 8}, r"snapkv has no budget=; it is prompt_budget= \(the bound on the prompt's part.*got budget=8"),
    ("snapkv", {"prompt_budget": 8, "window": 2}, r"snapkv has no window=; it is obs_window= \(the queries that vote\), got window=2"),
])
def test_bad_options_raise_value_errors_that_name_the_value(kind, opts, message):
    with pytest.raises(ValueError, match=message):
        tiny().new_cache(kind=kind, **opts)


@pytest.mark.parametrize("module", ["labkit.kvcache.h2o", "labkit.kvcache.snapkv"])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
