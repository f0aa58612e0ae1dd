"""Stopping: stop strings across token boundaries (cut before the stop string, never take
back streamed text), EOS, the token budget and the context window."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.sampling import StoppingCriteria, StopStrings


def stream(pieces: list[str], stops: StopStrings) -> tuple[str, int]:
    """Feed decoded pieces one by one, as a generator would; return the streamed text and
    how many pieces were consumed before stopping."""
    text, shown = "", 0
    out = []
    for n, piece in enumerate(pieces, start=1):
        text += piece
        safe = stops.safe_len(text)
        assert safe >= shown, "streamed text was taken back"
        out.append(text[shown:safe])
        shown = safe
        if stops.find(text) is not None:
            return "".join(out), n
    return "".join(out) + text[shown:], len(pieces)


def test_stop_string_spanning_three_tokens_is_cut_before_it():
    pieces = ["Sure", ", here", ".\n", "\nUs", "er", ": next", " question"]
    streamed, used = stream(pieces, StopStrings(["\n\nUser:"]))
    assert streamed == "Sure, here."
    assert used == 6  # stops on the token that completes the stop string, not later


def test_prefix_of_stop_string_is_held_back_then_released():
    s = StopStrings(["\n\nUser:"])
    assert s.safe_len("one\n\nUs") == 3
    assert s.safe_len("one\n\nUs and more") == len("one\n\nUs and more")


def test_earliest_of_overlapping_stop_strings_wins():
    s = StopStrings(["world!", "lo w"])
    assert s.find("hello world!") == 3
    assert s.cut("hello world!") == "hel"
    assert StopStrings(["aa"]).find("baaa") == 1


def test_stop_at_the_very_first_token_gives_empty_text():
    streamed, used = stream(["###", " title"], StopStrings(["###"]))
    assert (streamed, used) == ("", 1)


def test_incomplete_utf8_is_held_back():
    s = StopStrings([])
    assert s.safe_len("caf\ufffd") == 3
    assert s.safe_len("caf\ufffd\ufffd") == 3
    assert s.safe_len("café") == 4
    assert s.safe_len("caf\ufffd", hold_partial_utf8=False) == 4


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="ab\n:", max_size=30),
    stops=st.lists(st.text(alphabet="ab\n:", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 30), max_size=10),
)
def test_streaming_never_takes_back_and_ends_with_the_cut_text(text, stops, cuts):
    s = StopStrings(stops)
    bounds = sorted(set([0, len(text)] + [c for c in cuts if c <= len(text)]))
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    streamed, used = stream(pieces, s)
    consumed = "".join(pieces[:used])
    assert streamed == s.cut(consumed)  # what a non-streaming run that stopped at the same token returns
    if used < len(pieces):  # it stopped: the text before the last piece held no stop string
        assert s.find("".join(pieces[: used - 1])) is None
    else:
        assert streamed == s.cut(text)
    assert all(st_ not in streamed for st_ in stops)


def test_bad_stop_strings():
    with pytest.raises(ValueError, match="non-empty"):
        StopStrings(["ok", ""])
    with pytest.raises(TypeError, match="str"):
        StopStrings([3])
    assert StopStrings("END").stops == ["END"] and not StopStrings(None)


def test_stopping_criteria_reasons_in_order():
    c = StoppingCriteria(eos_token_id=[2, 7], max_new_tokens=4, context_length=10, stop=["\n\n"])
    assert c.check(7, 1, 5, "hi") == "eos"
    assert c.check(3, 1, 5, "hi\n\nthere") == "stop"
    assert c.check(3, 4, 5, "hi") == "length"
    assert c.check(3, 2, 10, "hi") == "context"
    assert c.check(3, 3, 9, "hi\n") is None
    assert StoppingCriteria().check(0, 10_000, 10_000) is None
    with pytest.raises(ValueError, match="max_new_tokens"):
        StoppingCriteria(max_new_tokens=-1)
    with pytest.raises(ValueError, match="context_length"):
        StoppingCriteria(context_length=0)
