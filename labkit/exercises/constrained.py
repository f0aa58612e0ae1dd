"""Deep dive 05a's constrained-decoding exercises: a state's allowed tokens (with end-of-sequence and dead ends
pruned), the probability a per-step mask gives each whole answer, and how many token spellings a text has."""
from __future__ import annotations

import math

import torch

from labkit.exercises._core import check
from labkit.exercises.sampling import property_check

__all__ = ["check_allowed_tokens", "check_masked_answer_probs", "check_count_spellings"]


# ---- 1. the allowed-token index of one state ------------------------------------------------------

def _walk(table, state, data):
    for b in data:
        state = int(table[state][b])
        if state < 0:
            return -1
    return state


def _reference_allowed(table, accepting, vocab, state, eos_id):
    tokens = [i for i, data in enumerate(vocab) if i != eos_id and data]
    live = {s for s in range(len(accepting)) if accepting[s]}      # states from which tokens can reach a match
    changed = True
    while changed:
        changed = False
        for s in range(len(accepting)):
            if s not in live and any(_walk(table, s, vocab[i]) in live for i in tokens):
                live.add(s)
                changed = True
    allowed = [i for i in tokens if _walk(table, state, vocab[i]) in live]
    if accepting[state]:
        allowed = sorted(allowed + [eos_id])
    if not allowed:
        raise ValueError(f"no token is allowed in state {state}: no text the vocabulary can spell matches from here")
    return allowed


def _raised(fn):
    def call(*args):
        try:
            return fn(*args)
        except ValueError:
            return "ValueError"
    return call


def _same_ids(expected, got) -> bool:
    """The ids as a list, a tuple, an array or a tensor of ints; "ValueError" where the reference raises."""
    if isinstance(expected, str) or isinstance(got, str):
        return expected == got
    try:
        got = [int(g) for g in got]
    except (TypeError, ValueError):
        return False
    return list(expected) == got


def _allowed_cases():
    from labkit.sampling.regex_dfa import compile_regex

    specs = [
        # (pattern, vocab, eos_id)
        ("(yes|no)!", [b"y", b"ye", b"yes", b"n", b"no", b"!", b"s", b"yes!", b"", b"o!", b"x"], 8),
        ("(ab|c)d?", [b"", b"a", b"c", b"d", b"cd"], 0),                 # no token spells 'b': 'a' leads nowhere
        ("(abc|d)", [b"a", b"b", b"d", b""], 3),                        # 'a' then 'b' exist, 'c' does not
        ("(ab)*c", [b"ab", b"aba", b"ba", b"c", b"abc", b"", b"b"], 5),  # tokens that cross the pair boundary
        ("a(bc|d)e", [b"a", b"ab", b"c", b"d", b"e", b""], 5),
        ("a(bc|d)e", [b"a", b"ab", b"c", b"d", b""], 4),                 # nothing spells 'e': every state is dead
        ("x+", [b"x", b"xx", b"", b"y"], 2),                              # an accepting state that goes on
    ]
    cases = []
    for pattern, vocab, eos in specs:
        dfa = compile_regex(pattern)
        table, accepting = dfa.table.tolist(), dfa.accepting.tolist()
        for state in range(dfa.n_states):
            cases.append((table, accepting, vocab, state, eos))
    return cases


def check_allowed_tokens(fn) -> bool:
    """Check `fn(table, accepting, vocab, state, eos_id) -> list[int]`: the ids of the tokens allowed in `state`.

    `table[s][byte]` is the next state (-1: the text can no longer match), `vocab[i]` token i's bytes
    (`vocab[eos_id]` is end-of-sequence). A token is allowed when walking all of its bytes from `state`
    never reaches -1 *and* ends in a state from which some sequence of vocabulary tokens reaches an
    accepting state; end-of-sequence is allowed only in an accepting state. Return the ids in increasing
    order; raise ValueError when nothing is allowed.
    """
    return check("allowed_tokens", _raised(fn), _raised(_reference_allowed), _allowed_cases(), compare=_same_ids,
                 hint="first find the live states: accepting ones, then (until nothing changes) every state from "
                      "which one token's bytes lead to a live state; a token is allowed when its walk ends in a "
                      "live state; end-of-sequence only in accepting states; nothing allowed -> raise ValueError")


# ---- 2. what a per-step mask does to whole answers -------------------------------------------------

class ToyModel:
    """A next-token model over `vocab_size` tokens: `model(prefix) -> probabilities [V]`, fixed by the prefix."""

    def __init__(self, vocab_size: int, seed: int, sharpness: float = 2.0):
        self.vocab_size, self.seed, self.sharpness = vocab_size, seed, sharpness

    def __call__(self, prefix) -> torch.Tensor:
        key = self.seed
        for t in prefix:
            key = (key * 1_000_003 + int(t) + 1) % 2**61
        gen = torch.Generator().manual_seed(key)
        return (torch.randn(self.vocab_size, generator=gen, dtype=torch.float64) * self.sharpness).softmax(-1)

    def __repr__(self) -> str:
        return f"ToyModel(vocab_size={self.vocab_size}, seed={self.seed})"


def _reference_answer_probs(model, answers):
    answers = [tuple(a) for a in answers]
    out = []
    for a in answers:
        p = 1.0
        for i, token in enumerate(a):
            allowed = {b[i] for b in answers if len(b) > i and b[:i] == a[:i]}
            probs = model(a[:i])
            p *= float(probs[token]) / sum(float(probs[t]) for t in allowed)
        out.append(p)
    return out


def _answer_cases():
    E = 0  # end-of-sequence in these toy vocabularies
    return [
        (ToyModel(6, 1), [(3, E)]),                                      # one answer: certain
        (ToyModel(6, 2), [(1, E), (2, E)]),                              # differ at the first token only
        (ToyModel(8, 3), [(1, 2, 3, E), (4, 5, E), (6, 7, E)]),          # three spellings of three names
        (ToyModel(8, 4), [(1, 2, E), (1, 3, E), (4, E)]),                # a shared first token
        (ToyModel(8, 5), [(1, 2, E), (1, 2, 3, E), (5, 6, 7, E)]),       # an answer that continues another
        (ToyModel(8, 6, 4.0), [(2, 3, 4, E), (5, E), (2, 6, E), (7, 1, E)]),
    ]


def _answers_property(case, got) -> str | None:
    model, answers = case
    want = _reference_answer_probs(model, answers)
    try:
        got = [float(g) for g in got]
    except (TypeError, ValueError):
        return f"expected a list of {len(answers)} probabilities"
    if len(got) != len(want):
        return f"expected {len(want)} probabilities, one per answer, got {len(got)}"
    if not math.isclose(sum(got), 1.0, rel_tol=1e-6):
        return f"the answers' probabilities add up to {sum(got):.6f}: a mask that allows only these answers gives them all the mass"
    if not all(math.isclose(g, w, rel_tol=1e-6, abs_tol=1e-12) for g, w in zip(got, want)):
        return f"expected {[round(w, 6) for w in want]}"
    return None


def check_masked_answer_probs(fn) -> bool:
    """Check `fn(model, answers) -> list[float]`: for each answer (a tuple of token ids ending in end-of-sequence),
    the probability that sampling with a per-step mask produces it. `model(prefix)` gives the next-token
    probabilities after the tuple `prefix`; the mask at each step allows exactly the next tokens of the answers
    that agree with the text so far."""
    return property_check("masked_answer_probs", fn, _answer_cases(), _answers_property,
                          hint="at each step the mask renormalises the model's probabilities over the tokens that "
                               "still lead to some answer; the answer's probability is the product over its steps")


# ---- 3. how many token sequences spell a text ------------------------------------------------------

def _count_spellings(text, vocab):
    ways = [1] + [0] * len(text)  # ways[i]: token sequences that spell text[:i]
    pieces = set(vocab)
    for end in range(1, len(text) + 1):
        ways[end] = sum(ways[start] for start in range(end) if text[start:end] in pieces)
    return ways[-1]


def check_count_spellings(fn) -> bool:
    """Check `fn(text, vocab) -> int`: how many sequences of tokens from `vocab` (a list of distinct byte strings)
    spell the byte string `text` exactly, each token's bytes one after another."""
    vocab = [b"C", b"a", b"n", b"b", b"e", b"r", b"Ca", b"an", b"Can", b"ber", b"berra", b"rra", b"nb", b"er", b"ra"]
    cases = [(b"Canberra", vocab), (b"", vocab), (b"Ca", vocab), (b"x", vocab), (b"aaaa", [b"a", b"aa", b"aaa"]),
             (b"abab", [b"a", b"b", b"ab", b"ba", b"aba", b"bab"]), (b"Sydney", [b"S", b"Syd", b"ney", b"y"]),
             (b"banana", [b"b", b"a", b"n", b"an", b"ana", b"nan", b"banana"])]
    return check("count_spellings", fn, _count_spellings, cases,
                 hint="count the spellings of every prefix, shortest first: the prefix ending at i is a spelling of "
                      "an earlier prefix followed by one token that covers the rest; the empty text has one "
                      "spelling (no tokens), a text no tokens cover has none")
