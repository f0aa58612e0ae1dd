"""Token-for-token parity: labkit's BPE against tiktoken (same ranks) and SmolLM2's against Hugging Face `tokenizers`.

The references are built in `labkit.tokenizer.reference`: tiktoken with labkit's
ranks, and a `tokenizers.Tokenizer` from SmolLM2's GGUF vocabulary and merges with
the pre-tokenizer SmolLM2 was trained with (every digit apart, then GPT-2's
byte-level regex).
"""
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.data import corpus
from labkit.data import paths
from labkit.tokenizer import BPETokenizer
from labkit.tokenizer import from_gguf
from labkit.tokenizer.reference import smollm2_reference, tiktoken_encoding

tiktoken = pytest.importorskip("tiktoken")
tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE_BPE = ROOT / "data" / "shakespeare-bpe-4k.json"

MIXED = (
    "The capital of France is Paris. 法国的首都是巴黎。\n"
    "大语言模型（LLM）的推理分为 Prefill 和 Decode 两个阶段，KV 缓存在 2024 年变得很重要。\n"
    "Tokenization costs: 1 token ≈ 4 English characters, but 1 汉字 ≈ 1-2 tokens! 😀👍🏽\r\n"
    "Numbers: 3.14159, 1,000,000 and 2026-11-29; unicode: naïve café, e\u0301, ﬁne, Ω, \u00a0nbsp, \u3000全角空格\n"
)

PIECES = st.sampled_from(
    ["\r\n", "\n\n", "  ", "   ", "\t", "123", "9876543", "😀", "👍🏽", "中文", "日本語", "é", "e\u0301", "'s",
     "'LL", " the", "\u200b", "\xa0", "½", "٣", "<|im_start|>", "\u2028"]
)
# Unassigned code points (Cn in this Python's Unicode database) are left out: the `regex` module and tiktoken
# carry newer, different Unicode tables and disagree on whether such a point is a letter (U+18D09 is Cn in
# Unicode 14, a letter to `regex`), which splits the text differently in the two references themselves.
UNICODE = st.lists(st.one_of(PIECES, st.text(st.characters(exclude_categories=("Cs", "Cn")), max_size=6)),
                   max_size=14).map("".join)


def _code_samples() -> list[str]:
    return [(ROOT / "labkit" / name).read_text(encoding="utf-8") for name in ("tokenizer/bpe.py", "tokenizer/train.py")]


@pytest.fixture(scope="module")
def shakespeare_tok():
    if SHAKESPEARE_BPE.is_file():
        return BPETokenizer.load(SHAKESPEARE_BPE)
    return BPETokenizer.train(corpus.load_text("train")[:300_000], 1024, special_tokens=["<|endoftext|>"])


@pytest.fixture(scope="module")
def gpt2_tok():
    return BPETokenizer.train(corpus.load_text("train")[:150_000], 600, pattern="gpt2")


@pytest.fixture(scope="module")
def smol():
    return from_gguf(paths.smollm2_gguf_path())


@pytest.fixture(scope="module")
def hf_smol():
    return smollm2_reference()


# ---------------------------------------------------------------- (a) labkit == tiktoken, same ranks
def test_tiktoken_parity_on_the_corpus(shakespeare_tok):
    enc = tiktoken_encoding(shakespeare_tok)
    for text in (corpus.load_text("val"), corpus.load_text("train")[:400_000]):
        ids = shakespeare_tok.encode(text, allowed_special="none")
        assert ids == enc.encode_ordinary(text)
        assert enc.decode_bytes(ids) == shakespeare_tok.decode_bytes(ids)


def test_tiktoken_parity_with_special_tokens(shakespeare_tok):
    enc = tiktoken_encoding(shakespeare_tok)
    text = "ROMEO:\nBut soft!<|endoftext|>JULIET:\nAy me!"
    assert shakespeare_tok.encode(text) == enc.encode(text, allowed_special="all")


@settings(max_examples=300, deadline=None)
@given(UNICODE)
def test_tiktoken_parity_on_any_unicode(shakespeare_tok, gpt2_tok, text):
    for tok in (shakespeare_tok, gpt2_tok):
        assert tok.encode(text, allowed_special="none") == _tiktoken_cached(tok).encode_ordinary(text)


_ENCODINGS = {}


def _tiktoken_cached(tok):
    if id(tok) not in _ENCODINGS:
        _ENCODINGS[id(tok)] = tiktoken_encoding(tok)
    return _ENCODINGS[id(tok)]


# ---------------------------------------------------------------- (b) SmolLM2 == tokenizers reference
def test_smollm2_parity_on_the_corpus(smol, hf_smol):
    text = corpus.load_text("val")[:150_000]
    assert smol.encode(text) == hf_smol.encode(text).ids


@pytest.mark.parametrize("kind", ["mixed", "code", "digits"])
def test_smollm2_parity_on_mixed_language_and_code(smol, hf_smol, kind):
    samples = {"mixed": [MIXED], "code": _code_samples(), "digits": ["\n\n2.", "x  1", "in 1999, a 12-34 ½ Ⅷ ٣"]}[kind]
    for text in samples:
        assert smol.encode(text) == hf_smol.encode(text).ids


def test_smollm2_digit_split_matters(smol):
    # GPT-2's regex alone would keep "\n\n" with nothing and "2." apart; SmolLM2 isolates each digit.
    ids = smol.encode("\n\n2024.")
    assert [smol.decode([i]) for i in ids] == ["\n\n", "2", "0", "2", "4", "."]


@settings(max_examples=200, deadline=None)
@given(UNICODE)
def test_smollm2_parity_on_any_unicode(smol, hf_smol, text):
    assert smol.encode(text) == hf_smol.encode(text).ids
    if all(bytes([b]) in smol.ranks for b in text.encode()):
        assert smol.decode(smol.encode(text)) == text


def test_smollm2_drops_bytes_it_has_no_token_for_like_the_reference(smol, hf_smol):
    missing = [b for b in range(256) if bytes([b]) not in smol.ranks]
    assert 0x04 in missing and 0xF1 in missing and len(missing) == 21
    for text in ("a\x04b", "x \U00040000!", "\x04"):
        assert smol.encode(text) == hf_smol.encode(text).ids
    assert smol.decode(smol.encode("a\x04b")) == "ab"


def test_smollm2_chat_prompt_uses_special_tokens(smol, hf_smol):
    prompt = smol.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    ids = smol.encode(prompt)
    assert ids[0] == smol.special_tokens["<|im_start|>"] == smol.bos_id and ids.count(smol.eos_id) == 2
    assert ids == hf_smol.encode(prompt).ids
    assert smol.decode(ids) == prompt
