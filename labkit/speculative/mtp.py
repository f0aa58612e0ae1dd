"""A multi-token-prediction head on a frozen backbone: the drafter phones use.

The head is one transformer block that reads what the backbone already computed and guesses
one token further (the design of EAGLE, Li et al. 2024, and of DeepSeek-V3's MTP module):

    x_t  = W · [norm(h_t) ; norm(embed(token_{t+1}))]      h_t: the backbone's last hidden state at t
    h'_t = Block(x_t)                                      one block, its own single-layer KV cache
    p(token_{t+2}) = softmax(LM head(final norm(h'_t)))    the backbone's own norm and LM head rows

It keeps no second model in memory: the embedding, the final norm and the LM head are the
backbone's (frozen, shared), and its KV cache has one layer where the backbone has all of
them. Drafting γ tokens chains the head on its own output (h'_t stands in for the hidden
state the backbone has not computed yet), so the guesses get worse with depth.

A draft step that ran the full LM head would read a fifth of SmolLM2's weights (28 M of its 135 M
parameters) and cost a large share of a SmolLM2 step (`head_step_s` measures it). `vocab_ids` restricts the head's output to the
most frequent tokens: the draft reads only those rows, and a token outside them is never
proposed (the target still decides, so the output stays exact).
"""
from __future__ import annotations

import torch
from torch import nn

from labkit.kvcache.base import forward_pass, new_cache
from labkit.model.transformer import Block, RMSNorm, linear
from labkit.sampling.pipeline import sample_next
from labkit.speculative.headfile import head_from_file, register_head
from labkit.speculative.tap import HiddenTap, vocab_logits, vocab_rows

__all__ = ["mtp_chain", "MTPHead", "MTPDrafter", "head_step_s"]


@register_head("mtp")
class MTPHead(nn.Module):
    """The trainable part: two input norms, the fusing projection, one block. `vocab_ids`: output tokens (None: all)."""

    def __init__(self, config, vocab_ids: torch.Tensor | None = None):
        super().__init__()
        d = config.d_model
        self.config = config.replace(n_layers=1)
        self.h_norm, self.e_norm = RMSNorm(d, config.norm_eps), RMSNorm(d, config.norm_eps)
        self.fuse = nn.Linear(2 * d, d, bias=False)
        self.block = Block(self.config, 0)
        self.register_buffer("vocab_ids", torch.arange(config.vocab_size) if vocab_ids is None else vocab_ids.long())

    def forward(self, backbone, hidden: torch.Tensor, next_ids: torch.Tensor, cache=None) -> torch.Tensor:
        """h' [B, T, d] for backbone hidden states [B, T, d] at positions p.. and the tokens [B, T] that followed them."""
        e = backbone.tok_embeddings(next_ids)
        x = linear(torch.cat([self.h_norm(hidden), self.e_norm(e)], -1), self.fuse.weight)
        with forward_pass(cache, x.shape[1], x.device) as positions:
            return self.block(x, backbone.rope, positions, cache)

    def logits(self, backbone, h: torch.Tensor) -> torch.Tensor:
        """Logits over `vocab_ids` only, [..., len(vocab_ids)], through the backbone's final norm and LM head rows."""
        return vocab_logits(self, backbone, h)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class MTPDrafter(HiddenTap):
    """Speculative drafter from an `MTPHead` on the target's own hidden states (`labkit.speculative.generate`).

    It hooks the target's last block to see the hidden states of every target pass, catches its
    own one-layer cache up on the positions the target just verified, then chains γ head steps.
    """

    def __init__(self, target, head: MTPHead):
        if head.config.d_model != target.config.d_model or head.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"the head was made for d_model={head.config.d_model}, vocab_size={head.config.vocab_size}; "
                             f"the target has {target.config.d_model} and {target.config.vocab_size}")
        super().__init__(target)
        self.head = head
        self.steps = 0
        vocab_rows(head, target)
        self.cache = None

    @classmethod
    def from_file(cls, target, path=None) -> "MTPDrafter":
        """The head trained for SmolLM2 (`labkit train --model smollm2-mtp`, data/smollm2-mtp.safetensors) on `target`."""
        return cls(target, head_from_file(target, "mtp", path))

    def attach(self, target_cache) -> None:
        """A new reply: a fresh head cache as long as the target's."""
        self.cache = new_cache("contiguous", self.head.config, max_len=target_cache.max_len,
                               dtype=self.target.dtype, device=self.target.device)
        self.reset_tap()

    @torch.inference_mode()
    def propose(self, history: list[int], gamma: int, params, generator=None):
        if self.cache is None:
            raise RuntimeError("MTPDrafter needs attach(cache) and a target pass first (labkit.speculative.generate does both)")
        # the target's last pass covered positions start .. start+T-1 of history; those it produced tokens for
        # are verified: their hidden states and the tokens that followed are the head's true inputs
        start, h = self.verified(history)
        tokens = mtp_chain(self.head, self.target, self.cache, start, h, history, gamma)
        self.steps += len(tokens)
        return tokens, None


def mtp_chain(head: MTPHead, target, cache, start: int, h: torch.Tensor, history: list[int], gamma: int,
              offset: int = 0) -> list[int]:
    """γ greedy tokens of the chained head: its one-layer `cache` is cut back to `start` and caught up on the
    verified hidden states h [keep, d] at positions start .. start + keep − 1 with the tokens that followed them
    (so a rejected draft rolls back by itself), then the head chains on its own guesses. One stream
    (`MTPDrafter`) and each request of the serving engine (`labkit.serving.engine.heads`) draft through it.
    `offset`: the position the cache's first slot holds (a request whose prefix came from the prefix cache has no
    hidden states before it); RoPE scores depend on distances only, so the shifted slots attend exactly alike."""
    keep = h.shape[0]
    if keep < 1 or start < offset or gamma < 0:
        raise ValueError(f"mtp_chain needs at least one verified hidden state (got {keep}), start >= offset (got "
                         f"start={start}, offset={offset}) and gamma >= 0 (got {gamma})")
    # a start past the cache's end (one stream: a round that drafted nothing, so the head never saw that pass) leaves
    # the positions between out of the head's context; its drafts are only guesses, verification keeps them exact
    cache.truncate(min(cache.seq_len, start - offset))
    nxt = torch.tensor([history[start + 1:start + 1 + keep]], device=h.device)
    out = head(target, h[None], nxt, cache)[:, -1:]  # [1, 1, d]: predicts history[-1]'s successor
    tokens, vocab = [], head.vocab_ids
    for i in range(gamma):
        logits = head.logits(target, out)[0, -1].float()
        tokens.append(int(vocab[sample_next(logits)]))  # greedy over the head's vocabulary (first maximum on ties)
        if i + 1 < gamma:
            out = head(target, out, torch.tensor([[tokens[-1]]], device=out.device), cache)
    return tokens


@torch.inference_mode()
def head_step_s(target, head: MTPHead, position: int = 64, repeat: int = 5) -> float:
    """Median seconds of one chained draft step (the head on one token + its LM head rows) at `position`: `repeat`
    rounds of `measure.run` after one warm-up, each on a cache filled to `position` beforehand (untimed)."""
    from labkit import measure

    d = target.config.d_model
    state = {}

    def fill(_name):
        state["cache"] = cache = new_cache("contiguous", head.config, max_len=position + 2, dtype=target.dtype,
                                           device=target.device)
        head(target, torch.zeros(1, position, d, dtype=target.dtype), torch.zeros(1, position, dtype=torch.long), cache)

    def draft_step():
        out = head(target, torch.zeros(1, 1, d, dtype=target.dtype), torch.ones(1, 1, dtype=torch.long), state["cache"])
        int(torch.argmax(head.logits(target, out)[0, -1]))

    run = measure.run({"draft step": draft_step}, rounds=repeat, warmup=1, setup=fill, machine=False, loops=1)
    return run["draft step"].median
