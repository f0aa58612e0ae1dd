"""A tiny random-weight model and helpers shared by the KV cache tests."""
from __future__ import annotations

import torch

from labkit.model import ModelConfig
from labkit.model import Transformer

TINY = dict(vocab_size=61, d_model=48, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=64, max_seq_len=256)


def tiny(seed: int = 0, **changes) -> Transformer:
    """A float32 model with weights N(0, 0.3), so attention is far from uniform."""
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**{**TINY, **changes})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def ids(T: int, seed: int = 1, vocab: int = 61, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, T), generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def run_pieces(model, x: torch.Tensor, cache, splits) -> torch.Tensor:
    """Feed x [B, T] through the cache in pieces (`splits`: sizes), return all logits [B, T, V]."""
    out, start = [], 0
    for n in splits:
        out.append(model(x[:, start:start + n], cache=cache))
        start += n
    assert start == x.shape[1]
    return torch.cat(out, dim=1)


def fail_second_layer_then_retry(model, x, kind: str, opts: dict, prefix: int = 13):
    """Run `prefix` tokens, make the next pass fail in its second layer, check the error, then run the pass again:
    (the cache, its (seq_len, n_cached: tokens held, seq_len where a kind keeps all) right after the failure, the retried pass's logits, an undisturbed run's)."""
    import pytest

    reference = run_pieces(model, x, model.new_cache(kind, max_len=40, **opts), [prefix, x.shape[1] - prefix])
    cache = model.new_cache(kind, max_len=40, **opts)
    run_pieces(model, x[:, :prefix], cache, [prefix])
    update = cache.update

    def failing(layer, k, v, rope):
        if layer == 1:
            raise RuntimeError("the second layer failed")
        return update(layer, k, v, rope)

    cache.update = failing
    with pytest.raises(RuntimeError, match="second layer"):
        model(x[:, prefix:], cache=cache)
    del cache.update
    after = (cache.seq_len, getattr(cache, "n_cached", cache.seq_len))
    return cache, after, model(x[:, prefix:], cache=cache), reference[:, prefix:]
