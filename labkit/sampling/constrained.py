"""Constrained decoding: a DFA indexed against the vocabulary, so every step is a mask lookup.

Willard & Louf 2023 ("Efficient Guided Generation"): walk each token's bytes through the
automaton from a state, once, and keep the result. `TokenAutomaton.mask(state)` is then a
precomputed boolean mask over the vocabulary (the tokens whose bytes keep a match possible)
and `next(state, token)` a table lookup; end-of-sequence is allowed only in accepting states.
A state's row is computed the first time generation reaches it (one vectorised walk of the
whole vocabulary, about a millisecond) and cached; the automaton itself is cached on the
tokenizer and the pattern.

The format is defined on characters, the model emits BPE tokens: a token may cross the
format's boundaries (`","` closing one value and opening the next key), and a constraint can
be spelled only with tokens the vocabulary has. States from which no sequence of tokens can
reach a match are cut when the automaton is built (token-level liveness), so a mask never
offers a token that leads into a dead end; a constraint the tokenizer cannot spell at all
raises ValueError.

    >>> c = Constraint.regex(tok, "(yes|no)")                 # doctest: +SKIP
    >>> logits = c.apply(logits); token = int(logits.argmax()); c.advance(token)   # doctest: +SKIP
"""
from __future__ import annotations

import weakref

import numpy as np
import torch

from labkit.sampling.regex_dfa import DFA, compile_regex

__all__ = ["TokenAutomaton", "Constraint", "token_automaton", "make_constraint"]

_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # tokenizer -> {pattern: TokenAutomaton}


def _vocab_bytes(tok) -> tuple[np.ndarray, np.ndarray]:
    """Every token's bytes, padded: [V, L] uint8 and lengths [V] (special tokens get length 0: never allowed)."""
    V = tok.vocab_size
    raw = [b"" if tok.is_special(i) else tok.token_bytes(i) for i in range(V)]
    lengths = np.array([len(r) for r in raw], dtype=np.int64)
    table = np.zeros((V, max(1, int(lengths.max()))), dtype=np.uint8)
    for i, r in enumerate(raw):
        table[i, :len(r)] = np.frombuffer(r, dtype=np.uint8)
    return table, lengths


class TokenAutomaton:
    """A DFA over bytes, indexed against a tokenizer's vocabulary."""

    def __init__(self, tok, dfa: DFA, max_states: int = 5000):
        self.dfa, self.vocab_size = dfa, tok.vocab_size
        self.eos = getattr(tok, "eos_id", None)
        self.bytes, self.lengths = _vocab_bytes(tok)
        self._rows: dict[int, np.ndarray] = {}   # state -> next state per token (-1: not allowed)
        self._masks: dict[int, torch.Tensor] = {}
        live = np.zeros(dfa.n_states, dtype=bool)
        live[list(self._token_live(max_states))] = True
        # one row per reachable state, pruned in place (a token into a dead end is -1), in the smallest integer type:
        # for "any JSON object" on a 49k vocabulary that is ~2,000 rows, 200 MB as int16 instead of 800 MB
        small = np.int16 if dfa.n_states < 2**15 else np.int32
        for state, row in self._rows.items():
            self._rows[state] = np.where((row >= 0) & live[np.maximum(row, 0)], row, -1).astype(small)
        self._pruned = True

    def _walk(self, state: int) -> np.ndarray:
        """The state each token's bytes lead to from `state` (-1 where the walk leaves the automaton)."""
        row = self._rows.get(state)
        if row is None:
            if getattr(self, "_pruned", False):  # every state tokens can reach has its row; this one is not reachable
                raise ValueError(f"state {state} is not reachable by tokens in {self.dfa.pattern!r:.80}")
            cur = np.full(self.vocab_size, state, dtype=np.int32)
            table = self.dfa.table
            for pos in range(self.bytes.shape[1]):
                active = (pos < self.lengths) & (cur >= 0)
                if not active.any():
                    break
                cur[active] = table[cur[active], self.bytes[active, pos]]
            cur[self.lengths == 0] = -1
            row = self._rows[state] = cur
        return row

    def _token_live(self, max_states: int) -> set[int]:
        """The states, reachable from the start by tokens, from which tokens can still reach an accepting state."""
        edges, order, seen = {}, [0], {0}
        while order:
            s = order.pop()
            targets = set(np.unique(self._walk(s)).tolist()) - {-1}
            edges[s] = targets
            for t in targets - seen:
                if len(seen) >= max_states:
                    raise ValueError(f"the constraint {self.dfa.pattern!r:.80} reaches more than {max_states} states "
                                     "through this vocabulary; simplify it")
                seen.add(t)
                order.append(t)
        live = {s for s in seen if self.dfa.accepting[s]}
        changed = True
        while changed:
            changed = False
            for s, targets in edges.items():
                if s not in live and targets & live:
                    live.add(s)
                    changed = True
        if 0 not in live:
            raise ValueError(f"the tokenizer cannot spell any text that matches {self.dfa.pattern!r:.80}")
        return live

    def next_states(self, state: int) -> np.ndarray:
        """Next state for every token from `state`: -1 for a token that would break the match or end in a dead end."""
        return self._walk(state)

    def mask(self, state: int) -> torch.Tensor:
        """Boolean mask [V] of the tokens allowed in `state` (end-of-sequence only where the text may end)."""
        m = self._masks.get(state)
        if m is None:
            allowed = self.next_states(state) >= 0
            if self.eos is not None:
                allowed[self.eos] = bool(self.dfa.accepting[state])
            m = self._masks[state] = torch.from_numpy(allowed)
        return m

    def next(self, state: int, token: int) -> int:
        """The state after `token` (ValueError if the token is not allowed there)."""
        nxt = int(self.next_states(state)[token]) if 0 <= token < self.vocab_size else -1
        if nxt < 0:
            raise ValueError(f"token {token} is not allowed in state {state} of {self.dfa.pattern!r:.80}")
        return nxt

    def accepting(self, state: int) -> bool:
        return bool(self.dfa.accepting[state])


def token_automaton(tok, pattern: str) -> TokenAutomaton:
    """The automaton for `pattern` on `tok`, built once and cached on the tokenizer and the pattern."""
    per_tok = _CACHE.setdefault(tok, {})
    auto = per_tok.get(pattern)
    if auto is None:
        auto = per_tok[pattern] = TokenAutomaton(tok, compile_regex(pattern))
    return auto


class Constraint:
    """One generation's position in an automaton: `apply(logits)` masks, `advance(token)` moves on."""

    def __init__(self, automaton: TokenAutomaton):
        self.automaton, self.state = automaton, 0

    @classmethod
    def regex(cls, tok, pattern: str) -> "Constraint":
        return cls(token_automaton(tok, pattern))

    @property
    def done(self) -> bool:
        """The text so far matches and no token can extend it: the reply is complete."""
        return self.automaton.accepting(self.state) and not bool((self.automaton.next_states(self.state) >= 0).any())

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits [V] with every token the format does not allow here at -inf (the rest untouched)."""
        mask = self.automaton.mask(self.state)
        if logits.shape[-1] != mask.shape[0]:
            raise ValueError(f"logits have {logits.shape[-1]} entries, the tokenizer {mask.shape[0]}")
        return logits.masked_fill(~mask.to(logits.device), float("-inf"))

    def advance(self, token: int) -> None:
        if token != self.automaton.eos:
            self.state = self.automaton.next(self.state, token)


def make_constraint(tok, regex: str | None = None, json_schema=None, choices=None) -> Constraint | None:
    """The constraint for at most one of: a `regex`, a `json_schema` (a dict; "json_object" for any object),
    or `choices` (a list of strings, one of which is the whole reply). None when none is given."""
    from labkit.sampling.json_schema import JSON_OBJECT, escape, schema_to_regex

    given = [name for name, v in (("regex", regex), ("json_schema", json_schema), ("choices", choices)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"give one constraint at most, got {given}")
    if not given:
        return None
    if regex is not None:
        if not isinstance(regex, str):
            raise TypeError(f"regex must be a str, got {type(regex).__name__}")
        pattern = regex
    elif json_schema is not None:
        pattern = JSON_OBJECT if json_schema == "json_object" else schema_to_regex(json_schema)
    else:
        if not isinstance(choices, (list, tuple)) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise ValueError(f"choices must be a non-empty list of non-empty strings, got {choices!r:.80}")
        pattern = "(" + "|".join(escape(c) for c in choices) + ")"
    return Constraint.regex(tok, pattern)
