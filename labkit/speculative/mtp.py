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

A draft step that ran the full LM head would cost what a fifth of SmolLM2's forward costs
(the head is 28 M of its 135 M parameters). `vocab_ids` restricts the head's output to the
most frequent tokens: the draft reads only those rows, and a token outside them is never
proposed (the target still decides, so the output stays exact).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from labkit.kvcache.base import forward_pass, new_cache
from labkit.model.transformer import Block, RMSNorm, linear
from labkit.sampling.pipeline import sample_next

__all__ = ["MTPHead", "MTPDrafter", "save_head", "load_head", "head_step_s"]


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
        return linear(backbone.norm(h), self._head_rows(backbone))

    def _head_rows(self, backbone) -> torch.Tensor:
        key = (backbone.output_weight().data_ptr(), self.vocab_ids.data_ptr())
        if getattr(self, "_rows_key", None) != key:  # gathered once: a contiguous [K, d] slab the draft reads
            self._rows = backbone.output_weight().detach().index_select(0, self.vocab_ids).contiguous()
            self._rows_key = key
        return self._rows

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class MTPDrafter:
    """Speculative drafter from an `MTPHead` on the target's own hidden states (`labkit.speculative.generate`).

    It hooks the target's last block to see the hidden states of every target pass, catches its
    own one-layer cache up on the positions the target just verified, then chains γ head steps.
    """

    def __init__(self, target, head: MTPHead):
        if head.config.d_model != target.config.d_model or head.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"the head was made for d_model={head.config.d_model}, vocab_size={head.config.vocab_size}; "
                             f"the target has {target.config.d_model} and {target.config.vocab_size}")
        self.target, self.head = target, head
        self.steps = 0
        self._hidden: torch.Tensor | None = None  # [T, d] of the target's latest pass
        self._start = 0  # the position of that pass's first token
        self._hooks = [target.register_forward_pre_hook(self._begin, with_kwargs=True),
                       target.layers[-1].register_forward_hook(self._capture)]
        self.cache = None

    @classmethod
    def from_file(cls, target, path=None) -> "MTPDrafter":
        """The head trained for SmolLM2 (`labkit train --model smollm2-mtp`, data/smollm2-mtp.safetensors) on `target`."""
        from labkit.data import paths

        path = paths.data_path("smollm2-mtp.safetensors") if path is None else path
        if not Path(path).exists():
            raise FileNotFoundError(f"no MTP head at {path}: train one with `labkit train --model smollm2-mtp`")
        head, _ = load_head(path, target)
        return cls(target, head)

    def _begin(self, module, args, kwargs) -> None:
        cache = kwargs.get("cache", args[1] if len(args) > 1 else None)
        self._start = 0 if cache is None else cache.seq_len

    def _capture(self, module, args, output) -> None:
        self._hidden = (output[0] if output.dim() == 3 else output).detach()  # [T, d] of batch row 0 (the model's blocks run on [B·T, d])

    def close(self) -> None:
        """Remove the hooks from the target (the drafter cannot be used afterwards)."""
        for hook in self._hooks:
            hook.remove()

    def attach(self, target_cache) -> None:
        """A new reply: a fresh head cache as long as the target's."""
        self.cache = new_cache("contiguous", self.head.config, max_len=target_cache.max_len,
                               dtype=self.target.dtype, device=self.target.device)
        self._start, self._hidden = 0, None

    @torch.inference_mode()
    def propose(self, history: list[int], gamma: int, params, generator=None):
        if self.cache is None or self._hidden is None:
            raise RuntimeError("MTPDrafter needs attach(cache) and a target pass first (labkit.speculative.generate does both)")
        # the target's last pass covered positions start .. start+T-1 of history; those it produced tokens for
        # are verified: their hidden states and the tokens that followed are the head's true inputs
        start = self._start
        keep = len(history) - 1 - start  # positions start .. len(history)-2 are verified now
        if not 1 <= keep <= self._hidden.shape[0]:
            raise RuntimeError(f"the target's last pass (positions {start}..{start + self._hidden.shape[0] - 1}) does not "
                               f"end where the history does ({len(history)} tokens)")
        self.cache.truncate(min(self.cache.seq_len, start))
        h = self._hidden[:keep][None]  # [1, keep, d]
        nxt = torch.tensor([history[start + 1:start + 1 + keep]], device=h.device)
        out = self.head(self.target, h, nxt, self.cache)[:, -1:]  # [1, 1, d]: predicts history[-1]'s successor
        tokens = []
        vocab = self.head.vocab_ids
        for i in range(gamma):
            logits = self.head.logits(self.target, out)[0, -1].float()
            token = int(vocab[sample_next(logits)])  # greedy over the head's vocabulary (first maximum on ties)
            tokens.append(token)
            self.steps += 1
            if i + 1 < gamma:
                out = self.head(self.target, out, torch.tensor([[token]], device=out.device), self.cache)
        return tokens, None


@torch.inference_mode()
def head_step_s(target, head: MTPHead, position: int = 64, repeat: int = 5) -> float:
    """Median seconds of one chained draft step (the head on one token + its LM head rows) at `position`."""
    import statistics
    import time

    times = []
    d = target.config.d_model
    for _ in range(repeat + 1):
        cache = new_cache("contiguous", head.config, max_len=position + 2, dtype=target.dtype, device=target.device)
        head(target, torch.zeros(1, position, d, dtype=target.dtype), torch.zeros(1, position, dtype=torch.long), cache)
        h = torch.zeros(1, 1, d, dtype=target.dtype)
        start = time.perf_counter()
        out = head(target, h, torch.ones(1, 1, dtype=torch.long), cache)
        int(torch.argmax(head.logits(target, out)[0, -1]))
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def save_head(head: MTPHead, path, record: dict | None = None) -> Path:
    """Write the head (float16 weights, its vocabulary, config and record in the header) to safetensors."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in head.state_dict().items()}
    meta = {"config": json.dumps(vars(head.config) | {"n_layers": 1}), "record": json.dumps(record or {})}
    save_file(tensors, str(path), metadata=meta)
    return path


def load_head(path, backbone) -> tuple[MTPHead, dict]:
    """Read a head saved by `save_head` for `backbone` (ValueError if its shapes differ)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # safetensors' own error for a file that is not one
        raise ValueError(f"{path} is not a safetensors file holding an MTP head ({type(exc).__name__}: {exc})") from exc
    if "vocab_ids" not in tensors:
        raise ValueError(f"{path} holds no MTP head (no 'vocab_ids' tensor); heads are written by save_head")
    head = MTPHead(backbone.config, vocab_ids=tensors["vocab_ids"])
    own = head.state_dict()
    bad = [k for k in own if k not in tensors or own[k].shape != tensors[k].shape]
    if bad:
        raise ValueError(f"{path} does not fit this backbone (d_model {backbone.config.d_model}): mismatched {bad[:3]}")
    head.load_state_dict({k: v.to(own[k].dtype) for k, v in tensors.items()})
    return head.to(backbone.dtype).eval().requires_grad_(False), json.loads(meta.get("record", "{}"))
