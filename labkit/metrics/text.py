"""Statistics of generated text: how repetitive is it?

The repeated-n-gram rate is the share of a text's n-grams that already occurred earlier
in the same text (the "rep-n" of Welleck et al. 2020, "Neural Text Generation with
Unlikelihood Training"); distinct-n (Li et al. 2016) is its complement over unique n-grams.

    >>> repeated_ngram_rate([1, 2, 3, 1, 2, 3], n=2)   # 5 bigrams, (1,2) and (2,3) come back
    0.4
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["repeated_ngram_rate", "distinct_n"]


def _ngrams(tokens: Sequence, n: int) -> list[tuple]:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def repeated_ngram_rate(tokens: Sequence, n: int = 3) -> float:
    """Fraction of n-grams that are repeats of an earlier n-gram (0 = no repetition); 0.0 if none fit.

    >>> repeated_ngram_rate("abcabc", n=3)   # abc bca cab abc
    0.25
    """
    grams = _ngrams(list(tokens), n)
    if not grams:
        return 0.0
    seen, repeats = set(), 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams)


def distinct_n(tokens: Sequence, n: int = 2) -> float:
    """Unique n-grams / all n-grams (1 = nothing repeats); 1.0 if none fit.

    >>> distinct_n([1, 1, 1, 1], n=1)
    0.25
    """
    grams = _ngrams(list(tokens), n)
    return len(set(grams)) / len(grams) if grams else 1.0
