"""Chapter 04's compression figures (labkit.viz.kvcompression) and the dense-vs-compressed comparison (labkit.train.compare)."""
import pytest
import torch

from labkit.model import ModelConfig, Transformer
from labkit.viz.kvcompression import compressed_attention_figure, compression_figure, itl_position_figure

ROWS = [dict(name="full", fraction=1.0, settable=True, ppl=20.0, ppl_tail=21.0, passkey=1.0),
        dict(name="sliding", fraction=0.25, settable=True, ppl=23.5, ppl_tail=26.0, passkey=0.0),
        dict(name="int4", fraction=0.19, settable=False, ppl=20.4, ppl_tail=21.5, passkey=0.8)]


def test_compression_figure_shows_each_kinds_numbers():
    fig = compression_figure({"rows": ROWS, "fraction": 0.25, "length": 4096, "trials": 5})
    ppl, key = fig.data
    assert list(ppl.x) == ["full", "sliding", "int4*"] and list(ppl.y) == [21.0, 26.0, 21.5]  # the tail's, as printed
    assert list(key.y) == [1.0, 0.0, 0.8] and "25%" in fig.layout.title.text and "4,096" in fig.layout.title.text


def test_itl_and_compressed_attention_figures():
    rows = [dict(name=n, position=p, itl_s=t) for n, p, t in
            [("full", 1024, 0.030), ("full", 4096, 0.042), ("snapkv", 4096, 0.031), ("snapkv", 1024, 0.030)]]
    fig = itl_position_figure(rows)
    assert [list(t.x) for t in fig.data] == [[1024, 4096], [1024, 4096]] and list(fig.data[0].y) == [30.0, 42.0]
    out = {"kv": [dict(name="dense", n_tokens=1024, bytes_per_token=8192, share=1.0),
                  dict(name="csa", n_tokens=1024, bytes_per_token=1800, share=0.22)],
           "decode": [dict(name="dense", position=256, itl_s=0.002, stretched=False),
                      dict(name="dense", position=4096, itl_s=0.004, stretched=True)]}
    fig = compressed_attention_figure(out)
    assert list(fig.data[0].y) == [8192, 1800] and list(fig.data[1].marker.symbol) == ["circle", "circle-open"]


def test_compare_models_counts_bytes_and_times_past_the_window():
    from labkit.tokenizer.named import get_tokenizer
    from labkit.train.compare import compare_models, kv_bytes_at, stretched

    torch.manual_seed(0)
    base = dict(vocab_size=4096, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
    dense = Transformer(ModelConfig(**base)).eval()
    csa = Transformer(ModelConfig(**{**base, "max_seq_len": 128}, csa_block=4, csa_topk=2, csa_window=8,
                                  csa_index_heads=2, csa_index_dim=8)).eval()
    assert kv_bytes_at(dense, 100) == 2 * 2 * 2 * 8 * 100 * 4  # K and V, 2 layers, 2 KV heads of 8, float32
    out = compare_models({"dense": dense, "csa": csa}, get_tokenizer("shakespeare"), contexts=[64, 128],
                         positions=[32, 100], steps=2, kv_tokens=128)
    assert {(r["name"], r["context"]) for r in out["quality"]} == {("dense", 64), ("csa", 64), ("csa", 128)}
    assert out["kv"][0]["share"] == 1 and out["kv"][1]["share"] < 1
    assert [(r["name"], r["position"], r["stretched"]) for r in out["decode"]] == [
        ("dense", 32, False), ("dense", 100, True), ("csa", 32, False), ("csa", 100, False)]
    longer = stretched(dense, 256)
    ids = torch.randint(0, 4096, (1, 20))
    with torch.no_grad():
        assert torch.equal(longer(ids), dense(ids)) and longer.config.max_seq_len == 256
    with pytest.raises(ValueError, match="n_tokens"):
        kv_bytes_at(dense, 0)
    assert compare_models({"dense": dense}, get_tokenizer("shakespeare"), contexts=[64], positions=[])["decode"] == []
    from labkit.train.compare import decode_cost
    with pytest.raises(ValueError, match="positions"):
        decode_cost({"dense": dense}, [])
