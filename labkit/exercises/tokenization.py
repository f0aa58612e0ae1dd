"""Exercises of chapter 01: write BPE's two building blocks, `get_stats` and `merge`, then encode with a merge list."""
from __future__ import annotations

import random

from labkit.tokenizer.train import get_stats, merge
from labkit.exercises._core import check

__all__ = ["check_get_stats", "check_merge", "check_encode_with_merges"]


def _id_lists() -> list[list[int]]:
    rng = random.Random(1)
    cases = [[], [7], [1, 2, 3, 1, 2], [5, 5, 5, 5], list(b"aaabdaaabac"), list("hello world".encode())]
    cases += [[rng.randrange(4) for _ in range(rng.randrange(2, 30))] for _ in range(4)]
    return cases


def check_get_stats(fn) -> bool:
    """Check `fn(ids) -> {(a, b): count}`: how often each adjacent pair occurs (overlaps count: [5, 5, 5] has (5, 5) twice)."""
    return check(
        "get_stats",
        fn,
        lambda ids: get_stats(ids),
        [(ids,) for ids in _id_lists()],
        compare=lambda expected, got: isinstance(got, dict) and dict(got) == expected,
        hint="walk over zip(ids, ids[1:]) and count every pair; return a dict, and an empty one for fewer than 2 ids",
    )


def _merge_cases() -> list[tuple]:
    cases = [([1, 2, 3, 1, 2], (1, 2), 4), ([5, 5, 5], (5, 5), 6), ([5, 5, 5, 5], (5, 5), 6), ([1, 2], (2, 1), 9), ([], (1, 2), 3)]
    cases += [(list(b"aaabdaaabac"), (97, 97), 256), ([2, 1, 2, 1, 2], (1, 2), 7)]
    rng = random.Random(2)
    for _ in range(4):
        ids = [rng.randrange(3) for _ in range(rng.randrange(2, 25))]
        cases.append((ids, (ids[0], ids[1]), 99))
    return cases


def check_merge(fn) -> bool:
    """Check `fn(ids, pair, idx) -> new ids`: every occurrence of `pair` replaced by `idx`, left to right, no overlaps."""
    return check(
        "merge",
        fn,
        merge,
        _merge_cases(),
        hint="scan left to right; when ids[i], ids[i+1] == pair emit idx and skip two, else emit ids[i] and skip one",
    )


def _reference_encode(ids: list[int], merges: dict[tuple[int, int], int]) -> list[int]:
    ids = list(ids)
    while len(ids) >= 2:
        stats = get_stats(ids)
        pair = min(stats, key=lambda p: merges.get(p, float("inf")))
        if pair not in merges:
            break
        ids = merge(ids, pair, merges[pair])
    return ids


def check_encode_with_merges(fn) -> bool:
    """Check `fn(ids, merges) -> ids`: apply the learned merges ({pair: new id}), earliest-learned (lowest id) first."""
    aaab = {(97, 97): 256, (97, 98): 257, (256, 257): 258}
    text = list("the cat in the hat".encode())
    learned = {(116, 104): 256, (256, 101): 257, (32, 257): 258, (97, 116): 259, (32, 104): 260, (260, 259): 261}
    cases = [(list(b"aaabdaaabac"), aaab), (list(b"ab"), aaab), ([], aaab), (text, learned), (text, {}), (list(b"aaaa"), {(97, 97): 256, (256, 256): 257}),
             # merges that compete for the same byte: the earliest-learned wins wherever it stands
             (list(b"abc"), {(98, 99): 256, (97, 98): 257}), (list(b"abcbcab"), {(98, 99): 256, (97, 98): 257}),
             # the most frequent pair is not the earliest-learned one; and a dict whose order is not the ids' order
             (list(b"abcbc"), {(97, 98): 256, (98, 99): 257}), (list(b"abc"), {(98, 99): 257, (97, 98): 256})]
    return check(
        "encode_with_merges",
        fn,
        _reference_encode,
        cases,
        hint="repeat: among the adjacent pairs that are in `merges`, pick the one with the lowest new id and merge it; stop when none is",
    )
