"""The SentencePiece-style tokenizer: score-based merges with byte fallback, by hand on a tiny vocabulary, and
every id equal to llama.cpp's on Gemma 3's 262,144 pieces (the reference ids are a committed fixture)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.tokenizer.spm import BYTE, CONTROL, NORMAL, USER_DEFINED, SentencePieceTokenizer

FIXTURE = Path(__file__).parent / "fixtures" / "gemma3_llama_cpp.json"


def tiny() -> SentencePieceTokenizer:
    pieces = ["<pad>", "<bos>", "<eos>", "\n\n", "<tag>", "▁", "a", "b", "c", "ab", "bc", "▁a", "abc"]
    scores = [0, 0, 0, 0, 0, -5, -6, -6, -6, -3, -3, -4, -1]
    types = [CONTROL, CONTROL, CONTROL, USER_DEFINED, CONTROL] + [NORMAL] * 8
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    return SentencePieceTokenizer(pieces, scores + [0] * 256, types + [BYTE] * 256, bos_id=1, eos_id=2)


def test_the_highest_score_merges_first_and_ties_go_left():
    tok = tiny()
    # 'a b c': ab (-3) and bc (-3) tie, the left one merges; then 'ab'+'c' = 'abc' (-1)
    assert tok.encode("abc", add_bos=False) == [12]
    # '▁ a b': 'ab' (-3) outscores '▁a' (-4) and merges; '▁ab' is no piece, so '▁' stays alone
    assert tok.encode(" ab", add_bos=False) == [5, 9]
    assert tok.encode("bcb", add_bos=False) == [10, 7]


def test_what_no_piece_covers_falls_back_to_bytes_and_decodes_back():
    tok = tiny()
    ids = tok.encode("aé", add_bos=False)
    assert ids == [6, 13 + 0xC3, 13 + 0xA9]
    assert tok.decode(ids) == "aé"
    assert tok.decode_bytes(tok.encode(b"a\xff", add_bos=False)) == b"a\xff"


def test_user_defined_pieces_are_cut_out_first_control_pieces_only_when_asked():
    tok = tiny()
    assert tok.encode("a\n\nb") == [1, 6, 3, 7]
    assert tok.encode("b<tag>", add_bos=False) == [7] + [13 + c for c in b"<t"] + [6] + [13 + c for c in b"g>"]
    assert tok.encode("b<tag>", add_bos=False, parse_special=True) == [7, 4]
    assert tok.decode([1, 6, 4, 2]) == "a" and tok.decode([1, 6], special=True) == "<bos>a"


def test_bad_input():
    tok = tiny()
    with pytest.raises(TypeError, match="text must be a str or bytes, got int"):
        tok.encode(3)
    with pytest.raises(ValueError, match="token_id must be an integer in \\[0, 268\\], got 999"):
        tok.decode([999])
    with pytest.raises(ValueError, match="one entry per token"):
        SentencePieceTokenizer(["a"], [0, 1], [1])


@pytest.fixture(scope="module")
def gemma_tok():
    from labkit.data.paths import gemma3_gguf_path
    from labkit.tokenizer.gguf import from_gguf

    try:
        path = gemma3_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return from_gguf(path)


def test_every_id_equals_llama_cpp_on_the_corpus(gemma_tok):
    ref = json.loads(FIXTURE.read_text())
    assert len(ref["tokens"]) >= 30
    for row in ref["tokens"]:
        data = bytes.fromhex(row["text_hex"])
        assert gemma_tok.encode(data) == row["ids"], data[:60]


def test_gemma_vocabulary_as_read_from_the_file(gemma_tok):
    assert gemma_tok.vocab_size == 262_144 and gemma_tok.bos_id == 2 and gemma_tok.eos_id == 1
    text = "Hello  world\n\n漢字 😀"
    assert gemma_tok.decode(gemma_tok.encode(text)) == text


def test_the_module_doctests_hold():
    import doctest

    import labkit.tokenizer.spm as spm

    assert doctest.testmod(spm).failed == 0


def _same_calls(tok, text: str) -> dict:
    """The calls the rest of labkit makes on a tokenizer, each checked against the others on the same tokenizer."""
    ids = tok.encode(text, allowed_special="none")
    assert tok.encode_ordinary(text) == ids
    assert tok.decode(ids, skip_special_tokens=True).endswith(text)
    assert tok.decode_bytes(ids) == b"".join(tok.token_bytes(i) for i in ids)
    dec = tok.stream_decoder()
    assert "".join(dec.push(i) for i in ids) + dec.flush() == tok.decode(ids, skip_special_tokens=True)
    assert all(isinstance(tok.id_to_token(i), str) for i in ids)
    assert not any(tok.is_special(i) for i in ids if i != tok.bos_id)  # typed control text stays text
    assert tok.eos_id is not None and tok.is_special(tok.eos_id) and 0 < tok.vocab_size
    return {"ids": ids}


def test_both_tokenizers_answer_the_same_calls(gemma_tok):
    from labkit.data.paths import smollm2_gguf_path
    from labkit.tokenizer.gguf import from_gguf

    smol = from_gguf(smollm2_gguf_path())
    text = "Héllo, wörld 🙂 <start_of_turn> <|im_start|>"
    for tok in (smol, gemma_tok):
        _same_calls(tok, text)
    # typed control text stays text unless asked for: the same rule, spelled the same way
    assert gemma_tok.encode("<start_of_turn>", allowed_special="none") != gemma_tok.encode("<start_of_turn>",
                                                                                            allowed_special="all")
    assert gemma_tok.encode("<start_of_turn>", allowed_special=["<start_of_turn>"], add_bos=False) == \
        [gemma_tok.pieces.index("<start_of_turn>")]
    with pytest.raises(ValueError, match="not control pieces"):
        gemma_tok.encode("x", allowed_special=["nope"])
    with pytest.raises(ValueError, match="no chat template"):
        gemma_tok.encode_chat([{"role": "user", "content": "hi"}])
    assert gemma_tok.chat_template is None and smol.chat_template is not None


def test_word_by_word_encoding_is_the_whole_fragments_merging(gemma_tok):
    """On Gemma's vocabulary one piece holds a ▁ after another character (`>▁</`, a bridge), so the tokenizer merges
    a fragment word by word (from its cache) unless the bridge occurs in it: the same ids as merging each fragment
    whole, on held-out text, mixed scripts, runs of spaces, a typed ▁, the bridge and invalid UTF-8 (whole)."""
    from labkit.data import corpus
    from labkit.tokenizer.spm import SentencePieceTokenizer

    assert gemma_tok._by_word and [b.decode() for b in gemma_tok._bridges] == [">▁</"]
    whole = SentencePieceTokenizer(gemma_tok.pieces, gemma_tok.scores, gemma_tok.types, bos_id=gemma_tok.bos_id,
                                   eos_id=gemma_tok.eos_id)
    whole._by_word = False
    texts = [corpus.load_text("val")[:20_000], "  Hello   world\t\tfoo  ▁bar▁▁baz  漢字 😀 x  ", "a\u2581\u2581b c",
             b"ab \xf0\x9f\x98 cd \xe2\x96 ef", "½ €5 — naïve café", "<b>x</b> <i>y</i>\n<td> </td>"]
    for text in texts:
        assert gemma_tok.encode(text) == whole.encode(text)
        assert gemma_tok.encode(text) == gemma_tok.encode(text)  # served again from the cache: the same


def test_a_vocabulary_with_a_space_inside_a_piece_merges_fragments_whole():
    """A piece `a▁b` could merge across a word's start: a fragment holding it is merged whole (cut into words,
    `a` and `▁b` would never meet)."""
    from labkit.tokenizer.spm import SentencePieceTokenizer

    pieces = ["<unk>", "<s>", "</s>", "▁", "a", "b", "a▁", "a▁b"]
    tok = SentencePieceTokenizer(pieces, [0, 0, 0, -1, -2, -2, -1.5, -1], [2, 3, 3, 1, 1, 1, 1, 1], bos_id=1, eos_id=2)
    assert [b.decode() for b in tok._bridges] == ["a▁", "a▁b"]
    assert tok.encode("a b", add_bos=False) == [7] and tok.encode("b b", add_bos=False) == [5, 3, 5]
