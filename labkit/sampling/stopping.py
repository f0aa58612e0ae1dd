"""When generation stops: EOS, a token budget, stop strings, the context window.

Stop strings are matched on the decoded text, not on token ids, because one stop string
may be split across several tokens ("\\n\\n" can be one token or two). As in vLLM, the
output is cut *before* the stop string. While streaming, the end of the text that could
still become a stop string is held back, and so is a trailing U+FFFD, which a byte-level
tokenizer produces while a multi-byte UTF-8 character is only partly generated.

    >>> s = StopStrings(["\\nUser:"])
    >>> s.find("Hi there!\\nUser: more")
    9
    >>> s.safe_len("Hi there!\\nUs")      # "\\nUs" may be the start of the stop string
    9
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

__all__ = ["StopStrings", "StoppingCriteria"]

REPLACEMENT_CHAR = "\ufffd"


class StopStrings:
    """A set of stop strings, matched on decoded text.

    `find(text)` -> index where the text must be cut (the earliest start of any stop string), or None.
    `safe_len(text)` -> how many characters of `text` can be shown now without ever being taken back.
    """

    def __init__(self, stops: Iterable[str] | str | None):
        if stops is None:
            stops = []
        if isinstance(stops, str):
            stops = [stops]
        if not isinstance(stops, (list, tuple, set, frozenset)):
            raise TypeError(f"stop must be a str, a list of str or None, got {type(stops).__name__} {stops!r} "
                            "(to stop on a token id, pass eos_id to labkit.decode)")
        stops = list(stops)
        for s in stops:
            if not isinstance(s, str):
                raise TypeError(f"stop strings must be str, got {type(s).__name__} {s!r} in stop={stops!r}")
            if s == "":
                raise ValueError("stop strings must be non-empty, got ''")
        self.stops = stops

    def __bool__(self) -> bool:
        return bool(self.stops)

    def __repr__(self) -> str:
        return f"StopStrings({self.stops!r})"

    def find(self, text: str, start: int = 0) -> int | None:
        """Index of the earliest stop string in `text[start:]` (as an index into `text`), or None.

        Pass `start` = the previous safe length minus the longest stop string to search only
        the new text while streaming.

        >>> StopStrings(["ab", "b"]).find("xxab")
        2
        """
        start = max(0, start)
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def cut(self, text: str) -> str:
        """`text` without the first stop string and everything after it.

        >>> StopStrings(["END"]).cut("one two END three")
        'one two '
        """
        i = self.find(text)
        return text if i is None else text[:i]

    def held_back(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string.

        >>> StopStrings(["</s>"]).held_back("hello </")
        2
        """
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def safe_len(self, text: str, hold_partial_utf8: bool = True) -> int:
        """How much of `text` is final: up to the stop string if there is one, else all but a
        suffix that may grow into a stop string (and, by default, a trailing run of U+FFFD).

        >>> StopStrings([]).safe_len("caf\\ufffd")
        3
        """
        i = self.find(text)
        if i is not None:
            return i
        n = len(text) - self.held_back(text)
        if hold_partial_utf8:
            while n > 0 and text[n - 1] == REPLACEMENT_CHAR:
                n -= 1
        return n


def _id_set(ids) -> frozenset:
    """None, one id (int, numpy or 0-d tensor) or several ids -> a frozenset of ints."""
    if ids is None:
        return frozenset()
    if isinstance(ids, (list, tuple, set, frozenset)) or getattr(ids, "ndim", 0) > 0:
        return frozenset(int(i) for i in ids)
    return frozenset([int(ids)])


@dataclass
class StoppingCriteria:
    """All the reasons to stop, checked after each new token.

    `check(token_id, n_new, total_len, text)` returns "eos", "stop", "length" (max_new_tokens
    reached), "context" (the context window is full) or None.
    The EOS token itself is not part of the output text; the generator drops it.

    >>> c = StoppingCriteria(eos_token_id=2, max_new_tokens=3, context_length=8)
    >>> c.check(2, 1, 5), c.check(7, 3, 5), c.check(7, 1, 8), c.check(7, 1, 5)
    ('eos', 'length', 'context', None)
    """

    eos_token_id: int | list[int] | None = None
    max_new_tokens: int | None = None
    context_length: int | None = None
    stop: StopStrings | list[str] | str | None = None
    eos_ids: frozenset = field(init=False, repr=False)

    def __post_init__(self):
        self.eos_ids = _id_set(self.eos_token_id)
        if self.max_new_tokens is not None and (not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0):
            raise ValueError(f"max_new_tokens must be an int >= 0, got {self.max_new_tokens!r}")
        if self.context_length is not None and (not isinstance(self.context_length, int) or self.context_length < 1):
            raise ValueError(f"context_length must be an int >= 1, got {self.context_length!r}")
        if not isinstance(self.stop, StopStrings):
            self.stop = StopStrings(self.stop)

    def check(self, token_id: int, n_new: int, total_len: int, text: str | None = None) -> str | None:
        """Why generation stops after `token_id` (the n_new-th new token; `total_len` tokens in
        the sequence including the prompt), or None to go on."""
        if int(token_id) in self.eos_ids:
            return "eos"
        if text is not None and self.stop and self.stop.find(text) is not None:
            return "stop"
        if self.max_new_tokens is not None and n_new >= self.max_new_tokens:
            return "length"
        if self.context_length is not None and total_len >= self.context_length:
            return "context"
        return None
