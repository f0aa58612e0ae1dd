"""Drafting heads inside the serving engine: each request drafts from its own last verified hidden state.

A head (`labkit.speculative`: the chained MTP head, the zero-copy head, the parallel Medusa heads) guesses
the tokens after a request's last one from the hidden state the target computed at the position before it.
In one stream the drafter hooks the target and reads its latest pass; in the engine that pass is packed,
so `HeadDrafts` cuts it up. After every pass the engine hands it each row's outcome (`observe`): a prompt
chunk's n positions are all verified (the tokens after them are known), a decoding row's 1 + k positions
are verified up to the last accepted draft. Their hidden states (the last block's output, which the
drafter's hook keeps for the whole pass) are kept per request until the next draft:

- **MTP** keeps a one-layer cache per request (sized for the request's prompt and reply), caught up on
  every verified position, prompt included, and cut back to the last verified one before each draft
  (`mtp_chain`): a rejected draft rolls back there;
- **zero-copy** keeps nothing of its own: its attention reads the request's last-layer keys and values
  from the engine's blocks (`PagedBatch.layer_kv`), and only the last hidden state is kept;
- **Medusa** reads the last hidden state alone.

Drafts are greedy over the head's vocabulary; verification is the engine's, so replies are the target's.
A request admitted on cached prefix blocks (the engine's prefix cache) computes no hidden state for the cached
positions: its MTP cache starts after them, so the head drafts without the prefix in view and may draft other
tokens than it would for the request alone. That moves acceptance, never a reply. A request aborted while the
engine is idle keeps its state until the next pass ends (`settle`).
"""
from __future__ import annotations

import torch

from labkit.kvcache import new_cache
from labkit.speculative.heads import MedusaDrafter, ZeroCopyDrafter, medusa_guess, zero_copy_chain
from labkit.speculative.mtp import MTPDrafter, mtp_chain

__all__ = ["HeadDrafts", "is_head"]

KINDS = {MTPDrafter: "mtp", ZeroCopyDrafter: "zero-copy", MedusaDrafter: "medusa"}


def is_head(drafter) -> bool:
    """Whether `drafter` drafts from the target's hidden states (one of the heads `HeadDrafts` serves)."""
    return isinstance(drafter, tuple(KINDS))


def _kind(drafter) -> str:
    return next(kind for cls, kind in KINDS.items() if isinstance(drafter, cls))


class _State:
    """One request's verified hidden states not yet handed to its head (rows at positions start .. start + m − 1),
    and, for MTP, its head cache, whose first slot holds position `offset`."""

    def __init__(self, position: int):
        self.start, self.hidden, self.cache, self.offset = position, None, None, position

    def restart(self, position: int, rows: torch.Tensor) -> None:
        """The request's states begin again at `position` (its first pass, or recomputed after a preemption)."""
        self.start, self.hidden = position, rows.clone()
        if self.cache is None or not self.offset <= position <= self.offset + self.cache.seq_len:
            self.cache, self.offset = None, position  # a fresh head cache from here (made at the next draft)


class HeadDrafts:
    """The engine's side of a head drafter (see the module doc): `observe` after each pass, `propose` before one."""

    def __init__(self, drafter, paged):
        if not is_head(drafter):
            raise TypeError(f"drafter must be one of {[c.__name__ for c in KINDS]}, got {type(drafter).__name__}")
        self.drafter, self.paged = drafter, paged
        self.kind = _kind(drafter)
        self.states: dict = {}
        self.steps = 0  # head steps run (a chained head runs one per drafted token, Medusa one per draft)
        # the most tokens one draft can hold: Medusa's parallel heads guess one each; a chained head is unbounded
        self.capacity = drafter.head.n_heads if self.kind == "medusa" else 1 << 30

    def forget(self, keep_ids) -> None:
        """Drop the state of every request not in `keep_ids` (finished, aborted or handed off)."""
        for rid in [r for r in self.states if r not in keep_ids]:
            del self.states[rid]

    def observe(self, rows: list[tuple[object, int, int, int]]) -> None:
        """After a pass: rows [(request, tokens it ran, of which verified, the position of its first)] in the pass's
        order. Keeps each request's verified hidden states (a gap or a step back starts its states again)."""
        hidden = self.drafter._hidden  # [N, d]: the last block's output for every token of the pass
        if hidden is None or hidden.shape[0] != sum(n for _, n, _, _ in rows):
            raise RuntimeError(f"the head's tap holds {None if hidden is None else hidden.shape[0]} hidden states; the "
                               f"pass ran {sum(n for _, n, _, _ in rows)} tokens (was the target run through its hooks?)")
        at = 0
        for req, n, verified, position in rows:
            rows_h, at = hidden[at:at + verified], at + n
            if req.constraint is not None:  # a request under a format constraint never drafts: keep nothing for it
                self.states.pop(req.id, None)
                continue
            if not verified:
                continue
            st = self.states.setdefault(req.id, _State(position))
            if st.hidden is not None and st.start + st.hidden.shape[0] == position:
                st.hidden = torch.cat([st.hidden, rows_h])
            else:
                st.restart(position, rows_h)
            if self.kind != "mtp":  # the other heads read the last verified state only
                st.start, st.hidden = st.start + st.hidden.shape[0] - 1, st.hidden[-1:].clone()

    def ready(self, req) -> bool:
        """Whether `req` has a verified hidden state that ends where the request does (it ran a pass since its last
        token), so its head can draft now."""
        st = self.states.get(req.id)
        return st is not None and st.hidden is not None and st.start + st.hidden.shape[0] == len(req.tokens) - 1

    def propose(self, req, gamma: int) -> list[int]:
        """Up to γ greedy tokens after `req`'s last one, from the hidden state before it (see the module doc)."""
        if not self.ready(req):
            return []  # no verified state that ends where the request does (it has not run a pass since)
        st, history = self.states[req.id], req.tokens
        target = self.drafter.target
        if self.kind == "medusa":
            tokens = medusa_guess(self.drafter.head, target, st.hidden[-1], gamma)
            self.steps += bool(tokens)
            return tokens
        if self.kind == "zero-copy":
            keys, values = self.paged.layer_kv(req.id, target.config.n_layers - 1)
            tokens = zero_copy_chain(self.drafter.head, target, keys, values, st.hidden[-1], history[-1], gamma)
        else:
            if st.cache is None:
                st.cache = new_cache("contiguous", self.drafter.head.config, dtype=target.dtype, device=target.device,
                                     max_len=len(req.prompt) + req.max_new_tokens + 1 - st.offset)
            tokens = mtp_chain(self.drafter.head, target, st.cache, st.start, st.hidden, history, gamma, st.offset)
            # handed to the head's cache; the last verified row is kept, so a request that misses the next pass
            # drafts again from it (the chain cuts the cache back to its position and feeds it once more)
            st.start, st.hidden = st.start + st.hidden.shape[0] - 1, st.hidden[-1:].clone()
        self.steps += len(tokens)
        return tokens
