"""encode_iterable: chunk by chunk, the same ids as encoding the whole text, in bounded memory."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.tokenizer import get_tokenizer

TOK = get_tokenizer("shakespeare")  # GPT-4's pre-tokenizer, <|endoftext|> special
ALPHABET = st.sampled_from(["a", "b", "The", " ", "  ", "\n", "\n\n", "\t", "'s", "!", "1", "23", "é", "<|", "endoftext", "|>",
                            "<|endoftext|>", "\r\n"])


@settings(max_examples=1500, deadline=None)
@given(pieces=st.lists(ALPHABET, max_size=40), cuts=st.lists(st.integers(0, 200), max_size=8),
       allowed=st.sampled_from(["all", "none"]))
def test_any_chunking_gives_the_ids_of_the_whole_text(pieces, cuts, allowed):
    text = "".join(pieces)
    bounds = sorted({0, len(text), *[c % (len(text) + 1) for c in cuts]})
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    assert list(TOK.encode_iterable(chunks, allowed)) == TOK.encode(text, allowed)


def test_lines_of_a_play_and_the_tricky_boundary():
    from labkit.data import corpus

    text = corpus.load_text("val")[:200_000]
    assert list(TOK.encode_iterable(text.splitlines(keepends=True))) == TOK.encode(text)
    assert list(TOK.encode_iterable(["a\n", "\n", "\n", "b"])) == TOK.encode("a\n\n\nb")
    assert list(TOK.encode_iterable(["  1a"], "none")) == TOK.encode("  1a", "none")  # the one-character lookahead


def test_memory_stays_bounded_and_input_is_checked():
    from labkit.tokenizer import lazy

    seen = []
    real = lazy._stable

    def spy(tok, buf, specials):
        seen.append(len(buf))
        return real(tok, buf, specials)

    lazy._stable = spy
    try:
        lines = ["To be, or not to be, that is the question:\n"] * 2000
        assert sum(1 for _ in TOK.encode_iterable(lines)) == len(TOK.encode("".join(lines)))
    finally:
        lazy._stable = real
    assert max(seen) < 200  # a line and a few held-back pieces, not the whole text
    with pytest.raises(TypeError, match="chunks must be str, got bytes"):
        list(TOK.encode_iterable([b"abc"]))
