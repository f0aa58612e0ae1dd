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


def _stable(tok, buf: str, specials: frozenset[str]) -> tuple[str, list[str], str]:
    """(head, pieces, rest): `head` ends with the last complete special token (encode it whole),
    `pieces` are the pre-tokenizer pieces after it that no later text can change, `rest` is held back."""
    start = 0  # the last ordinary part: the text after the last complete special token
    for s in specials:
        i = buf.rfind(s)
        if i >= 0:
            start = max(start, i + len(s))
    head, part = buf[:start], buf[start:]
    # More ordinary text may follow: then only the last two pieces can still change (the regex
    # looks one character ahead, and a run of spaces backs off before a word). Or a special
    # token may begin anywhere in the last characters (or right after them): the ordinary text
    # then ends there, which can change pieces further back. Keep what every case agrees on.
    spans = [_spans(tok, part)[:-2]]
    if specials:
        longest = max(len(s) for s in specials)
        spans += [_spans(tok, part[:end]) for end in range(max(0, len(part) - longest + 1), len(part) + 1)]
    common = []
    for same in zip(*spans):
        if any(s != same[0] for s in same):
            break
        common.append(same[0])
    cut = common[-1][1] if common else 0
    return head, [part[a:b] for a, b in common], part[cut:]


def _spans(tok, text: str) -> list[tuple[int, int]]:
    return [m.span() for m in tok._regex.finditer(text)]


def encode_iterable(tok, chunks: Iterable[str], allowed_special="all") -> Iterator[int]:
    """Yield the ids of the concatenated `chunks`, holding back only the text whose pieces may still change."""
    specials = tok._allowed(allowed_special, "")
    buf = ""
    for chunk in chunks:
        if not isinstance(chunk, str):
            raise TypeError(f"chunks must be str, got {type(chunk).__name__}")
        buf += chunk
        head, pieces, rest = _stable(tok, buf, specials)
        if head:
            yield from tok.encode(head, allowed_special)
        for piece in pieces:  # encoded as the pieces they are in the whole text, not re-split
            yield from tok.encode_piece(piece)
        buf = rest
    if buf:
        yield from tok.encode(buf, allowed_special)
