"""Encode a large text lazily, chunk by chunk (e.g. the lines of a file), in bounded memory.

The ids equal `tok.encode(whole_text)`. The difficulty is the chunk boundaries: the
pre-tokenizer's last pieces can still grow or change when more text arrives (a run of
newlines, a space before a word: "a\\n\\n\\nb" is split differently than "a\\n" then
"\\n\\nb"), and a special token can be cut in half. So a chunk is only encoded up to a
point that no later text can move: the start of the second-to-last pre-tokenizer piece of
the text after the last special token, and never within the last characters that could
still begin a special token. The regex restarts its scan at the end of each match and
looks neither behind nor more than one character ahead, so the pieces after that point
are the same as in the whole text.

    >>> list(encode_iterable(tok, ["a\\n", "\\n", "\\nb"])) == tok.encode("a\\n\\n\\nb")   # doctest: +SKIP
    True
"""
from __future__ import annotations

from typing import Iterable, Iterator

__all__ = ["encode_iterable"]


def _safe_cut(tok, buf: str, specials: frozenset[str]) -> int:
    start = 0  # the last ordinary part: the text after the last complete special token
    for s in specials:
        i = buf.rfind(s)
        if i >= 0:
            start = max(start, i + len(s))
    part = buf[start:]
    longest = max((len(s) for s in specials), default=1)
    starts = [m.start() for m in tok._regex.finditer(part)]
    if len(starts) < 3:
        return start
    limit = min(starts[-2], len(part) - longest + 1)  # stable pieces only, and no half special token
    cut = max((s for s in starts if s <= limit), default=0)
    return start + cut


def encode_iterable(tok, chunks: Iterable[str], allowed_special="all") -> Iterator[int]:
    """Yield the ids of the concatenated `chunks`, holding back only the text whose pieces may still change."""
    specials = tok._allowed(allowed_special, "")
    buf = ""
    for chunk in chunks:
        if not isinstance(chunk, str):
            raise TypeError(f"chunks must be str, got {type(chunk).__name__}")
        buf += chunk
        cut = _safe_cut(tok, buf, specials)
        if cut:
            yield from tok.encode(buf[:cut], allowed_special)
            buf = buf[cut:]
    if buf:
        yield from tok.encode(buf, allowed_special)
