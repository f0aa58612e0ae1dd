"""The BPE tokenizer: byte map, pre-tokenizers, the rank rule, specials, streaming, files, bad input."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.tokenizer import encode as bpe_encode
from labkit.tokenizer import pretokenize
from labkit.tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN, bytes_to_token, bytes_to_unicode, split, token_to_bytes
from labkit.tokenizer import BPETokenizer

SAMPLE = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n"
) * 20


@pytest.fixture(scope="module")
def tok():
    return BPETokenizer.train(SAMPLE, 256 + 60 + 2, special_tokens=["<|endoftext|>", "<|pad|>"], eos_token="<|endoftext|>")


# Unicode that stresses byte-level BPE: multi-byte characters, combining marks,
# CRLF, runs of spaces and digits, contractions.
PIECES = st.sampled_from(
    ["\r\n", "\n\n", "  ", "   ", "\t", "123", "9876543", "😀", "👍🏽", "🇫🇷", "中文", "日本語", "é", "e\u0301",
     "'s", "'LL", "don't", " the", "Speak", "\u200b", "\xa0", "ﬁ", "Ω"]
)
UNICODE = st.lists(st.one_of(PIECES, st.text(st.characters(exclude_categories=("Cs",)), max_size=5)), max_size=12).map("".join)


def test_byte_map_is_a_bijection_with_gpt2_values():
    m = bytes_to_unicode()
    assert sorted(m) == list(range(256)) and len(set(m.values())) == 256
    assert (m[32], m[10], m[9], m[0], m[127], m[173]) == ("Ġ", "Ċ", "ĉ", "Ā", "ġ", "Ń")
    assert all(m[b] == chr(b) for b in range(33, 127))
    assert all(token_to_bytes(bytes_to_token(bytes([b]))) == bytes([b]) for b in range(256))


@pytest.mark.parametrize(
    "text, gpt2, gpt4",
    [
        ("I'M here, it's 12345 dollars!!\n\n",
         ["I", "'", "M", " here", ",", " it", "'s", " 12345", " dollars", "!!", "\n\n"],
         ["I", "'M", " here", ",", " it", "'s", " ", "123", "45", " dollars", "!!\n\n"]),
        ("a   b", ["a", "  ", " b"], ["a", "  ", " b"]),
        ("$hello  \tworld  ", ["$", "hello", "  ", "\t", "world", "  "], ["$hello", "  ", "\tworld", "  "]),
        ("don't DON'T", ["don", "'t", " DON", "'", "T"], ["don", "'t", " DON", "'T"]),
        ("x\n\n  y", ["x", "\n\n ", " y"], ["x", "\n\n", " ", " y"]),
    ],
)
def test_pre_tokenizer_vectors(text, gpt2, gpt4):
    assert split(GPT2_PATTERN, text) == gpt2
    assert split(GPT4_PATTERN, text) == gpt4


def test_smollm2_pattern_isolates_every_digit_and_treats_it_as_a_boundary():
    assert split("smollm2", "in 1999, x  2") == ["in", " ", "1", "9", "9", "9", ",", " x", "  ", "2"]
    assert split("smollm2", "\n\n2.") == ["\n\n", "2", "."]


@settings(max_examples=150, deadline=None)
@given(UNICODE)
def test_pieces_cover_the_text(text):
    for name in ("gpt2", "gpt4", "smollm2"):
        assert "".join(split(name, text)) == text


def test_rank_rule_differs_from_pair_rule_on_a_hand_made_table():
    ranks = {bytes([b]): b for b in range(256)} | {b"bc": 256, b"ab": 257, b"abc": 258}
    merges = {(b"b", b"c"): 0, (b"a", b"b"): 1, (b"ab", b"c"): 2}
    assert bpe_encode.encode_piece(b"abc", ranks) == [258]  # a + bc -> abc: the concatenation is a token
    assert bpe_encode.encode_piece_pairs(b"abc", ranks, merges) == [97, 256]  # (a, bc) is not in the merge list


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=600))
def test_heap_and_scan_merging_agree(tok, data):
    # Long pieces use the heap; both must give the same tokens on every input.
    assert bpe_encode._merge_heap(data, tok.ranks) == bpe_encode._merge_scan(data, tok.ranks)


def test_long_runs_encode_quickly_and_round_trip(tok):
    text = " " * 20000 + "a" * 20000
    assert tok.decode(tok.encode(text)) == text


@settings(max_examples=200, deadline=None)
@given(UNICODE)
def test_decode_inverts_encode(tok, text):
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode_bytes(tok.encode(text, allowed_special="none")) == text.encode("utf-8")


def test_special_tokens(tok):
    eot = tok.special_tokens["<|endoftext|>"]
    assert tok.eos_id == eot and tok.bos_id is None and tok.vocab_size == 318
    assert tok.encode("Speak<|endoftext|>") == tok.encode("Speak") + [eot]
    assert tok.decode(tok.encode("Speak<|endoftext|>"), skip_special_tokens=True) == "Speak"
    plain = tok.encode("<|endoftext|>", allowed_special="none")
    assert eot not in plain and tok.decode(plain) == "<|endoftext|>"
    assert tok.encode("<|pad|><|endoftext|>", allowed_special={"<|pad|>"})[0] == tok.special_tokens["<|pad|>"]
    with pytest.raises(ValueError, match="endoftext"):
        tok.encode("a<|endoftext|>", allowed_special="none_raise")
    with pytest.raises(ValueError, match="not special tokens"):
        tok.encode("a", allowed_special={"<|nope|>"})


def test_encode_uses_the_cache_and_gives_the_same_ids(tok):
    first = tok.encode(SAMPLE)
    assert tok._cache and tok.encode(SAMPLE) == first
    tok._cache.clear()
    assert tok.encode(SAMPLE) == first


def test_stream_decoder_holds_back_partial_characters(tok):
    text = "Speak 😀 中文 e\u0301!"
    ids = tok.encode(text)
    dec = tok.stream_decoder()
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)  # never a broken character on the way
    # Byte tokens of the emoji: nothing comes out until its fourth byte arrives.
    emoji = [tok.ranks[bytes([b])] for b in "😀".encode()]
    dec = tok.stream_decoder()
    assert [dec.push(i) for i in emoji] == ["", "", "", "😀"]
    dec.push(emoji[0])
    assert dec.flush() == "\ufffd"  # an unfinished character at the end of the stream


def test_save_and_load_round_trip(tok, tmp_path):
    path = tmp_path / "tok.json"
    tok.save(path)
    back = BPETokenizer.load(path)
    assert back.ranks == tok.ranks and back.merges == tok.merges and back.special_tokens == tok.special_tokens
    assert back.eos_id == tok.eos_id and back.pattern == tok.pattern
    assert back.encode(SAMPLE + "<|endoftext|>") == tok.encode(SAMPLE + "<|endoftext|>")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["tokens"][32] == "Ġ" and data["merges"][0].count(" ") == 1


@pytest.mark.parametrize(
    "damage",
    [
        lambda s: s[: len(s) // 2],  # truncated
        lambda s: s.replace('"labkit-bpe"', '"something-else"'),
        lambda s: s.replace('"Ġ"', '" "', 1),  # a character outside the byte alphabet
        lambda s: json.dumps({**json.loads(s), "merges": ["x y"]}),
    ],
)
def test_corrupt_file_names_the_file(tok, tmp_path, damage):
    path = tmp_path / "broken.json"
    tok.save(path)
    path.write_text(damage(path.read_text(encoding="utf-8")), encoding="utf-8")
    with pytest.raises(ValueError, match="broken.json"):
        BPETokenizer.load(path)


def test_bad_input(tok):
    with pytest.raises(TypeError, match="text must be a str"):
        tok.encode(b"bytes")
    with pytest.raises(TypeError):
        tok.encode(None)
    with pytest.raises(ValueError, match=r"unknown token ids \[-1, 999\]"):
        tok.decode([5, 999, -1])
    with pytest.raises(TypeError):
        tok.decode([1.5])
    with pytest.raises(ValueError, match="surrogate"):
        tok.encode("a\ud800b")
    with pytest.raises(FileNotFoundError, match="missing.json"):
        BPETokenizer.load("missing.json")


def test_decode_accepts_arrays(tok):
    np = pytest.importorskip("numpy")
    ids = tok.encode("Speak, speak.")
    assert tok.decode(np.array(ids)) == "Speak, speak."
