"""Parsing the regex subset of `labkit.sampling.regex_dfa` into a small tree.

Nodes: ("lit", text), ("set", ascii_bytes, also_non_ascii), ("cat", [nodes]), ("alt", [nodes]),
("rep", node, min, max or None). Anything outside the subset raises ValueError naming it.

    >>> parse("a|b*")
    ('alt', [('cat', [('lit', 'a')]), ('cat', [('rep', ('lit', 'b'), 0, None)])])
"""
from __future__ import annotations

__all__ = ["parse"]

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
_CLASSES = {"d": set(range(48, 58)), "w": set(range(48, 58)) | set(range(65, 91)) | set(range(97, 123)) | {95},
            "s": {32, 9, 10, 13, 12, 11}}
_SPECIAL = set(".[]{}()*+?|^$\\")


class _Parser:
    def __init__(self, pattern: str):
        self.p, self.i = pattern, 0

    def error(self, what: str) -> ValueError:
        return ValueError(f"regex {self.p!r}: {what} at position {self.i}")

    def peek(self):
        return self.p[self.i] if self.i < len(self.p) else None

    def parse(self):
        node = self.alternation()
        if self.i != len(self.p):
            raise self.error(f"unexpected {self.p[self.i]!r}")
        return node

    def alternation(self):
        options = [self.concat()]
        while self.peek() == "|":
            self.i += 1
            options.append(self.concat())
        return options[0] if len(options) == 1 else ("alt", options)

    def concat(self):
        items = []
        while self.peek() is not None and self.peek() not in "|)":
            items.append(self.repeat(self.atom()))
        return ("cat", items)

    def repeat(self, node):
        while self.peek() is not None and self.peek() in "*+?{":
            c = self.p[self.i]
            self.i += 1
            if c == "*":
                node = ("rep", node, 0, None)
            elif c == "+":
                node = ("rep", node, 1, None)
            elif c == "?":
                node = ("rep", node, 0, 1)
            else:
                end = self.p.find("}", self.i)
                if end < 0:
                    raise self.error("'{' without '}'")
                body, self.i = self.p[self.i:end], end + 1
                lo, _, hi = body.partition(",")
                try:
                    lo_n = int(lo)
                    hi_n = lo_n if "," not in body else (None if hi == "" else int(hi))
                except ValueError:
                    raise self.error(f"bad repetition {{{body}}}") from None
                if hi_n is not None and hi_n < lo_n:
                    raise self.error(f"bad repetition {{{body}}}")
                node = ("rep", node, lo_n, hi_n)
            if self.peek() in ("?", "+") and c in "*+?}":
                raise self.error("lazy or possessive quantifiers are not supported")
        return node

    def atom(self):
        c = self.p[self.i]
        self.i += 1
        if c == "(":
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.peek() == "?":
                raise self.error("group extensions other than (?:...) (lookarounds, named groups) are not supported")
            node = self.alternation()
            if self.peek() != ")":
                raise self.error("'(' without ')'")
            self.i += 1
            return node
        if c == "[":
            return self.char_class()
        if c == ".":
            return ("set", frozenset(range(128)) - {10}, True)
        if c == "\\":
            return self.escape(in_class=False)
        if c in "^$":
            raise self.error("anchors are not supported (the whole text must match)")
        if c in "*+?{)":
            raise self.error(f"nothing to repeat before {c!r}")
        return ("lit", c)

    def escape(self, in_class: bool):
        if self.i >= len(self.p):
            raise self.error("a trailing backslash")
        c = self.p[self.i]
        self.i += 1
        if c in _CLASSES:
            return ("set", frozenset(_CLASSES[c]), False)
        if c in _ESCAPES:
            return ("lit", _ESCAPES[c])
        if c == "x":
            code = self.p[self.i:self.i + 2]
            if len(code) != 2 or any(h not in "0123456789abcdefABCDEF" for h in code):
                raise self.error("\\x needs two hex digits")
            self.i += 2
            return ("lit", chr(int(code, 16)))
        if c in _SPECIAL or c in "-/\"'":
            return ("lit", c)
        raise self.error(f"the escape \\{c} is not supported")

    def char_class(self):
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        chars: set[int] = set()
        first = True
        while True:
            c = self.peek()
            if c is None:
                raise self.error("'[' without ']'")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "\\":
                self.i += 1
                node = self.escape(in_class=True)
                if node[0] == "set":
                    chars |= node[1]
                    continue
                lo = node[1]
            else:
                self.i += 1
                lo = c
            if self.peek() == "-" and self.i + 1 < len(self.p) and self.p[self.i + 1] != "]":
                self.i += 1
                hi = self.p[self.i]
                self.i += 1
                if hi == "\\":
                    hi = self.escape(in_class=True)[1]
                if ord(hi) < ord(lo):
                    raise self.error(f"bad range {lo}-{hi}")
                codes = range(ord(lo), ord(hi) + 1)
            else:
                codes = [ord(lo)]
            if any(x > 127 for x in codes):
                raise self.error("non-ASCII characters in a class are not supported (write them as alternatives)")
            chars.update(codes)
        if negate:
            return ("set", frozenset(range(128)) - chars, True)  # True: also any non-ASCII character
        return ("set", frozenset(chars), False)


def parse(pattern: str):
    """The tree of `pattern` (ValueError for anything outside the subset)."""
    return _Parser(pattern).parse()
