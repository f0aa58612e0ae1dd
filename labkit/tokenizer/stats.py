"""Measuring a tokenizer: compression, tokens per word, and how both move with the vocabulary size.

One training run gives every smaller vocabulary too: BPE is greedy, so the
tokenizer trained to V ids is the one trained to a larger size with only its
first V - 256 merges kept. `vocab_sweep` trains once, notes the clock after
every merge, and measures each truncated tokenizer on held-out text.

    >>> stats = compression(tok, "To be, or not to be")         # doctest: +SKIP
    {'tokens': 7, 'bytes': 19, 'words': 6, 'bytes_per_token': 2.71, 'tokens_per_word': 1.17}
"""
from __future__ import annotations

from dataclasses import dataclass

import regex

from labkit.measure.clock import now as clock_now
from labkit.tokenizer.bpe import BPETokenizer

__all__ = ["compression", "truncate", "VocabSweep", "vocab_sweep"]

_WORD = regex.compile(r"\p{L}+(?:'\p{L}+)*|\p{N}+")


def compression(tok: BPETokenizer, text: str) -> dict:
    """Token count of `text` and the two ratios that describe a tokenizer's compression."""
    n_tokens = len(tok.encode(text, allowed_special="none"))
    n_bytes = len(text.encode("utf-8"))
    n_words = len(_WORD.findall(text))
    return {
        "tokens": n_tokens,
        "bytes": n_bytes,
        "words": n_words,
        "bytes_per_token": n_bytes / max(n_tokens, 1),
        "tokens_per_word": n_tokens / max(n_words, 1),
    }


def truncate(tok: BPETokenizer, vocab_size: int) -> BPETokenizer:
    """The tokenizer with only the first `vocab_size - 256` merges (no special tokens)."""
    if tok.merges is None or any(len(tok.token_bytes(b)) != 1 or tok.token_bytes(b)[0] != b for b in range(256)):
        raise ValueError("truncate needs a tokenizer trained by labkit (bytes are ids 0..255, merges known)")
    if not 256 <= vocab_size <= 256 + len(tok.merges):
        raise ValueError(f"vocab_size must be in [256, {256 + len(tok.merges)}], got {vocab_size}")
    tokens = [tok.token_bytes(i) for i in range(vocab_size)]
    return BPETokenizer(tokens, tok.pattern, merges=tok.merges[: vocab_size - 256], name=f"{tok.name}-{vocab_size}")


@dataclass
class VocabSweep:
    """Compression and training time at each vocabulary size (lists aligned with `vocab_sizes`)."""

    vocab_sizes: list[int]
    bytes_per_token: list[float]
    tokens_per_word: list[float]
    train_seconds: list[float]
    tokenizer: BPETokenizer  # trained to the largest size
    train_bytes: int
    eval_bytes: int

    def at(self, vocab_size: int) -> dict:
        """The row for one vocabulary size (it must be one of `vocab_sizes`)."""
        if vocab_size not in self.vocab_sizes:
            raise ValueError(f"vocab_size must be one of {self.vocab_sizes}, got {vocab_size}")
        i = self.vocab_sizes.index(vocab_size)
        return {
            "vocab_size": vocab_size,
            "bytes_per_token": self.bytes_per_token[i],
            "tokens_per_word": self.tokens_per_word[i],
            "train_seconds": self.train_seconds[i],
        }


def vocab_sweep(train_text: str, eval_text: str, vocab_sizes: list[int], pattern: str = "gpt4") -> VocabSweep:
    """Train once to max(vocab_sizes); measure every size on `eval_text`.

    `train_seconds[i]` is the wall time until the merge that reaches `vocab_sizes[i]`
    (pre-tokenization included), read from the same run.
    """
    vocab_sizes = sorted(set(int(v) for v in vocab_sizes))
    if not vocab_sizes or vocab_sizes[0] < 256:
        raise ValueError(f"vocab_sizes must be at least 256, got {vocab_sizes}")
    stamps = [0.0]
    start = clock_now()
    tok = BPETokenizer.train(train_text, vocab_sizes[-1], pattern=pattern, progress=lambda done, total: stamps.append(clock_now() - start))
    total = clock_now() - start
    sizes = [v for v in vocab_sizes if v <= 256 + len(tok.merges)]
    bpt, tpw, secs = [], [], []
    for v in sizes:
        c = compression(truncate(tok, v), eval_text)
        bpt.append(c["bytes_per_token"])
        tpw.append(c["tokens_per_word"])
        # 256 ids = no merge: the time to pre-tokenize and count, about that of the first merge.
        secs.append(stamps[max(v - 256, 1)] if len(stamps) > 1 else total)
    return VocabSweep(sizes, bpt, tpw, secs, tok, len(train_text.encode("utf-8")), len(eval_text.encode("utf-8")))
