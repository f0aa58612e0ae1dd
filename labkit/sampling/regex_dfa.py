"""A regular expression compiled to a DFA over bytes, the first half of constrained decoding.

Willard & Louf 2023, "Efficient Guided Generation for Large Language Models": a format given
as a regex becomes a finite automaton, and generation may only follow its edges. Text is
bytes to a BPE vocabulary, so the automaton here reads UTF-8 bytes: a character class
becomes byte edges, a non-ASCII character a chain of its bytes.

The subset (anything else raises ValueError naming it):

| syntax | meaning |
|---|---|
| `a`, `\\.`, `\\n`, `\\t`, `\\x1f`, `\\\\` ... | a literal character (escape any of `.[]{}()*+?|^$\\`) |
| `[a-z_]`, `[^"\\\\]` | a class of ASCII characters; a negated class also admits every non-ASCII character |
| `\\d`, `\\w`, `\\s` | `[0-9]`, `[A-Za-z0-9_]`, `[ \\t\\n\\r\\f\\v]` |
| `.` | any character but a newline |
| `ab`, `a|b`, `(ab)`, `(?:ab)` | concatenation, alternation, groups |
| `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}` | repetition |

The whole text must match (like `re.fullmatch`). Construction: Thompson's NFA, subset
construction to a DFA, then every state that cannot reach an accepting state is cut, so
that following any edge can still end in a match.

    >>> dfa = compile_regex("(yes|no)!")
    >>> dfa.fullmatch(b"yes!"), dfa.fullmatch(b"ye")
    (True, False)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labkit.sampling.regex_parse import parse

__all__ = ["DFA", "compile_regex"]


# ---- Thompson NFA over bytes ------------------------------------------------------------------

class _NFA:
    def __init__(self):
        self.edges: list[list[tuple[frozenset | None, int]]] = []  # state -> [(bytes or None for epsilon, to)]

    def new(self) -> int:
        self.edges.append([])
        return len(self.edges) - 1

    def build(self, node) -> tuple[int, int]:
        kind = node[0]
        if kind == "lit":
            return self.chain([frozenset([b]) for b in node[1].encode("utf-8")])
        if kind == "set":
            start, end = self.new(), self.new()
            if node[1]:
                self.edges[start].append((node[1], end))
            if node[2]:  # any non-ASCII character: a UTF-8 lead byte and its continuation bytes
                cont = frozenset(range(0x80, 0xC0))
                for lead, n in ((range(0xC2, 0xE0), 1), (range(0xE0, 0xF0), 2), (range(0xF0, 0xF5), 3)):
                    s, e = self.chain([frozenset(lead)] + [cont] * n)
                    self.edges[start].append((None, s))
                    self.edges[e].append((None, end))
            return start, end
        if kind == "cat":
            start = end = self.new()
            for item in node[1]:
                s, e = self.build(item)
                self.edges[end].append((None, s))
                end = e
            return start, end
        if kind == "alt":
            start, end = self.new(), self.new()
            for option in node[1]:
                s, e = self.build(option)
                self.edges[start].append((None, s))
                self.edges[e].append((None, end))
            return start, end
        _, inner, lo, hi = node  # "rep"
        start = end = self.new()
        for _ in range(lo):
            s, e = self.build(inner)
            self.edges[end].append((None, s))
            end = e
        if hi is None:
            s, e = self.build(inner)
            self.edges[end].append((None, s))
            self.edges[e].append((None, s))
            after = self.new()
            self.edges[end].append((None, after))
            self.edges[e].append((None, after))
            return start, after
        final = self.new()
        self.edges[end].append((None, final))
        for _ in range(hi - lo):
            s, e = self.build(inner)
            self.edges[end].append((None, s))
            self.edges[e].append((None, final))
            end = e
        return start, final

    def chain(self, sets) -> tuple[int, int]:
        start = end = self.new()
        for byteset in sets:
            nxt = self.new()
            self.edges[end].append((byteset, nxt))
            end = nxt
        return start, end

    def closure(self, states) -> frozenset:
        stack, seen = list(states), set(states)
        while stack:
            for label, to in self.edges[stack.pop()]:
                if label is None and to not in seen:
                    seen.add(to)
                    stack.append(to)
        return frozenset(seen)


# ---- the DFA ---------------------------------------------------------------------------------

@dataclass
class DFA:
    """`table[state, byte]` -> next state (-1: no match possible); `accepting[state]`; state 0 is the start."""

    pattern: str
    table: np.ndarray       # int32 [n_states, 256]
    accepting: np.ndarray   # bool [n_states]

    @property
    def n_states(self) -> int:
        return len(self.accepting)

    def walk(self, data: bytes, state: int = 0) -> int:
        for b in data:
            if state < 0:
                break
            state = int(self.table[state, b])
        return state

    def fullmatch(self, data: bytes) -> bool:
        state = self.walk(data)
        return state >= 0 and bool(self.accepting[state])


def compile_regex(pattern: str, max_states: int = 20_000) -> DFA:
    """Compile `pattern` (the subset in the module docstring) to a DFA over UTF-8 bytes."""
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
    nfa = _NFA()
    start, accept = nfa.build(parse(pattern))
    first = nfa.closure([start])
    index, order, rows = {first: 0}, [first], []
    while len(rows) < len(order):
        current = order[len(rows)]
        row = np.full(256, -1, dtype=np.int32)
        moves: dict[int, set] = {}
        for s in current:
            for label, to in nfa.edges[s]:
                if label is not None:
                    for b in label:
                        moves.setdefault(b, set()).add(to)
        for b, targets in moves.items():
            nxt = nfa.closure(targets)
            if nxt not in index:
                if len(order) >= max_states:
                    raise ValueError(f"regex {pattern!r} needs more than {max_states} DFA states; simplify it "
                                     "(bounded repetitions multiply states)")
                index[nxt] = len(order)
                order.append(nxt)
            row[b] = index[nxt]
        rows.append(row)
    table = np.stack(rows)
    accepting = np.array([accept in s for s in order])
    return _prune(pattern, table, accepting)


def _prune(pattern: str, table: np.ndarray, accepting: np.ndarray) -> DFA:
    """Cut the states from which no accepting state can be reached (edges into them become -1)."""
    n = len(accepting)
    live = accepting.copy()
    changed = True
    while changed:
        reach = np.zeros(n, dtype=bool)
        valid = table >= 0
        reach = (valid & live[np.where(valid, table, 0)]).any(axis=1) | live
        changed = bool((reach != live).any())
        live = reach
    if not live[0]:
        raise ValueError(f"regex {pattern!r} matches nothing")
    keep = np.flatnonzero(live)
    remap = np.full(n, -1, dtype=np.int32)
    remap[keep] = np.arange(len(keep), dtype=np.int32)
    new_table = np.where(table[keep] >= 0, remap[np.where(table[keep] >= 0, table[keep], 0)], -1).astype(np.int32)
    return DFA(pattern, new_table, accepting[keep])
