"""Training byte-level BPE: the naive loop and the incremental trainer, same merges.

References: `karpathy/minbpe` (`get_stats`, `merge`, the naive loop) and
`tiktoken/_educational.py::bpe_train`; the Hugging Face `tokenizers` BpeTrainer
(pair counts, a max-heap with lazy updates, and an index from each pair to the
words that hold it), which is the incremental trainer here.

Both trainers start from the 256 single bytes, cut the text into pieces with the
pre-tokenizer regex, and repeat: count every adjacent pair of tokens inside the
pieces, merge the most frequent pair into a new token, everywhere.

Tie-break rule (both trainers): among the pairs with the highest count, take the
smallest pair of ids, compared as tuples (first id, then second id). Python's
`max(stats, key=stats.get)` (first inserted wins) would tie the result to the
order in which pairs were first seen, which an incremental trainer cannot keep
cheaply; the tuple order costs nothing in either.

    >>> ids = list(b"aaabdaaabac")
    >>> get_stats(ids)[(97, 97)]
    4
    >>> merge(ids, (97, 97), 256)
    [256, 97, 98, 100, 256, 97, 98, 97, 99]
"""
from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from typing import Callable, Iterable

from labkit import checks
from labkit.tokenizer.pretokenize import split

__all__ = ["get_stats", "merge", "count_pieces", "train_naive", "train_incremental", "best_pair"]

Pair = tuple[int, int]


def get_stats(ids: list[int], counts: dict[Pair, int] | None = None) -> dict[Pair, int]:
    """Count each adjacent pair in `ids` (into `counts` if given).

        >>> get_stats([1, 2, 3, 1, 2])
        {(1, 2): 2, (2, 3): 1, (3, 1): 1}
    """
    counts = {} if counts is None else counts
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def merge(ids: list[int], pair: Pair, idx: int) -> list[int]:
    """Replace every occurrence of `pair` in `ids` by `idx`, left to right, without overlaps.

        >>> merge([1, 2, 3, 1, 2], (1, 2), 4)
        [4, 3, 4]
        >>> merge([5, 5, 5], (5, 5), 6)
        [6, 5]
    """
    out = []
    i, n = 0, len(ids)
    a, b = pair
    while i < n:
        if i < n - 1 and ids[i] == a and ids[i + 1] == b:
            out.append(idx)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def best_pair(stats: dict[Pair, int]) -> Pair:
    """The pair to merge next: the highest count, then the smallest pair (the tie-break rule)."""
    return min(stats, key=lambda pair: (-stats[pair], pair))


def count_pieces(text: str, pattern: str) -> Counter:
    """Pre-tokenize `text` and count each distinct piece's UTF-8 bytes: {b' the': 27843, ...}."""
    return Counter({piece.encode("utf-8"): n for piece, n in Counter(split(pattern, text)).items()})


def _report(progress: Callable[[int, int], object] | None, done: int, total: int) -> None:
    if progress is not None:
        progress(done, total)


def train_naive(pieces: Iterable[bytes], n_merges: int, progress: Callable[[int, int], object] | None = None) -> list[Pair]:
    """The textbook loop: recount every pair in every piece, merge the best, repeat.

    `pieces` is the pre-tokenized text, one entry per occurrence (not deduplicated).
    Cost: n_merges x (size of the text). Returns the merges in order; the i-th
    merge makes token 256 + i. Stops early if no pair is left.
    """
    chunks = [list(p) for p in pieces]
    merges: list[Pair] = []
    for i in range(n_merges):
        stats: dict[Pair, int] = {}
        for chunk in chunks:
            get_stats(chunk, stats)
        if not stats:
            break
        pair = best_pair(stats)
        chunks = [merge(chunk, pair, 256 + i) for chunk in chunks]
        merges.append(pair)
        _report(progress, i + 1, n_merges)
    return merges


def train_incremental(
    piece_counts: dict[bytes, int], n_merges: int, progress: Callable[[int, int], object] | None = None
) -> list[Pair]:
    """The same merges as `train_naive`, touching only the pieces that hold the merged pair.

    `piece_counts` maps each distinct piece to how often it occurs (`count_pieces`).
    Keeps `counts[pair]` (occurrences weighted by piece count), `where[pair]` (the
    pieces that may hold it) and a max-heap of (count, pair). A heap entry can be
    stale: the count of an existing pair only ever falls (a merge only creates pairs
    with the new token), so a popped entry whose count is too high is pushed back
    with its current count, and the first entry that is up to date is the best pair.
    """
    words = [list(p) for p in piece_counts]
    freqs = list(piece_counts.values())
    counts: dict[Pair, int] = defaultdict(int)
    where: dict[Pair, set[int]] = defaultdict(set)
    for w, (ids, f) in enumerate(zip(words, freqs)):
        for pair in zip(ids, ids[1:]):
            counts[pair] += f
            where[pair].add(w)
    heap = [(-c, pair) for pair, c in counts.items()]
    heapq.heapify(heap)
    merges: list[Pair] = []
    while len(merges) < n_merges and heap:
        neg, pair = heapq.heappop(heap)
        current = counts.get(pair, 0)
        if current != -neg:  # stale: the pair was partly merged away since it was pushed
            if current > 0:
                heapq.heappush(heap, (-current, pair))
            continue
        new = 256 + len(merges)
        merges.append(pair)
        delta: dict[Pair, int] = defaultdict(int)
        for w in where.pop(pair):
            ids = words[w]
            merged = merge(ids, pair, new)
            if len(merged) == len(ids):
                continue  # the index is allowed to be stale too
            f = freqs[w]
            for old in zip(ids, ids[1:]):
                delta[old] -= f
            for p in zip(merged, merged[1:]):
                delta[p] += f
                if new in p:
                    where[p].add(w)
            words[w] = merged
        for p, d in delta.items():
            if d == 0:
                continue
            counts[p] += d
            if counts[p] <= 0:
                del counts[p]
            elif d > 0:  # a pair with the new token: its first heap entry
                heapq.heappush(heap, (-counts[p], p))
        _report(progress, len(merges), n_merges)
    return merges


def train_tokenizer(cls, text, vocab_size, pattern, special_tokens, progress, bos_token, eos_token, method):
    """Build a `BPETokenizer` from the merges learned on `text` (see `BPETokenizer.train`)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if isinstance(special_tokens, str):
        raise TypeError("special_tokens must be a sequence of strings, got a single str; wrap it in a list")
    special_tokens = list(special_tokens)
    if len(set(special_tokens)) != len(special_tokens) or not all(isinstance(s, str) and s for s in special_tokens):
        raise ValueError(f"special_tokens must be distinct non-empty strings, got {special_tokens}")
    checks.integer("vocab_size", vocab_size, error=TypeError)
    smallest = 256 + len(special_tokens)
    if vocab_size < smallest:
        raise ValueError(f"vocab_size must be at least 256 + {len(special_tokens)} special tokens = {smallest}, got {vocab_size}")
    if method not in ("incremental", "naive"):
        raise ValueError(f"method must be 'incremental' or 'naive', got {method!r}")
    # Special-token text in the corpus is a boundary, never merged into ordinary tokens.
    parts = [text]
    for s in special_tokens:
        parts = [piece for part in parts for piece in part.split(s)]
    n_merges = vocab_size - smallest
    try:
        if method == "incremental":
            pieces = Counter()
            for part in parts:
                pieces.update(count_pieces(part, pattern))
        else:
            pieces = [p.encode("utf-8") for part in parts for p in split(pattern, part)]
    except UnicodeEncodeError as exc:
        raise ValueError(f"text contains {exc.object[exc.start:exc.end]!r}, a lone surrogate with no UTF-8 encoding") from None
    report = _progress_callback(progress, n_merges)
    trainer = train_incremental if method == "incremental" else train_naive
    merges = trainer(pieces, n_merges, report)
    if hasattr(report, "close"):
        report.close()
    tokens = [bytes([b]) for b in range(256)]
    for a, b in merges:
        tokens.append(tokens[a] + tokens[b])
    specials = {s: len(tokens) + i for i, s in enumerate(special_tokens)}
    return cls(tokens, pattern, specials, merges=merges, bos_token=bos_token, eos_token=eos_token, name="bpe")


class _Bar:
    def __init__(self, total):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc="merges", unit="merge")

    def __call__(self, done, total):
        self.bar.update(done - self.bar.n)

    def close(self):
        self.bar.close()


def _progress_callback(progress, total):
    if progress is True:
        return _Bar(total)
    if progress is False or progress is None:
        return None
    if not callable(progress):
        raise TypeError(f"progress must be a bool or a callable(done, total), got {type(progress).__name__}")
    return progress
