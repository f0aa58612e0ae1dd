"""Chapter 05's constrained-decoding exercises: a state's allowed tokens, and the masked softmax."""
from __future__ import annotations

import numpy as np
import torch

from labkit.exercises._core import check

__all__ = ["check_allowed_tokens", "check_masked_softmax"]


def _reference_allowed(table, accepting, vocab, state):
    allowed = []
    for token_id, data in enumerate(vocab):
        s = state
        for b in data:
            s = int(table[s][b])
            if s < 0:
                break
        if data and s >= 0:
            allowed.append(token_id)
    return allowed


def _allowed_cases():
    from labkit.sampling.regex_dfa import compile_regex

    vocab = [b"y", b"ye", b"yes", b"n", b"no", b"!", b"s", b"yes!", b"", b"o!", b"x"]
    cases = []
    for pattern in ["(yes|no)!", "y*es", "(no)+!?"]:
        dfa = compile_regex(pattern)
        table = dfa.table.tolist()
        for state in range(min(dfa.n_states, 4)):
            cases.append((table, dfa.accepting.tolist(), vocab, state))
    return cases


def check_allowed_tokens(fn) -> bool:
    """Check `fn(table, accepting, vocab, state) -> list[int]`: the ids of the tokens allowed in `state`.

    `table[s][byte]` is the next state (-1: the text can no longer match), `vocab[i]` token i's
    bytes. A token is allowed when walking all of its bytes from `state` never reaches -1 (an
    empty token is never allowed). Return the ids in increasing order.
    """
    return check("allowed_tokens", fn, _reference_allowed, _allowed_cases(),
                 hint="for each token, start at `state` and follow table[s][b] for every byte b of the token; "
                      "keep the token if you never reach -1 (and skip empty tokens)")


def _reference_masked_softmax(logits, allowed):
    return torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)


def _softmax_cases():
    g = torch.Generator().manual_seed(5)
    cases = [(torch.tensor([2.0, 1.0, 0.0, -1.0]), torch.tensor([True, False, True, False])),
             (torch.tensor([0.0, 0.0, 0.0]), torch.tensor([False, True, False])),
             (torch.tensor([100.0, -100.0, 5.0]), torch.tensor([False, True, True]))]
    for n in (8, 50):
        logits = torch.randn(n, generator=g) * 3
        allowed = torch.rand(n, generator=g) > 0.5
        allowed[0] = True
        cases.append((logits, allowed))
    return cases


def check_masked_softmax(fn) -> bool:
    """Check `fn(logits [V], allowed bool [V]) -> probabilities [V]`: zero where not allowed, and the model's own
    probabilities renormalised over the allowed tokens."""
    return check("masked_softmax", fn, _reference_masked_softmax, _softmax_cases(),
                 hint="set the logits of the tokens that are not allowed to -inf, then take the softmax (subtract the "
                      "largest allowed logit first so that exp never overflows)")
