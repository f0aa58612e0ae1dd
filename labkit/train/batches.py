"""Training data as token ids: the corpus encoded once, random windows to train on, fixed windows to validate on.

A batch is `batch_size` windows of `seq_len + 1` consecutive tokens drawn at random
offsets (a seeded `torch.Generator`, so two runs see the same batches); the model reads
the first `seq_len` and predicts the last `seq_len`. Validation uses evenly spaced,
non-overlapping windows of the held-out plays, the same every time.
"""
from __future__ import annotations

import torch

__all__ = ["encode_split", "Batches", "eval_windows"]


def encode_split(tok, text: str) -> torch.Tensor:
    """The whole text as one LongTensor of ids (special tokens are not parsed in the corpus)."""
    ids = tok.encode(text, allowed_special="none")
    return torch.tensor(ids, dtype=torch.long)


class Batches:
    """Random windows of `ids`: `next()` -> (inputs [B, T], targets [B, T]); deterministic for a seed."""

    def __init__(self, ids: torch.Tensor, batch_size: int, seq_len: int, seed: int = 0):
        if ids.dim() != 1 or ids.numel() <= seq_len + 1:
            raise ValueError(f"need more than seq_len + 1 = {seq_len + 1} tokens of data, got {ids.numel()}")
        self.ids, self.batch_size, self.seq_len = ids, batch_size, seq_len
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, self.ids.numel() - self.seq_len - 1, (self.batch_size,), generator=self.generator)
        rows = torch.stack([self.ids[s:s + self.seq_len + 1] for s in starts.tolist()])
        return rows[:, :-1], rows[:, 1:]


def eval_windows(ids: torch.Tensor, seq_len: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` evenly spaced windows (inputs, targets) [n, seq_len] over the whole of `ids`."""
    span = seq_len + 1
    if ids.numel() < span:
        raise ValueError(f"validation text has {ids.numel()} tokens, fewer than one window of {span}")
    n = min(n, ids.numel() // span)
    gap = (ids.numel() - span) // max(1, n - 1) if n > 1 else 0
    rows = torch.stack([ids[i * gap:i * gap + span] for i in range(n)])
    return rows[:, :-1], rows[:, 1:]
