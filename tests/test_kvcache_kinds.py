"""Every KV cache kind behind one interface: logits equal the uncached model, memory adds up, bad input fails clearly."""
import doctest
import importlib

import pytest
import torch

from labkit.kvcache import kinds, new_cache
from tests.kvcache_shared import fail_second_layer_then_retry, ids, run_pieces, tiny

LOSSLESS = {
    "contiguous": {},
    "paged": {"block_size": 4},
    "sliding": {"window": 40, "sinks": 4},  # covers the whole 30-token sequence: nothing is evicted
}
SPLITS = [7, 1, 1, 1, 3, 1, 5, 1, 4, 1, 5]  # prefill, decode steps and chunks, crossing block boundaries


def test_all_kinds_are_registered():
    assert {"contiguous", "sliding", "paged", "quantized"} <= set(kinds())


@pytest.mark.parametrize("kind", LOSSLESS)
@pytest.mark.parametrize("batch", [1, 2])
def test_lossless_cache_logits_equal_no_cache_logits_at_every_position(kind, batch):
    model = tiny()
    x = ids(30, batch=batch)
    full = model(x)
    cache = model.new_cache(kind, max_len=40, batch_size=batch, **LOSSLESS[kind])
    torch.testing.assert_close(run_pieces(model, x, cache, SPLITS), full, atol=2e-5, rtol=0)
    assert cache.seq_len == 30


@pytest.mark.parametrize("kind", ["paged", "sliding"])
def test_paged_and_covering_sliding_equal_contiguous_exactly(kind):
    model = tiny(seed=3)
    x = ids(30, seed=4)
    reference = run_pieces(model, x, model.new_cache("contiguous", max_len=40), SPLITS)
    for opts in ([{"block_size": b} for b in (1, 3, 16)] if kind == "paged" else [{"window": 30, "sinks": 0}, {"window": 40}]):
        got = run_pieces(model, x, model.new_cache(kind, max_len=40, **opts), SPLITS)
        assert torch.equal(got, reference), opts


@pytest.mark.parametrize("kind,opts", [("contiguous", {}), ("paged", {"block_size": 16}), ("sliding", {}),
                                       ("quantized", {"bits": 8, "group_size": 8, "residual": 16})])
def test_bytes_used_follow_the_per_token_formula(kind, opts):
    model = tiny()
    cfg = model.config
    cache = model.new_cache(kind, max_len=64, **opts)
    assert cache.bytes_used() == 0
    assert cache.fragmentation() == (0.0 if kind == "paged" else 1.0)  # an empty paged cache holds no blocks
    run_pieces(model, ids(40), cache, [33, 7])
    per_token = cfg.kv_bytes_per_token(bytes_per_value=4)  # float32
    if kind == "quantized":  # codes (1 byte) + float16 scale and min per group; tails at 4 bytes
        n = cache.counts
        groups = n["qk"] // 8 * cfg.head_dim + n["qv"] * cfg.head_dim // 8
        expected = cfg.n_layers * cfg.n_kv_heads * ((n["qk"] + n["qv"]) * cfg.head_dim + groups * 4
                                                    + (n["kt"] + n["vt"]) * cfg.head_dim * 4)
        assert cache.bytes_used() == expected < per_token * 40
    else:
        assert cache.bytes_used() == per_token * 40
    if kind in ("contiguous", "sliding"):
        assert cache.bytes_allocated() == per_token * 64
        assert cache.fragmentation() == pytest.approx(24 / 64)
    if kind == "paged":  # 3 blocks of 16 hold 40 tokens
        assert cache.bytes_allocated() == per_token * 48
    cache.reset()
    assert cache.seq_len == 0 and cache.bytes_used() == 0


@pytest.mark.parametrize("kind,opts", [("contiguous", {}), ("paged", {"block_size": 4}), ("quantized", {"group_size": 8, "residual": 8})])
def test_prompt_longer_than_the_cache_is_a_clear_error_and_the_cache_stays_usable(kind, opts):
    model = tiny()
    cache = model.new_cache(kind, max_len=16, **opts)
    model(ids(10), cache=cache)
    with pytest.raises(ValueError, match="at most 16 tokens: 10 cached \\+ 7 new"):
        model(ids(7, seed=2), cache=cache)
    assert cache.seq_len == 10
    model(ids(6, seed=2), cache=cache)
    assert cache.seq_len == 16


@pytest.mark.parametrize("kind,opts,message", [
    ("sliding", {"window": 4, "sinks": 4}, "window must be larger than sinks.*window=4 and sinks=4"),
    ("sliding", {"window": 3, "sinks": 4}, "window must be larger than sinks"),
    ("sliding", {"window": 8, "sinks": -1}, "sinks must be a non-negative integer, got -1"),
    ("sliding", {"window": 1000}, "window must be at most the context window 256"),
    ("paged", {"block_size": 0}, "block_size must be a positive integer, got 0"),
    ("paged", {"block_size": -4}, "block_size must be a positive integer, got -4"),
    ("paged", {"block_size": 2.5}, "block_size must be a positive integer, got 2.5"),
    ("quantized", {"bits": 3}, r"bits must be one of \(4, 8\), got 3"),
    ("quantized", {"group_size": 5}, "group_size must be a positive divisor of head_dim=8, got 5"),
    ("quantized", {"group_size": 4, "residual": 6}, "residual must be a positive multiple of group_size=4, got 6"),
    ("contiguous", {"max_len": 0}, "max_len must be a positive integer, got 0"),
])
def test_bad_options_raise_value_errors_that_name_the_value(kind, opts, message):
    model = tiny()
    with pytest.raises(ValueError, match=message):
        model.new_cache(kind, **opts)


def test_unknown_kind_lists_the_kinds():
    with pytest.raises(ValueError, match="unknown cache kind 'ring'.*contiguous.*paged.*quantized.*sliding"):
        new_cache("ring", tiny().config)


@pytest.mark.parametrize("module", ["labkit.kvcache.sliding", "labkit.kvcache.paged", "labkit.kvcache.quantized",
                                    "labkit.kvcache.quantize"])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("kind,opts", [("contiguous", {}), ("paged", {"block_size": 4}), ("sliding", {"window": 40}),
                                       ("quantized", {"group_size": 8, "residual": 8})])
@torch.inference_mode()
def test_a_pass_that_fails_midway_leaves_the_cache_as_it_was(kind, opts):
    _, (seq_len, _), retried, reference = fail_second_layer_then_retry(tiny(), ids(30), kind, opts)
    assert seq_len == 13
    assert torch.equal(retried, reference)
