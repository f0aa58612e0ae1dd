"""K-quants (Q4_K, Q5_K, Q6_K): labkit decodes every super-block exactly as the `gguf` package does, and its
own min–max quantizer writes blocks that `gguf` decodes to the same floats, within the error its steps allow."""
import numpy as np
import pytest
import torch

from labkit.quant import ggml, kquants

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants as gq  # noqa: E402

KTYPES = list(kquants.LAYOUT)


def _same_floats(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def random_superblocks(qtype: str, n: int, seed: int) -> np.ndarray:
    """Random bytes with finite fp16 scales (of very different sizes): every code and packed scale pattern."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, kquants.LAYOUT[qtype][1]), dtype=np.uint8)
    scales = (rng.standard_normal((n, 2)) * 10.0 ** rng.integers(-4, 3, (n, 2))).astype(np.float16)
    if qtype == "Q6_K":
        raw[:, 208:210] = scales[:, :1].view(np.uint8)
    else:
        raw[:, 0:4] = np.abs(scales).view(np.uint8)
    return raw


@pytest.mark.parametrize("qtype", KTYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_superblock_decodes_like_gguf(qtype, seed):
    raw = random_superblocks(qtype, 200, seed)
    assert _same_floats(kquants.dequantize(raw, qtype), gq.dequantize(raw, T[qtype]).reshape(200, 256))
    assert _same_floats(ggml.dequantize(raw, qtype), kquants.dequantize(raw, qtype))  # the front door hands over


@pytest.mark.parametrize("qtype", KTYPES)
def test_the_quantizer_writes_blocks_gguf_reads_the_same_way(qtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 512)) * rng.uniform(1e-3, 30, (6, 1))).astype(np.float32)
    x[0, :256] = 0  # an all-zero super-block
    x[1, :256] = 2.5  # constant and positive: the min is clamped to 0
    x[2, :256] = -np.abs(x[2, :256])  # all negative
    q = ggml.quantize(x, qtype)
    assert q.shape == (6, 2 * kquants.LAYOUT[qtype][1]) and q.dtype == np.uint8
    mine = ggml.dequantize(q, qtype, x.shape)
    assert _same_floats(mine, gq.dequantize(q, T[qtype]).reshape(x.shape))
    assert ggml.agrees_with_gguf(x, qtype)
    assert np.all(mine[0, :256] == 0)
    assert np.allclose(mine[1, :256], 2.5, rtol=0.02)


# RMS error on N(0, 1) weights: a uniform step s costs s / √12; the expected step is the sub-block's range
# (about 4.1σ over 32 normal draws; Q6_K: twice its largest magnitude over 16, about 3.5σ) over its levels.
STEP = {"Q4_K": 4.1 / 15, "Q5_K": 4.1 / 31, "Q6_K": 3.5 / 63}


@pytest.mark.parametrize("qtype", KTYPES)
def test_the_error_is_what_the_steps_allow(qtype):
    x = np.random.default_rng(4).standard_normal((64, 256)).astype(np.float32)
    y = ggml.dequantize(ggml.quantize(x, qtype), qtype, x.shape)
    rms = float(np.sqrt(np.mean((x - y) ** 2)))
    assert rms < 1.3 * STEP[qtype] / np.sqrt(12), rms  # 1.3: the scales themselves are rounded (6 or 8 bits, fp16)
    assert np.abs(x - y).max() < 1.5 * STEP[qtype] * 2  # no weight off by more than a few steps: no clipping bug


def test_bits_per_weight_and_sizes():
    assert [ggml.bits_per_weight(t) for t in KTYPES] == [4.5, 5.5, 6.5625]
    assert ggml.nbytes("Q6_K", 2048 * 640) == 2048 * 640 // 256 * 210
    with pytest.raises(ValueError, match="blocks of 256"):
        ggml.nbytes("Q4_K", 640)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="multiple of 256; got shape \\(640,\\)"):
        kquants.quantize(np.zeros(640, np.float32), "Q4_K")
    with pytest.raises(ValueError, match="NaN or inf"):
        kquants.quantize(np.full(256, np.nan, np.float32), "Q6_K")
    with pytest.raises(ValueError, match="not a whole number"):
        kquants.dequantize(np.zeros(145, np.uint8), "Q4_K")
    with pytest.raises(ValueError, match="qtype must be one of"):
        kquants.quantize(np.zeros(256, np.float32), "Q3_K")


def test_every_tensor_of_the_gemma3_file_decodes_like_gguf():
    """The file people download: Q8_0, Q5_0, Q4_K and Q6_K mixed per layer (plus F32 norms), every tensor."""
    from labkit.data.paths import gemma3_gguf_path

    try:
        path = gemma3_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    seen = {}
    for t in gguf.GGUFReader(path).tensors:
        kind = t.tensor_type.name
        seen[kind] = seen.get(kind, 0) + 1
        mine = ggml.dequantize(t.data, kind)
        theirs = gq.dequantize(t.data, t.tensor_type)
        assert _same_floats(mine.reshape(theirs.shape), theirs), t.name
    assert set(seen) == {"F32", "Q8_0", "Q5_0", "Q4_K", "Q6_K"}, seen


def test_the_format_table_adds_up_to_the_file():
    from labkit.data.paths import gemma3_gguf_path
    from labkit.model.gguf import format_table, open_gguf

    try:
        reader = open_gguf(gemma3_gguf_path())
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    rows = format_table(reader)
    assert sum(r["bytes"] for r in rows) == sum(int(t.data.nbytes) for t in reader.tensors)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    by_type = {r["type"]: r for r in rows}
    assert by_type["Q4_K"]["bits_per_weight"] == 4.5 and by_type["Q5_0"]["bits_per_weight"] == 5.5
    assert rows[0]["type"] == "Q8_0"  # the tied embedding dominates the file


@pytest.mark.parametrize("fmt", ["Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K"])
def test_a_block_linear_in_each_ggml_format_multiplies_the_formats_numbers(fmt):
    """The layer's weight is the format's dequantized blocks (labkit's decoder, itself checked against `gguf`),
    its product is x @ Wᵀ with that weight, and nbytes() is what the blocks store."""
    from labkit.quant import ggml
    from labkit.quant.blocklinear import BlockLinear

    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(24, 512, generator=g), torch.randn(3, 512, generator=g)
    layer = BlockLinear(w, fmt)
    blocks = ggml.quantize(w.numpy(), fmt)
    assert torch.equal(layer.weight, torch.from_numpy(ggml.dequantize(blocks, fmt, (24, 512))))
    assert layer.nbytes() == blocks.size == ggml.nbytes(fmt, w.numel())
    assert torch.allclose(layer(x), x @ layer.weight.t(), atol=1e-5)
    assert 0 < (layer.weight - w).norm() / w.norm() < 0.1  # rounded, and not far


def test_rows_a_k_quant_cannot_cut_fall_back_as_asked_or_are_refused():
    """Rows of 640 do not cut into super-blocks of 256: the layer refuses them, and `quantize_model` puts them in
    the fallback format (llama.cpp's Q4_K → Q5_0 rule) while the rows that fit keep the K-quant."""
    from labkit.quant import model_nbytes, quantize_model
    from labkit.quant.blocklinear import BlockLinear
    from tests.kvcache_shared import tiny

    with pytest.raises(ValueError, match="blocks of 256 weights; this matrix's rows hold 640.*fallback"):
        BlockLinear(torch.randn(8, 640), "Q4_K")
    model = tiny(d_model=128, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=256).requires_grad_(False)
    q = quantize_model(model, fmt="Q4_K", fallback="Q5_0", include_head=False)
    fmts = {name: m.fmt for name, m in q.named_modules() if isinstance(m, BlockLinear)}
    assert fmts and all(f == ("Q4_K" if name.endswith("w_down") else "Q5_0") for name, f in fmts.items())
    assert q.quantization["fell_back"] == len(fmts) - model.config.n_layers
    assert model_nbytes(q) < model_nbytes(model) / 4
    with pytest.raises(ValueError, match="blocks of 256"):
        quantize_model(model, fmt="Q4_K")
    with pytest.raises(ValueError, match="fallback='Q5_0'.*needs fmt"):
        quantize_model(model, bits=4, fallback="Q5_0")
    with pytest.raises(ValueError, match="fmt must be one of"):
        quantize_model(model, fmt="Q4_K", fallback="Q3_K")
