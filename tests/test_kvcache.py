"""The KV cache interface: the contiguous cache's bookkeeping, and a new kind plugging in without edits."""
import pytest
import torch

from labkit import kvcache
from labkit.kvcache.base import KVCache, causal_mask
from labkit.kvcache.contiguous import ContiguousCache
from labkit.model import ModelConfig
from tests.test_model import ids, tiny

CFG = ModelConfig(vocab_size=97, d_model=48, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=64, max_seq_len=64)


class PreRopeCache(KVCache):
    """A test kind that stores keys *before* RoPE and rotates all of them at every read,
    as a StreamingLLM cache must: proves the attention layer never assumes rotated keys."""

    kind = "test-prerope"
    rotate_new_keys = False  # it rotates keys itself, at every read

    def __init__(self, config, **opts):
        super().__init__(config, **opts)
        self.k = [None] * config.n_layers
        self.v = [None] * config.n_layers
        self._len = 0

    @property
    def seq_len(self):
        return self._len

    def begin(self, n_new):
        self.check_new(n_new)
        self._n_new = n_new
        return torch.arange(self._len, self._len + n_new)

    def update(self, layer, k, v, rope):
        self.check_kv(layer, k, v)
        self.k[layer] = k if self.k[layer] is None else torch.cat([self.k[layer], k], dim=2)
        self.v[layer] = v if self.v[layer] is None else torch.cat([self.v[layer], v], dim=2)
        n_keys = self.k[layer].shape[2]
        return rope(self.k[layer], torch.arange(n_keys)), self.v[layer], causal_mask(self._n_new, n_keys)

    def end(self):
        self._len += self._n_new
        self._n_new = None

    def reset(self):
        self.__init__(self.config, max_len=self.max_len)

    def bytes_allocated(self):
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)

    def bytes_used(self):
        return self.bytes_allocated()


def test_a_new_kind_plugs_in_through_the_registry_and_matches():
    assert "contiguous" in kvcache.kinds() and "test-prerope" in kvcache.kinds()
    model = tiny()
    x = ids(15)
    full = model(x)
    cache = model.new_cache(kind="test-prerope", max_len=32)
    assert isinstance(cache, PreRopeCache) and cache.dtype == torch.float64
    out = torch.cat([model(x[:, :6], cache=cache)] + [model(x[:, t:t + 1], cache=cache) for t in range(6, 15)], 1)
    torch.testing.assert_close(out, full, atol=1e-10, rtol=0)


def test_contiguous_protocol_and_bookkeeping():
    cache = ContiguousCache(CFG, max_len=10, dtype=torch.float32)
    per_token = 2 * 2 * 2 * 8 * 4  # K and V, 2 layers, 2 KV heads, head_dim 8, float32
    assert cache.bytes_allocated() == 10 * per_token and cache.bytes_used() == 0 and cache.fragmentation() == 1.0
    assert cache.begin(3).tolist() == [0, 1, 2]
    rope_calls = []

    def rope(x, positions):
        rope_calls.append(positions.tolist())
        return x + 100

    k = torch.randn(1, 2, 3, 8)
    v = torch.randn(1, 2, 3, 8)
    keys, values, mask = cache.update(0, k, v, rope)
    assert ContiguousCache.rotate_new_keys and rope_calls == []  # keys arrive rotated (by the model) and are stored as is
    torch.testing.assert_close(keys, k)
    torch.testing.assert_close(values, v)
    assert mask.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    cache.update(1, k, v, rope)
    cache.end()
    assert cache.seq_len == 3 and cache.bytes_used() == 3 * per_token
    assert cache.fragmentation() == pytest.approx(0.7)
    assert cache.begin(1).tolist() == [3]
    keys, values, mask = cache.update(0, k[:, :, :1], v[:, :, :1], rope)
    assert mask is None and keys.shape == (1, 2, 4, 8)  # one query sees every key
    torch.testing.assert_close(keys[:, :, :3], k)  # old keys untouched, never re-rotated
    assert rope_calls == []
    cache.end()
    cache.truncate(2)
    assert cache.seq_len == 2 and cache.begin(2).tolist() == [2, 3]
    cache.abort()
    cache.reset()
    assert cache.seq_len == 0 and cache.bytes_allocated() == 10 * per_token


def test_contiguous_errors():
    cache = ContiguousCache(CFG, max_len=4)
    with pytest.raises(ValueError, match="the cache holds at most 4 tokens: 0 cached . 5 new = 5"):
        cache.begin(5)
    cache.begin(2)
    with pytest.raises(RuntimeError, match="begin.. called twice"):
        cache.begin(1)
    with pytest.raises(ValueError, match=r"keys/values must have shape \(1, 2, 2, 8\)"):
        cache.update(0, torch.zeros(1, 6, 2, 8), torch.zeros(1, 6, 2, 8), lambda x, p: x)
    with pytest.raises(ValueError, match="max_len must be a positive integer"):
        ContiguousCache(CFG, max_len=0)
    with pytest.raises(ValueError, match="unknown cache kind 'pagd'; available kinds: .*contiguous"):
        kvcache.new_cache("pagd", CFG)
    model = tiny()
    cache = model.new_cache(max_len=8, batch_size=2)
    with pytest.raises(ValueError, match="batch size 1 but the cache was made for batch_size=2"):
        model(ids(3), cache=cache)


def test_model_new_cache_defaults_and_memory_formula():
    model = tiny()
    cache = model.new_cache()
    assert cache.max_len == 64 and cache.dtype == torch.float64
    assert cache.bytes_allocated() == 64 * CFG.kv_bytes_per_token(8)


def test_contiguous_reorder_copies_parent_rows_and_checks_them():
    from labkit.model import ModelConfig
    from labkit.kvcache import new_cache

    cfg = ModelConfig(d_model=8, n_layers=2, n_heads=2, vocab_size=10, ffn_dim=8)
    cache = new_cache("contiguous", cfg, max_len=6, batch_size=3)
    k = torch.arange(3.0).reshape(3, 1, 1, 1).expand(3, cfg.n_kv_heads, 2, cfg.head_dim).contiguous()
    cache.begin(2)
    for layer in range(2):
        cache.update(layer, k, k + 10, lambda x, positions: x)
    cache.end()
    cache.reorder([2, 2, 0, 1])
    assert cache.batch_size == 4 and cache.seq_len == 2
    for layer in range(2):
        assert cache.keys[layer, :, 0, 0, 0].tolist() == [2.0, 2.0, 0.0, 1.0]
        assert cache.values[layer, :, 0, 1, 0].tolist() == [12.0, 12.0, 10.0, 11.0]
    for bad, message in [([], "at least one"), ([4], r"\[0, 4\)"), ([-1], "got -1")]:
        with pytest.raises(ValueError, match=message):
            cache.reorder(bad)
    with pytest.raises(NotImplementedError, match="paged"):
        new_cache("paged", cfg, max_len=8, block_size=4).reorder([0])


@pytest.mark.parametrize("kind, opts", [("contiguous", {}), ("paged", {"block_size": 4}), ("quantized", {"bits": 8, "group_size": 4, "residual": 4}), ("sliding", {"window": 16})])
def test_rope_tables_are_gathered_once_per_pass_at_the_positions_begin_returned(kind, opts, monkeypatch):
    """The model rotates queries (and, for kinds that store rotated keys, the new keys) at `begin`'s positions
    tensor: RoPE's tables are gathered once per pass for every layer; a kind that rotates keys itself gets them raw."""
    from labkit.model.rope import Rotary

    model = tiny()
    cache = model.new_cache(kind, max_len=16, **opts)
    begun, gathered, raw_keys = [], [], []
    begin, at, update = type(cache).begin, Rotary.at, type(cache).update
    monkeypatch.setattr(type(cache), "begin", lambda self, n: begun.append(begin(self, n)) or begun[-1])
    monkeypatch.setattr(Rotary, "at", lambda self, p, dtype, token_major=False: gathered.append(p) or at(self, p, dtype, token_major))
    monkeypatch.setattr(type(cache), "update", lambda self, layer, k, v, rope: raw_keys.append(k) or update(self, layer, k, v, rope))
    x = ids(6)
    model(x[:, :3], cache=cache)
    model(x[:, 3:5], cache=cache)
    assert [p.tolist() for p in begun] == [[0, 1, 2], [3, 4]]
    model_gathers = [p for p in gathered if any(p is b for b in begun)]
    assert len(model_gathers) == 2 * model.config.n_layers and all(p is begun[i // model.config.n_layers] for i, p in enumerate(model_gathers))
    # the keys handed to the cache: rotated by the model exactly when the kind says so
    full = model.layers[0].attn.wqkv(model.layers[0].attn_norm(model.tok_embeddings(x[:, :3])))
    H, Hkv, D = model.config.n_heads, model.config.n_kv_heads, model.config.head_dim
    k_raw = full.view(1, 3, H + 2 * Hkv, D)[:, :, H:H + Hkv].transpose(1, 2)
    rotated = torch.allclose(raw_keys[0], model.rope(k_raw, torch.arange(3)), atol=1e-6)
    assert rotated == cache.rotate_new_keys and rotated != torch.allclose(raw_keys[0], k_raw, atol=1e-6)
