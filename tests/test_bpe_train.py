"""BPE training: the incremental trainer makes exactly the naive trainer's merges, and the merges are sound."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.tokenizer import train as bpe_train
from labkit.tokenizer.train import best_pair, count_pieces, get_stats, merge, train_incremental, train_naive
from labkit.tokenizer.pretokenize import split
from labkit.tokenizer import BPETokenizer

# Small alphabets make many ties and long repeats: the cases where trainers disagree.
CORPUS = st.lists(
    st.one_of(st.sampled_from(["a", "b", "ab", "aaa", " ", "  ", "\n", "x1", "12", "é", "😀", "'s"]), st.text("abc d", max_size=8)),
    max_size=40,
).map("".join)


def test_get_stats_and_merge_examples():
    assert get_stats([1, 2, 3, 1, 2]) == {(1, 2): 2, (2, 3): 1, (3, 1): 1}
    assert merge([1, 2, 3, 1, 2], (1, 2), 4) == [4, 3, 4]
    assert merge([5, 5, 5, 5, 5], (5, 5), 6) == [6, 6, 5]  # left to right, no overlaps


def test_tie_break_is_count_then_smallest_pair():
    assert best_pair({(5, 1): 3, (2, 9): 3, (2, 7): 3, (0, 0): 2}) == (2, 7)


def test_wikipedia_example():
    # "aaabdaaabac": aa (256), then ab would tie with 256a; the rule picks (97, 98) < (256, 97).
    tok = BPETokenizer.train("aaabdaaabac", 256 + 3, pattern=r".+")
    assert [tok.token_bytes(256 + i) for i in range(3)] == [b"aa", b"ab", b"aaab"]
    assert tok.encode("aaabdaaabac") == [258, 100, 258, 97, 99]


@settings(max_examples=120, deadline=None)
@given(CORPUS, st.integers(0, 40), st.sampled_from(["gpt2", "gpt4", "smollm2"]))
def test_incremental_equals_naive(text, n_merges, pattern):
    naive = train_naive([p.encode() for p in split(pattern, text)], n_merges)
    fast = train_incremental(count_pieces(text, pattern), n_merges)
    assert fast == naive


def test_incremental_equals_naive_on_real_text():
    text = (
        "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n"
        "And all the clouds that lour'd upon our house\nIn the deep bosom of the ocean buried.\n"
    ) * 3
    naive = BPETokenizer.train(text, 256 + 80, method="naive")
    fast = BPETokenizer.train(text, 256 + 80)
    assert fast.merges == naive.merges and len(fast.merges) == 80


@settings(max_examples=60, deadline=None)
@given(CORPUS)
def test_merges_are_sound(text):
    tok = BPETokenizer.train(text, 256 + 30, pattern="gpt2")
    for i, (a, b) in enumerate(tok.merges):
        assert max(a, b) < 256 + i  # built from tokens that already exist
        assert tok.token_bytes(256 + i) == tok.token_bytes(a) + tok.token_bytes(b)
    assert sorted(tok.ranks.values()) == list(range(len(tok.ranks)))  # ids dense, bytes unique here


def test_one_repeated_character_builds_the_doubling_chain():
    tok = BPETokenizer.train("a" * 64, 256 + 6, pattern=r".+")
    assert [tok.token_bytes(i) for i in range(256, 262)] == [b"a" * 2**k for k in range(1, 7)]
    assert tok.encode("a" * 64) == [261]


def test_training_stops_when_no_pair_is_left():
    tok = BPETokenizer.train("ab", 1000, special_tokens=["<s>"], pattern=r".+")
    assert len(tok.merges) == 1 and tok.vocab_size == 258 and tok.special_tokens == {"<s>": 257}


def test_special_token_text_is_never_merged():
    tok = BPETokenizer.train("<s>hi<s>hi<s>" * 10, 256 + 20, special_tokens=["<s>"], pattern=r".+")
    assert all(b"<s>" not in tok.token_bytes(256 + i) for i in range(len(tok.merges)))


def test_progress_callback_sees_every_merge():
    seen = []
    BPETokenizer.train("abcabcabd" * 5, 256 + 4, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size must be at least 256 \\+ 1 special tokens = 257, got 256"):
        BPETokenizer.train("abc", 256, special_tokens=["<|endoftext|>"])
    with pytest.raises(ValueError, match="at least"):
        BPETokenizer.train("abc", 100)
    with pytest.raises(TypeError, match="text must be a str"):
        BPETokenizer.train(["abc"], 300)
    with pytest.raises(TypeError, match="vocab_size must be an int"):
        BPETokenizer.train("abc", 300.0)
    with pytest.raises(ValueError, match="method"):
        BPETokenizer.train("abc", 300, method="fastest")
    with pytest.raises(ValueError, match="eos_token"):
        BPETokenizer.train("abc", 300, eos_token="<|endoftext|>")
    assert bpe_train.count_pieces("a a a", "gpt2") == {b"a": 1, b" a": 2}
