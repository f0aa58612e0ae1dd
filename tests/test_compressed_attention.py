"""Compressed sparse attention (labkit.model.compressed) and its cache (labkit.kvcache.compressed)."""
import math

import pytest
import torch

from labkit.costmodel.longkv import gpt3_175b, layout_bytes, ratio_at, tokens_for_bytes
from labkit.model import ModelConfig, Transformer, attention_probs
from labkit.model.compressed import block_entries, index_scores, select_entries

CSA = dict(csa_block=4, csa_topk=3, csa_window=8, csa_index_heads=2, csa_index_dim=8)


def tiny(seed=0, **over):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=128,
                      **{**CSA, **over})
    model = Transformer(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.3)
    return model


@pytest.mark.parametrize("chunks", [[41], [1] * 41, [5, 7, 1, 1, 13, 2, 12], [4, 37], [39, 1, 1], [3, 38]])
@pytest.mark.parametrize("batch", [1, 2])
def test_the_cache_gives_the_logits_of_the_whole_sequence(chunks, batch):
    model = tiny()
    ids = torch.randint(0, 50, (batch, 41), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(max_len=64, batch_size=batch)
        got, i = [], 0
        for n in chunks:
            got.append(model(ids[:, i:i + n], cache=cache))
            i += n
    torch.testing.assert_close(torch.cat(got, 1), full, rtol=0, atol=1e-12)
    assert cache.seq_len == 41


def reference_layer_output(attn, x, rope):
    """The layer written out query by query: window, visible blocks, top-k by the index score, one softmax."""
    T, D, m, w = x.shape[0], attn.head_dim, attn.m, attn.window
    H, Hkv = attn.n_heads, attn.n_kv_heads
    pos = torch.arange(T)
    q, k, v = attn.wqkv(x).split(attn.split, -1)
    q = rope(q.view(T, H, D).transpose(0, 1)[None], pos)[0]  # [H, T, D]
    k = rope(k.view(T, Hkv, D).transpose(0, 1)[None], pos)[0]
    v = v.view(T, Hkv, D).transpose(0, 1)
    c, z = attn.w_compress(x).split(attn.kv_out, -1)
    ix = attn.w_index(x)
    ih, idim = attn.index_heads, attn.index_dim
    iq, iw, iu = ix[:, :ih * idim].view(T, ih, idim), ix[:, ih * idim:ih * idim + ih], ix[:, ih * idim + ih:]
    out = torch.zeros(T, H, D, dtype=x.dtype)
    for t in range(T):
        blocks = [j for j in range((t + 1) // m)]
        entries, scores = [], []
        for j in blocks:
            sl = slice(j * m, (j + 1) * m)
            wts = torch.softmax(z[sl] + attn.slot_bias, dim=0)
            e = (wts * c[sl]).sum(0).view(Hkv, D)
            key = torch.stack([rope(e[h][None, None, None], torch.tensor([(j + 1) * m - 1]))[0, 0, 0] for h in range(Hkv)])
            entries.append((key, e))
            ik = iu[sl].mean(0)
            scores.append(sum(float(iw[t, h]) * max(0.0, float(iq[t, h] @ ik)) for h in range(ih)))
        order = sorted(range(len(blocks)), key=lambda j: (-scores[j], j))[:attn.topk]
        for h in range(H):
            g = h // (H // Hkv)
            keys = [k[g, s] for s in range(max(0, t - w + 1), t + 1)] + [entries[j][0][g] for j in order]
            vals = [v[g, s] for s in range(max(0, t - w + 1), t + 1)] + [entries[j][1][g] for j in order]
            logits = torch.stack([q[h, t] @ key for key in keys]) / math.sqrt(D)
            out[t, h] = (torch.softmax(logits, 0)[:, None] * torch.stack(vals)).sum(0)
    return attn.wo(out.reshape(T, H * D))


def test_a_layer_matches_the_rule_written_out_query_by_query():
    model = tiny(seed=3)
    x = torch.randn(30, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    attn = model.layers[0].attn
    with torch.no_grad():
        got = attn(x, model.rope, torch.arange(30))
        want = reference_layer_output(attn, x, model.rope)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_no_query_sees_a_later_token():
    model = tiny(seed=7)
    ids = torch.randint(0, 50, (1, 40), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        base = model(ids)
        for t in (3, 7, 10, 20, 33):
            changed = ids.clone()
            changed[0, t + 1:] = (changed[0, t + 1:] + 1) % 50
            out = model(changed)
            assert torch.equal(out[:, :t + 1], base[:, :t + 1]) and not torch.equal(out[:, t + 1:], base[:, t + 1:])


def test_block_entries_index_scores_and_selection_by_hand():
    c = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])  # B=1, 2 rows (one block of m=2), kv_out = 2
    z = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])
    u = torch.tensor([[[2.0], [4.0]]])
    rows = torch.cat([c, z, u], -1)  # [1, 2, 5]
    entry, ikey = block_entries(rows, torch.zeros(2, 2), m=2, kv_out=2)
    torch.testing.assert_close(entry, torch.tensor([[[2.0, 0.75 * 2 + 0.25 * 4]]]))  # channel 0: 1/2 each; 1: 3/4, 1/4
    torch.testing.assert_close(ikey, torch.tensor([[[3.0]]]))
    iq = torch.tensor([[[[1.0], [-1.0]]]])  # one query, two index heads of width 1
    iw = torch.tensor([[[2.0, 5.0]]])
    keys = torch.tensor([[[3.0], [-1.0]]])
    torch.testing.assert_close(index_scores(iq, iw, keys), torch.tensor([[[6.0, 5.0]]]))  # 2·relu(3) ; 5·relu(1)
    scores = torch.tensor([[[1.0, 7.0, 7.0, 9.0], [1.0, 7.0, 7.0, 9.0]]])
    visible = torch.tensor([[True, True, True, False], [True, True, True, True]])
    top, chosen = select_entries(scores, visible[None], 2)
    assert chosen[0, 0].tolist() == [False, True, True, False]  # entry 3 is not visible yet
    assert chosen[0, 1].tolist() == [False, True, False, True]  # 9, then the first of the tied 7s


def test_bytes_the_cache_holds_and_the_target_share_at_1024_tokens():
    model = tiny()
    cache = model.new_cache(max_len=64)
    assert cache.kind == "compressed" and cache.capacities() == (7, 16, 3)
    c = model.config
    kv, row = c.n_kv_heads * c.head_dim, 2 * c.n_kv_heads * c.head_dim + c.csa_index_dim
    per_layer = 7 * 2 * kv + 16 * (kv + c.csa_index_dim) + 3 * row
    assert cache.bytes_allocated() == c.n_layers * per_layer * 8  # float64
    with torch.no_grad():
        model(torch.randint(0, 50, (1, 10)), cache=cache)
    assert cache.bytes_used() == c.n_layers * (7 * 2 * kv + 2 * (kv + c.csa_index_dim) + 2 * row) * 8
    csa, dense = ModelConfig.from_name("shakespeare-csa"), ModelConfig.from_name("shakespeare")
    share = (Transformer(csa).new_cache(max_len=1024).bytes_allocated()
             / Transformer(dense.replace(max_seq_len=1024)).new_cache(max_len=1024).bytes_allocated())
    assert share <= 0.25


def test_parameters_counted_and_matched_to_the_dense_target():
    for cfg in (tiny().config, ModelConfig.from_name("shakespeare-csa")):
        assert cfg.n_params() == sum(p.numel() for p in Transformer(cfg).parameters())
    dense, csa = ModelConfig.from_name("shakespeare"), ModelConfig.from_name("shakespeare-csa")
    assert abs(csa.n_params() / dense.n_params() - 1) < 0.01


def test_the_indexer_learns_alone_and_the_main_loss_does_not_reach_it():
    model = tiny().train()
    ids = torch.randint(0, 50, (2, 40))
    logits = model(ids)
    aux = model.auxiliary_loss()
    assert aux is not None and float(aux.detach()) > 0
    aux.backward(retain_graph=True)
    attn = model.layers[0].attn
    assert attn.w_index.weight.grad.abs().sum() > 0
    untouched = lambda p: p.grad is None or not p.grad.any()  # noqa: E731
    assert all(untouched(p) for n, p in model.named_parameters() if "w_index" not in n)
    model.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(logits.reshape(-1, 50), ids.reshape(-1)).backward()
    assert all(untouched(b.attn.w_index.weight) for b in model.layers) and attn.w_compress.weight.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        model(ids)
    assert model.auxiliary_loss() is None  # an inference forward leaves no loss behind
    model.train()
    model(ids[:, :3])  # fewer tokens than a block: no entry yet, so no loss
    assert model.auxiliary_loss() is None
    dense = Transformer(ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, ffn_dim=64)).train()
    dense(ids)
    assert dense.auxiliary_loss() is None


def test_what_it_refuses():
    model = tiny()
    with pytest.raises(ValueError, match="only its own cache"):
        model.new_cache("sliding", window=16)
    with pytest.raises(ValueError, match="batch_invariant"):
        model.batch_invariant = True
    with pytest.raises(ValueError, match="compressed attention"):
        attention_probs(model, torch.tensor([[1, 2, 3]]), 0)
    cache = model.new_cache(max_len=32)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4, 5]]), cache=cache)
        with pytest.raises(ValueError, match="every layer"):
            model(torch.tensor([[6]]), cache=cache, n_layers=1)
        assert cache.seq_len == 5
        with pytest.raises(ValueError, match="at most 32"):
            model(torch.randint(0, 50, (1, 28)), cache=cache)
    dense = Transformer(ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, ffn_dim=64))
    with pytest.raises(ValueError, match="dense"):
        dense.new_cache("compressed")
    with pytest.raises(ValueError, match="no fixed bytes per token"):
        model.config.kv_bytes_per_token(2)
    with pytest.raises(ValueError, match="csa_window must be at least csa_block and 2"):
        ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, ffn_dim=64, **{**CSA, "csa_block": 1, "csa_window": 1})
    from labkit.quant.apply import quantize_model
    from labkit.serving.studies.parallel import shard
    from labkit.speculative import PromptLookup, generate as speculative_generate

    with pytest.raises(ValueError, match="compressed-attention model takes method='rtn' only"):
        quantize_model(model.float(), method="awq", bits=4, calib=torch.randint(0, 50, (1, 16)))
    with pytest.raises(ValueError, match="tensor parallelism"):
        shard(model, 0, 1)

    class Tok:
        eos_id = None

    with pytest.raises(ValueError, match="rolls back rejected tokens"):
        speculative_generate(model, PromptLookup(), Tok(), [1, 2, 3, 1, 2], max_new_tokens=4, chat=False)
    with pytest.raises(ValueError, match="all of csa_block"):
        ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, ffn_dim=64, csa_block=4)
    with pytest.raises(ValueError, match="csa_window must be at least csa_block"):
        ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, ffn_dim=64, **{**CSA, "csa_window": 2})
    with pytest.raises(ValueError, match="csa_topk"):
        ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, ffn_dim=64, **{**CSA, "csa_topk": -1})


def test_generate_runs_on_its_own_cache_and_equals_recomputing():
    import labkit

    model = tiny(seed=5)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    state = labkit.prefill(model, prompt)  # the default kind, 'contiguous', gives the model its own cache
    assert state.cache.kind == "compressed"
    out = labkit.decode(model, state, 20)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(20):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert out == ids[len(prompt):]


def test_a_quick_training_run_saves_and_loads_back(tmp_path):
    from labkit.model.checkpoint import load_model
    from labkit.train.run import train_model, val_metrics
    from labkit.train.batches import encode_split
    from labkit.data import corpus
    from labkit.tokenizer.named import get_tokenizer

    record = train_model("shakespeare-csa", quick=True, out_dir=tmp_path, progress=False)
    assert record["model"] == "shakespeare-csa-quick" and record["curve"][0]["index_kl"] > 0
    model, header = load_model(tmp_path / "shakespeare-csa-quick.safetensors")
    assert model.config.compressed_attention and header["record"]["val_loss"] == record["val_loss"]
    tok = get_tokenizer("shakespeare")
    again = val_metrics(model, tok, encode_split(tok, corpus.load_text("val")), 64, 8)
    assert again["val_loss"] == pytest.approx(record["val_loss"], rel=1e-6)


def test_the_seeds_numbers_from_published_shapes():
    gpt3 = gpt3_175b()
    assert gpt3.kv_bytes_per_token(2) == 2 * 96 * 12288 * 2
    assert round(tokens_for_bytes(gpt3, 32e9)) == 6782
    assert ratio_at("deepseek-v4-pro", "deepseek-v3.2", 2**20) == pytest.approx(0.105, abs=0.001)
    assert ratio_at("deepseek-v4-flash", "deepseek-v3.2", 2**20) == pytest.approx(0.073, abs=0.001)
    assert layout_bytes("deepseek-v3.2", 1000) == 61 * 1000 * (656 + 132)
    assert layout_bytes("deepseek-v4-pro", 100) == 61 * 100 * 584 + 30 * 25 * (584 + 68) + 0  # 100 < one HCA block
    with pytest.raises(ValueError, match="unknown layout"):
        layout_bytes("deepseek-v5", 10)
    with pytest.raises(ValueError, match="budget_bytes"):
        tokens_for_bytes(gpt3, 0)
