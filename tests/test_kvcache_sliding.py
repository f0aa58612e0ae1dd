"""StreamingLLM's sliding window with attention sinks: what it keeps, where it puts it, long prompts."""
import pytest
import torch

import labkit
from tests.kvcache_shared import ids, run_pieces, tiny


@torch.inference_mode()
def test_the_cache_keeps_the_sinks_and_the_latest_tokens_and_never_grows_past_the_window():
    model = tiny()
    cache = model.new_cache("sliding", window=12, sinks=3)
    x = ids(40)
    model(x[:, :5], cache=cache)
    for t in range(5, 40):
        model(x[:, t:t + 1], cache=cache)
        assert cache.n_cached <= 12
        kept = cache.kept_positions().tolist()
        expected = list(range(min(3, t + 1))) + list(range(max(3, t + 1 - 9), t + 1))
        assert kept == expected, t
    assert cache.seq_len == 40
    assert cache.bytes_used() == cache.bytes_allocated()  # full: no fragmentation


@torch.inference_mode()
def test_positions_are_cache_slots_so_one_layer_equals_the_kept_tokens_run_from_scratch():
    """With one layer, keys and values depend only on their own token; because keys are stored
    before RoPE and rotated by slot, the next token sees exactly what a fresh run over the kept
    tokens would see. Rotating by text position instead would break this."""
    model = tiny(n_layers=1)
    x = ids(30, seed=5)
    cache = model.new_cache("sliding", window=10, sinks=2)
    logits = run_pieces(model, x, cache, [8] + [1] * 22)
    kept = cache.kept_positions()
    assert kept.tolist() == [0, 1] + list(range(22, 30))
    fresh = model(x[:, kept])
    torch.testing.assert_close(logits[:, -1], fresh[:, -1], atol=2e-5, rtol=0)
    # and a text-position RoPE would differ: the same ids at positions 0, 1, 22..29
    assert not torch.allclose(logits[:, -1], model(x)[:, -1], atol=1e-3)


@torch.inference_mode()
def test_prefill_feeds_a_prompt_longer_than_the_window_in_chunks():
    model = tiny()
    x = ids(100, seed=7)
    cache = model.new_cache("sliding", window=24, sinks=4)
    assert cache.plan_chunks(100) == [24] + [5] * 15 + [1]
    state = labkit.prefill(model, x, cache=cache)
    assert state.position == cache.seq_len == 100 and cache.n_cached <= 24
    assert cache.kept_positions()[:4].tolist() == [0, 1, 2, 3] and cache.kept_positions()[-1] == 99
    tokens = labkit.decode(model, state, 30)  # streams past the window
    assert len(tokens) == 30 and cache.n_cached == 24 and cache.seq_len == 130
    # the same prompt does not fit a contiguous cache of the same size: a clear error instead
    with pytest.raises(ValueError, match="at most 24 tokens"):
        labkit.prefill(model, x, cache=model.new_cache("contiguous", max_len=24))


def test_one_pass_larger_than_the_recent_window_is_refused_with_advice():
    model = tiny()
    cache = model.new_cache("sliding", window=16, sinks=4)
    model(ids(16), cache=cache)
    with pytest.raises(ValueError, match="at most window - sinks = 12 new tokens.*chunks"):
        model(ids(13), cache=cache)
    assert cache.seq_len == 16
    with pytest.raises(ValueError, match="chunk must be in"):
        cache.plan_chunks(40, chunk=13)


def test_plain_window_without_sinks_forgets_the_first_token():
    model = tiny()
    cache = model.new_cache("sliding", window=8, sinks=0)
    run_pieces(model, ids(20), cache, [8] + [1] * 12)
    assert cache.kept_positions().tolist() == list(range(12, 20))
