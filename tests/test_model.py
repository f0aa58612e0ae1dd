"""The transformer on tiny random configs: cache == no cache, GQA, RoPE layouts, presets, bad input."""
import pytest
import torch

from labkit.model.gguf import to_half_layout
from labkit.model import ModelConfig, Transformer, attention_probs

TINY = dict(vocab_size=97, d_model=48, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=64, max_seq_len=64)


def tiny(seed=0, **changes) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**{**TINY, **changes})).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def ids(T, seed=1, vocab=97):
    return torch.randint(0, vocab, (1, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_cached_forward_equals_full_forward(layout):
    model = tiny(rope_layout=layout)
    x = ids(20)
    full = model(x)
    cache = model.new_cache(max_len=24)
    pieces = [model(x[:, :7], cache=cache)]  # prefill
    pieces += [model(x[:, t:t + 1], cache=cache) for t in range(7, 12)]  # decode steps
    pieces.append(model(x[:, 12:], cache=cache))  # a chunk on top of a filled cache
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-10, rtol=0)
    assert cache.seq_len == 20
    torch.testing.assert_close(model(x, last_only=True), full[:, -1:], atol=1e-12, rtol=0)


def test_batch_rows_are_independent():
    model = tiny()
    x = torch.cat([ids(9, seed=1), ids(9, seed=2)])
    both = model(x)
    torch.testing.assert_close(both[1:], model(x[1:]), atol=1e-10, rtol=0)
    cache = model.new_cache(max_len=9, batch_size=2)
    steps = torch.cat([model(x[:, :5], cache=cache)] + [model(x[:, t:t + 1], cache=cache) for t in range(5, 9)], 1)
    torch.testing.assert_close(steps, both, atol=1e-10, rtol=0)


def test_gqa_equals_mha_with_kv_heads_copied_consecutively():
    """Query head h reads KV head h // g; copying each KV head g times (repeat_interleave) gives an MHA model."""
    gqa = tiny(n_kv_heads=2)
    mha = tiny(n_kv_heads=6)
    hd, g = 8, 3
    state = gqa.state_dict()
    for i in range(2):
        q, k, v = state[f"layers.{i}.attn.wqkv.weight"].split([48, 16, 16])
        k6 = k.view(2, hd, 48).repeat_interleave(g, 0).reshape(48, 48)
        v6 = v.view(2, hd, 48).repeat_interleave(g, 0).reshape(48, 48)
        state[f"layers.{i}.attn.wqkv.weight"] = torch.cat([q, k6, v6])
    mha.load_state_dict(state)
    x = ids(10)
    torch.testing.assert_close(mha(x), gqa(x), atol=1e-10, rtol=0)
    # the wrong grouping (head h reads KV head h % n_kv) is a different model
    for i in range(2):
        q, k, v = gqa.state_dict()[f"layers.{i}.attn.wqkv.weight"].split([48, 16, 16])
        k6 = k.view(2, hd, 48).repeat(g, 1, 1).reshape(48, 48)
        v6 = v.view(2, hd, 48).repeat(g, 1, 1).reshape(48, 48)
        state[f"layers.{i}.attn.wqkv.weight"] = torch.cat([q, k6, v6])
    mha.load_state_dict(state)
    assert (mha(x) - gqa(x)).abs().max() > 1e-3


def test_rope_layout_must_match_the_weights():
    """GGUF-layout weights + interleaved RoPE == permuted weights + half RoPE; mixing them is not."""
    inter = tiny(rope_layout="interleaved")
    half = tiny(rope_layout="half")
    half.load_state_dict(to_half_layout(dict(inter.state_dict()), inter.config))
    x = ids(12)
    torch.testing.assert_close(half(x), inter(x), atol=1e-10, rtol=0)
    wrong = tiny(rope_layout="half")
    wrong.load_state_dict(inter.state_dict())  # same weights, other rotation
    assert (wrong(x) - inter(x)).abs().max() > 1e-2


def test_tied_and_untied_heads_and_param_count():
    tied, untied = tiny(tie_embeddings=True), tiny(tie_embeddings=False)
    assert tied.output_weight() is tied.tok_embeddings.weight
    for m in (tied, untied):
        assert sum(p.numel() for p in m.parameters()) == m.config.n_params()
    assert untied.config.n_params() - tied.config.n_params() == 97 * 48


def test_attention_probs_match_the_forward():
    model = tiny()
    x = ids(8)
    p = attention_probs(model, x, layer=1)  # [n_heads, T, T]
    assert p.shape == (6, 8, 8)
    torch.testing.assert_close(p.sum(-1), torch.ones(6, 8), atol=1e-6, rtol=0)
    assert torch.all(p.triu(diagonal=1) == 0)  # causal


def test_presets():
    assert ModelConfig.from_name("llama-2-13b").kv_bytes_per_token(2) == 819200  # 0.82 MB/token
    assert ModelConfig.from_name("llama-2-7b").n_params() == 6_738_415_616
    assert ModelConfig.from_name("llama-3-8b").n_params() == 8_030_261_248
    smol = ModelConfig.from_name("smollm2-135m")
    assert (smol.n_layers, smol.d_model, smol.n_heads, smol.n_kv_heads, smol.head_dim) == (30, 576, 9, 3, 64)
    assert smol.n_params() == 134_515_008
    assert smol.flops_per_token(0) == 2 * smol.matmul_params() + 4 * 30 * 9 * 64
    with pytest.raises(ValueError, match="unknown model preset 'gpt-5'.*llama-2-13b"):
        ModelConfig.from_name("gpt-5")


@pytest.mark.parametrize("changes, message", [
    (dict(n_heads=9, n_kv_heads=4), "n_heads must be a multiple of n_kv_heads, got 9 and 4"),
    (dict(d_model=50, n_heads=6), "d_model must be a multiple of n_heads"),
    (dict(head_dim=7), "head_dim must be an even integer"),
    (dict(rope_layout="neox"), "rope_layout must be one of"),
    (dict(n_layers=0), "n_layers must be a positive integer, got 0"),
    (dict(norm_eps=0.0), "norm_eps must be > 0"),
])
def test_config_checks(changes, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{**TINY, **changes})


def test_bad_input_names_the_numbers():
    model = tiny()
    with pytest.raises(ValueError, match=r"token id 97 is outside the vocabulary \[0, 97\)"):
        model(torch.tensor([[1, 97]]))
    with pytest.raises(ValueError, match=r"token id -1 is outside"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match="sequence of 65 tokens is longer than the context window of 64 tokens"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(TypeError, match="integer torch.Tensor"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"shape \[B, T\]"):
        model(torch.zeros(3, dtype=torch.long))
    small = model.new_cache(max_len=16)
    model(torch.zeros(1, 12, dtype=torch.long), cache=small)
    with pytest.raises(ValueError, match="the cache holds at most 16 tokens: 12 cached . 5 new = 17"):
        model(torch.zeros(1, 5, dtype=torch.long), cache=small)
    cache = model.new_cache(max_len=80)  # larger than the context: the model's own check fires
    model(torch.zeros(1, 60, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="sequence of 65 tokens is longer than the context window of 64"):
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
    assert cache.seq_len == 60  # the failed pass left the cache as it was
    model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
    assert cache.seq_len == 64


def test_thread_split_matvec_equals_linear(monkeypatch):
    from labkit.model import kernels as M

    g = torch.Generator().manual_seed(3)
    w = torch.randn(96, 40, generator=g, dtype=torch.float64).t().contiguous().t()  # column-major [out, in]
    x = torch.randn(1, 1, 40, generator=g, dtype=torch.float64)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    split = M.linear(x, w, split=True)
    assert split.shape == (1, 1, 96)
    torch.testing.assert_close(split, torch.nn.functional.linear(x, w), atol=1e-12, rtol=0)
    few = torch.randn(2, 5, 40, generator=g, dtype=torch.float64)  # a few tokens (a verification pass) split too
    torch.testing.assert_close(M.linear(few, w, split=True), torch.nn.functional.linear(few, w), atol=1e-12, rtol=0)
    many = torch.randn(1, M.SPLIT_MAX_TOKENS + 1, 40, generator=g, dtype=torch.float64)  # more: F.linear itself
    torch.testing.assert_close(M.linear(many, w, split=True), torch.nn.functional.linear(many, w), atol=0, rtol=0)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)  # 40 % 3: falls back to F.linear
    torch.testing.assert_close(M.linear(x, w, split=True), torch.nn.functional.linear(x, w), atol=0, rtol=0)
    model = tiny().column_major_()
    with pytest.raises(TypeError, match="split_matvec"):
        model.split_matvec = 1
    model.split_matvec = True  # a model setting: every Linear of the model takes the split
    assert all(m.split for m in model.modules() if isinstance(m, M.Linear))
    assert all(m.weight.t().is_contiguous() for m in model.modules() if isinstance(m, torch.nn.Linear))
    ids_ = ids(6)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    cache = model.new_cache(max_len=6)
    steps = torch.cat([model(ids_[:, :3], cache=cache)] + [model(ids_[:, t:t + 1], cache=cache) for t in range(3, 6)], 1)
    torch.testing.assert_close(steps, model(ids_), atol=1e-10, rtol=0)


def test_one_token_rms_norm_equals_the_general_kernel():
    from labkit.model import RMSNorm

    norm = RMSNorm(576, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(576, generator=torch.Generator().manual_seed(5)))
    x = torch.randn(1, 1, 576, generator=torch.Generator().manual_seed(6)) * 3
    expected = torch.nn.functional.rms_norm(x, (576,), norm.weight, 1e-5)
    torch.testing.assert_close(norm(x), expected, atol=2e-6, rtol=1e-6)
    rows = torch.cat([x, 2 * x], dim=1)  # two tokens take the general kernel; row 0 must agree
    torch.testing.assert_close(norm(rows)[:, :1], norm(x), atol=2e-6, rtol=1e-6)
