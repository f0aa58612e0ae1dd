"""Chapter 06's pure functions: one layer's trade-off, the sweep's names and rows, the figures, the profile."""
import pytest
import torch

from labkit.generation import profile
from labkit.quant import sweep
from labkit.quant.tradeoff import layer_tradeoff
from labkit.viz import quant as qviz
from tests.kvcache_shared import ids, tiny


def _layer(seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(48, 128, generator=g)
    w[:, 7] *= 15  # an outlier column
    x = torch.randn(400, 128, generator=g) @ torch.randn(128, 128, generator=g) * 0.3
    x[:, 3] *= 8  # a salient input channel
    return w, x


def test_tradeoff_orders_methods_bits_and_groups_as_the_papers_say():
    w, x = _layer()
    err = {(m, b, g): layer_tradeoff(w, x, b, g, m)["output_error"]
           for m in ("rtn", "gptq", "awq") for b in (8, 4, 3) for g in (32, "channel")}
    for b in (8, 4, 3):
        for g in (32, "channel"):
            assert err[("gptq", b, g)] < err[("rtn", b, g)]
            assert err[("awq", b, g)] <= err[("rtn", b, g)] * (1 + 1e-6)  # alpha = 0 is in the grid
        assert err[("rtn", b, 32)] < err[("rtn", b, "channel")]
    assert err[("rtn", 8, 32)] < err[("rtn", 4, 32)] < err[("rtn", 3, 32)]


def test_tradeoff_memory_and_predicted_speed_follow_bits_per_weight():
    w, x = _layer()
    r = layer_tradeoff(w, x, 4, 32, "rtn", n_weights=1e9, bandwidth_gb_s=20.0)
    assert r["bits_per_weight"] == 5.0  # 4 + (fp16 scale + fp16 minimum) / 32
    assert r["memory_bytes"] == pytest.approx(1e9 * 5 / 8)
    assert r["predicted_tokens_per_s"] == pytest.approx(20e9 / (1e9 * 5 / 8))
    with pytest.raises(ValueError, match=r"method must be one of \('rtn', 'gptq', 'awq'\), got 'hqq'"):
        layer_tradeoff(w, x, 4, 32, "hqq")
    with pytest.raises(ValueError, match=r"x must hold inputs \[..., 128\]"):
        layer_tradeoff(w, x[:, :64], 4, 32)


def test_sweep_names_and_rows():
    assert sweep.variant_name("awq", 4, 64) == "int4 AWQ g64"
    assert sweep.variant_name("rtn", 3, "channel") == "int3 RTN per-channel"
    model = tiny().requires_grad_(False)
    x = ids(80)[0].tolist()
    calib = torch.randint(0, model.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(3))
    variants = {sweep.variant_name(*v): (lambda v=v: sweep.quantize_variant(model, *v, calib=calib))
                for v in [("rtn", 8, "channel"), ("rtn", 3, "channel"), ("gptq", 3, "channel")]}
    seen = []
    rows = sweep.quality_rows(model, variants, x, window=32, stride=16, on_row=seen.append)
    assert [r["name"] for r in rows] == ["float32", *variants] and seen == rows
    by = {r["name"]: r for r in rows}
    assert by["float32"]["kl"] == pytest.approx(0, abs=1e-7) and by["float32"]["vs_float32_bytes"] == 1.0
    assert by["int8 RTN per-channel"]["kl"] < by["int3 RTN per-channel"]["kl"]
    assert by["int3 GPTQ per-channel"]["kl"] < by["int3 RTN per-channel"]["kl"]
    assert by["int3 RTN per-channel"]["vs_float32_bytes"] < by["int8 RTN per-channel"]["vs_float32_bytes"] < 0.3
    with pytest.raises(ValueError, match=r"bits must be one of \(8, 4, 3\)"):
        sweep.quantize_variant(model, "rtn", 5, 32)


def test_figures_carry_the_rows():
    w, x = _layer()
    rows = [layer_tradeoff(w, x, 4, 32, m, n_weights=1e8, bandwidth_gb_s=20) for m in ("rtn", "gptq", "awq")]
    fig = qviz.tradeoff_figure(rows)
    assert list(fig.data[1].x) == ["RTN", "GPTQ", "AWQ"] and "5.00 bits per weight" in fig.layout.title.text.replace("<br>", " ")
    with pytest.raises(ValueError, match="one \\(bits, group_size\\)"):
        qviz.tradeoff_figure(rows + [layer_tradeoff(w, x, 3, 32)])
    quality = [{"name": "float32", "vs_float32_bytes": 1.0, "kl": 0.0, "ppl_change": 0.0, "top1": 1.0},
               {"name": "int4 RTN g32", "vs_float32_bytes": 0.16, "kl": 0.05, "ppl_change": 0.04, "top1": 0.9},
               {"name": "int4 GPTQ g32", "vs_float32_bytes": 0.16, "kl": 0.03, "ppl_change": 0.02, "top1": 0.95}]
    fig = qviz.quality_figure(quality, "t")
    assert [t.name for t in fig.data] == ["RTN", "GPTQ", "groups of 32"] and fig.data[0].x[0] == pytest.approx(5.12)
    assert fig.data[0].text == ("",) and fig.data[0].hovertext == ("int4 RTN g32",)  # too close to GPTQ's point
    assert fig.data[0].marker.symbol == ("diamond",)
    apart = qviz.quality_figure(quality[:2] + [{**quality[2], "kl": 0.0001}], "t")
    assert apart.data[0].text == ("int4 g32",) and apart.data[1].text == ("int4 g32",)
    with pytest.raises(ValueError, match="metric must be one of"):
        qviz.quality_figure(quality, "t", metric="bleu")
    speed = qviz.speed_figure([{"name": "a", "bytes_per_token": 1, "predicted_tokens_per_s": 100.0, "tokens_per_s": 50.0}], "t")
    assert speed.data[1].text[0] == "50%"
    alpha = qviz.awq_alpha_figure({0.0: 2.0, 0.5: 1.0, 1.0: 3.0})
    assert alpha.data[1].x[0] == 0.5 and "the error is 50% of RTN's" in alpha.layout.title.text.replace("<br>", " ")


def test_step_profile_splits_the_step_and_decode_rates_measure_each_model():
    model = tiny().requires_grad_(False)
    p = profile.step_profile(model, ids(12)[0].tolist(), steps=3)
    assert p["step_ms"] > 0 and p["matmul_ms"] > 0 and p["other_ms"] > 0 and p["ops_per_step"] > 10
    assert p["top"] and all(t["op"].startswith("aten::") for t in p["top"])
    rates = profile.decode_rates({"a": model, "b": model}, ids(8)[0].tolist(), n=3, rounds=1)
    assert set(rates) == {"a", "b"} and all(r > 0 for r in rates.values())
    # tokens per second, not n times that: 8 tokens a round give about the rate 1 token a round gives (it was 8x)
    one, eight = (profile.decode_rates({"a": model}, ids(8)[0].tolist(), n=n, rounds=3)["a"] for n in (1, 8))
    assert eight / one < 3
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        profile.step_profile(model, [1, 2], steps=0)
