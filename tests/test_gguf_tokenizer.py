"""Reading the tokenizer from a GGUF file: the header parser against `gguf.GGUFReader`, SmolLM2's vocabulary, the chat template."""
import time

import numpy as np
import pytest

from labkit.data import paths
from labkit.tokenizer.chat_template import default_system_prompt
from labkit.tokenizer.gguf import read_metadata
from labkit.tokenizer import BPETokenizer
from labkit.tokenizer import from_gguf

gguf = pytest.importorskip("gguf")

TOKENS = ["<|endoftext|>", "<|im_start|>"] + [chr(c) for c in range(ord("a"), ord("e"))] + ["Ġ", "ab", "Ġab", "cd"]
MERGES = ["a b", "Ġ ab", "c d"]
TEMPLATE = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"


def _write_small_gguf(path, **overrides):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("test.u32", 7)
    w.add_float32("test.f32", 0.5)
    w.add_bool("test.bool", True)
    w.add_array("test.ints", [1, 2, 3])
    w.add_tokenizer_model(overrides.get("model", "gpt2"))
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(TOKENS)
    w.add_token_types([3, 3] + [1] * (len(TOKENS) - 2))
    w.add_token_merges(overrides.get("merges", MERGES))
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)
    w.add_chat_template(TEMPLATE)
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_header_parser_matches_gguf_reader(tmp_path):
    path = _write_small_gguf(tmp_path / "small.gguf")
    ours = read_metadata(path, prefixes=("",))
    reader = gguf.GGUFReader(str(path))
    theirs = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        mine = ours[key]
        assert (mine.tolist() if isinstance(mine, np.ndarray) else mine) == value, key


def test_small_file_tokenizer_from_path_and_reader(tmp_path):
    path = _write_small_gguf(tmp_path / "small.gguf")
    tok = from_gguf(path)
    assert tok.special_tokens == {"<|endoftext|>": 0, "<|im_start|>": 1} and (tok.bos_id, tok.eos_id) == (1, 0)
    assert tok.encode(" abcd<|im_start|>") == [8, 9, 1]
    assert tok.merges == [(2, 3), (6, 7), (4, 5)]
    same = from_gguf(gguf.GGUFReader(str(path)))
    assert same.ranks == tok.ranks and same.special_tokens == tok.special_tokens and same.chat_template == TEMPLATE


def test_bad_gguf_files_name_the_file(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="junk.gguf"):
        from_gguf(junk)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(_write_small_gguf(tmp_path / "whole.gguf").read_bytes()[:200])
    with pytest.raises(ValueError, match="cut.gguf"):
        from_gguf(cut)
    with pytest.raises(ValueError, match="unordered.gguf.*merge order"):
        from_gguf(_write_small_gguf(tmp_path / "unordered.gguf", merges=["c d", "a b", "Ġ ab"]))
    with pytest.raises(ValueError, match="rwkv.gguf.*'rwkv'; supported: 'gpt2' \\(byte-level BPE\\) and 'llama'"):
        from_gguf(_write_small_gguf(tmp_path / "rwkv.gguf", model="rwkv"))
    with pytest.raises(ValueError, match="llama.gguf.*add_space_prefix is true \\(or absent\\).*not the prefixed space"):
        from_gguf(_write_small_gguf(tmp_path / "llama.gguf", model="llama"))  # SentencePiece with a prefixed space
    with pytest.raises(FileNotFoundError, match="nowhere.gguf"):
        from_gguf(tmp_path / "nowhere.gguf")
    with pytest.raises(TypeError):
        from_gguf(42)


@pytest.fixture(scope="module")
def smol():
    return from_gguf(paths.smollm2_gguf_path())


def test_smollm2_vocabulary(smol):
    meta = read_metadata(paths.smollm2_gguf_path())
    assert smol.vocab_size == len(meta["tokenizer.ggml.tokens"]) == 49152
    assert len(smol.special_tokens) == int((meta["tokenizer.ggml.token_type"] == 3).sum()) == 17
    assert (smol.bos_id, smol.eos_id) == (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"])
    assert smol.id_to_token(smol.encode(" the")[0]) == "Ġthe"
    # Every merge's parts concatenate to the token it makes, which comes after both parts.
    for a, b in smol.merges[:2000]:
        made = smol.ranks[smol.token_bytes(a) + smol.token_bytes(b)]
        assert made > max(a, b)


def test_smollm2_loads_fast_and_is_cached():
    from labkit.tokenizer import gguf as gguf_tokenizer

    gguf_tokenizer._cache.clear()
    start = time.perf_counter()
    first = from_gguf(paths.smollm2_gguf_path())
    assert time.perf_counter() - start < 10  # generous: the budget is "well under a second or two", measured by bench
    assert from_gguf(str(paths.smollm2_gguf_path())) is first


def test_chat_template_matches_jinja(smol):
    jinja2 = pytest.importorskip("jinja2")
    template = jinja2.Environment().from_string(smol.chat_template)
    conversations = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
        [],
    ]
    for messages in conversations:
        for gen in (True, False):
            assert smol.apply_chat_template(messages, add_generation_prompt=gen) == template.render(
                messages=messages, add_generation_prompt=gen
            )
    assert default_system_prompt(smol.chat_template) == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_chat_template_errors(smol):
    with pytest.raises(ValueError, match="no chat template"):
        BPETokenizer.train("abc", 257).apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        smol.apply_chat_template([{"role": "user"}])
    with pytest.raises(TypeError):
        smol.apply_chat_template("hello")
