"""Encoding one piece with byte-pair merges: the rule tiktoken uses, and the pair rule.

Reference: `openai/tiktoken` `src/lib.rs::_byte_pair_merge` and
`tiktoken/_educational.py::bpe_encode` (the rank rule); `openai/gpt-2`
`encoder.py::bpe` (the pair rule).

The rank rule: start from single bytes; repeatedly merge the adjacent pair whose
*concatenated bytes* have the lowest rank (token id), the leftmost one on a tie,
until no adjacent concatenation is a token.

    >>> ranks = {bytes([b]): b for b in range(256)} | {b"ab": 256, b"abc": 257}
    >>> encode_piece(b"abcab", ranks)
    [257, 256]

The pair rule (GPT-2's `encoder.py`, Hugging Face `tokenizers`) looks the pair of
*tokens* up in the merge list instead. For a merge list made by training the two
agree; for hand-made tables they can differ, which `encode_piece_pairs` lets a
test show.
"""
from __future__ import annotations

import heapq
import sys

__all__ = ["encode_piece", "encode_piece_pairs", "LONG_PIECE"]

_NONE = sys.maxsize  # "no such token": larger than every rank
# Above this many bytes a piece is merged with a heap (n log n) instead of rescanning (n^2).
LONG_PIECE = 256


def encode_piece(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Token ids of one piece by the rank rule (see the module docstring).

    Raises KeyError if a single byte of `piece` is not a token.
    """
    if not piece:
        return []
    rank = ranks.get(piece)
    if rank is not None:  # the whole piece is a token: the common case for words
        return [rank]
    if len(piece) > LONG_PIECE:
        parts = _merge_heap(piece, ranks)
    else:
        parts = _merge_scan(piece, ranks)
    return [ranks[p] for p in parts]


def _merge_scan(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    # parts[i] is a token's bytes; pair_ranks[i] is the rank of parts[i] + parts[i + 1].
    parts = [piece[i : i + 1] for i in range(len(piece))]
    get = ranks.get
    pair_ranks = [get(a + b, _NONE) for a, b in zip(parts, parts[1:])]
    while pair_ranks:
        best = min(pair_ranks)
        if best == _NONE:
            break
        i = pair_ranks.index(best)  # leftmost of the lowest
        parts[i] += parts.pop(i + 1)
        del pair_ranks[i]
        if i > 0:
            pair_ranks[i - 1] = get(parts[i - 1] + parts[i], _NONE)
        if i < len(pair_ranks):
            pair_ranks[i] = get(parts[i] + parts[i + 1], _NONE)
    return parts


def _merge_heap(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    # The same rule on a doubly linked list with a heap of (rank, start): the lowest
    # rank first, the leftmost on a tie. Entries go stale when a neighbour merges;
    # a popped entry is used only if its pair still has that rank.
    n = len(piece)
    parts: list[bytes | None] = [piece[i : i + 1] for i in range(n)]
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    get = ranks.get
    heap = [(r, i) for i in range(n - 1) if (r := get(parts[i] + parts[i + 1])) is not None]
    heapq.heapify(heap)
    while heap:
        r, i = heapq.heappop(heap)
        j = nxt[i]
        if parts[i] is None or j >= n or get(parts[i] + parts[j]) != r:
            continue  # stale
        parts[i] += parts[j]
        parts[j] = None
        nxt[i] = k = nxt[j]
        if k < n:
            prv[k] = i
            if (rk := get(parts[i] + parts[k])) is not None:
                heapq.heappush(heap, (rk, i))
        p = prv[i]
        if p >= 0 and (rp := get(parts[p] + parts[i])) is not None:
            heapq.heappush(heap, (rp, p))
    return [p for p in parts if p is not None]


def encode_piece_pairs(piece: bytes, ranks: dict[bytes, int], merge_ranks: dict[tuple[bytes, bytes], int]) -> list[int]:
    """Token ids of one piece by the pair rule: merge the pair of tokens earliest in the merge list.

    `merge_ranks` maps (left bytes, right bytes) -> position in the merge list.
    All occurrences of the chosen pair are merged left to right, as in GPT-2's `bpe`.

        >>> ranks = {bytes([b]): b for b in range(256)} | {b"bc": 256, b"ab": 257, b"abc": 258}
        >>> merges = {(b"b", b"c"): 0, (b"a", b"b"): 1, (b"ab", b"c"): 2}
        >>> encode_piece_pairs(b"abc", ranks, merges), encode_piece(b"abc", ranks)
        ([97, 256], [258])
    """
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        candidates = [(merge_ranks.get(pair, _NONE), pair) for pair in zip(parts, parts[1:])]
        best, pair = min(candidates, key=lambda c: c[0])
        if best == _NONE:
            break
        merged, i = [], 0
        while i < len(parts):
            if i < len(parts) - 1 and (parts[i], parts[i + 1]) == pair:
                merged.append(parts[i] + parts[i + 1])
                i += 2
            else:
                merged.append(parts[i])
                i += 1
        parts = merged
    return [ranks[p] for p in parts]
