"""What a drafting head reads of its target: the last block's hidden states of the target's latest pass.

Every head on a frozen backbone (`mtp`: the chained EAGLE-style head, `heads`: the zero-copy head and
the parallel Medusa heads) drafts from the hidden state the target computed at the last verified
position. `HiddenTap` hooks the target to keep the hidden states of its latest pass and the position
that pass started at; `verified(history)` returns the rows the decoding loop has verified since.
`vocab_logits` is the restricted LM head they share: the backbone's final norm and the LM head rows of
the head's `vocab_ids` only, gathered once into a contiguous slab.
"""
from __future__ import annotations

import torch

from labkit.model.transformer import linear

__all__ = ["HiddenTap", "vocab_logits", "vocab_rows"]


class HiddenTap:
    """Hooks on `target`: `_hidden` [T, d] of its latest pass (batch row 0), `_start` that pass's first position."""

    def __init__(self, target):
        self.target = target
        self._hidden: torch.Tensor | None = None
        self._start = 0
        self._hooks = [target.register_forward_pre_hook(self._begin, with_kwargs=True),
                       target.layers[-1].register_forward_hook(self._capture)]

    def _begin(self, module, args, kwargs) -> None:
        cache = kwargs.get("cache", args[1] if len(args) > 1 else None)
        self._start = 0 if cache is None else cache.seq_len

    def _capture(self, module, args, output) -> None:
        self._hidden = (output[0] if output.dim() == 3 else output).detach()  # the model's blocks run on [B·T, d]

    def close(self) -> None:
        """Remove the hooks from the target (the drafter cannot be used afterwards)."""
        for hook in self._hooks:
            hook.remove()

    def reset_tap(self) -> None:
        self._start, self._hidden = 0, None

    def verified(self, history: list[int]) -> tuple[int, torch.Tensor]:
        """(start, h [keep, d]): the hidden states at positions start .. len(history) − 2, which the target's
        latest pass computed and the loop has verified (each was followed by the token after it in `history`)."""
        if self._hidden is None:
            raise RuntimeError(f"{type(self).__name__} needs attach(cache) and a target pass first "
                               "(labkit.speculative.generate does both)")
        keep = len(history) - 1 - self._start
        if not 1 <= keep <= self._hidden.shape[0]:
            raise RuntimeError(f"the target's last pass (positions {self._start}..{self._start + self._hidden.shape[0] - 1})"
                               f" does not end where the history does ({len(history)} tokens)")
        return self._start, self._hidden[:keep]


def vocab_rows(head, backbone) -> torch.Tensor:
    """The backbone's LM head rows of `head.vocab_ids`, [K, d] in the backbone's activation dtype.

    Gathered once per backbone and vocabulary and kept on the backbone for every head with that
    vocabulary: a quantized backbone dequantizes its whole LM head to hand them over, which must happen
    neither at every draft step nor for every new drafter (drafters call this when they are made)."""
    key = (id(backbone), head.vocab_ids.data_ptr(), backbone.dtype)
    if getattr(head, "_rows_key", None) != key:
        store = backbone.__dict__.setdefault("_vocab_rows", {})  # plain attribute: not a buffer, not saved
        vocab = (hash(tuple(head.vocab_ids.tolist())), backbone.dtype)
        if vocab not in store:  # a contiguous [K, d] slab the draft reads
            rows = backbone.output_weight().detach().index_select(0, head.vocab_ids)
            store[vocab] = rows.to(backbone.dtype).contiguous()
        head._rows, head._rows_key = store[vocab], key
    return head._rows


def vocab_logits(head, backbone, h: torch.Tensor) -> torch.Tensor:
    """Logits over `head.vocab_ids` only, [..., K]: the backbone's final norm and those rows of its LM head."""
    rows = vocab_rows(head, backbone)
    return linear(backbone.norm(h).to(rows.dtype), rows)
