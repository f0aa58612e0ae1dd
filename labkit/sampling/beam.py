"""Beam search with a length penalty and the three early-stopping modes of Hugging Face.

Follows `transformers` `GenerationMixin._beam_search`: at each step every running beam
is extended by every token; the best `max(2, 1 + n_eos) * num_beams` candidates (by summed
log-probability) are walked in order. A candidate that ends in EOS (or reaches
`max_new_tokens`) and ranks among the first `num_beams` becomes a finished hypothesis with
score `sum(logp) / L ** length_penalty`, L = generated length including the EOS; the best
`num_beams` other candidates keep running. Stopping, once `num_beams` hypotheses are done:

* ``early_stopping=True``: stop at once.
* ``early_stopping=False`` (HF's default, a heuristic): stop when the best running beam,
  normalised by its *current* length, cannot beat the worst finished hypothesis.
* ``early_stopping="never"``: the same test with the best length it could still reach
  (`max_new_tokens`) when length_penalty > 0, a true bound: search until no beam can win.

With a labkit model the beams share one KV cache, one batch row each: the prompt is
prefilled once, and after every step `cache.reorder(parents)` gives each surviving beam its
parent's keys and values, so a step feeds one token per beam (HF's `_reorder_cache`).
Any other callable model has every beam's whole sequence recomputed each step.

Differences from HF, on purpose: candidates are ordered by a stable sort (ties go to the
lower beam, then the lower token id), and when fewer than `num_beams` candidates exist
labkit runs fewer beams instead of filling the rest with -1e9 placeholders.

    >>> import torch
    >>> table = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.4, 0.1], [0.3, 0.3, 0.4]]).log()
    >>> model = lambda ids: table[ids]               # a bigram model: [B, T] -> [B, T, V]
    >>> beam_search(model, [0], num_beams=2, max_new_tokens=2).sequences[0]
    [0, 1, 0]
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from labkit import checks
from labkit.sampling.stopping import _id_set

__all__ = ["beam_search", "BeamSearchOutput"]


@dataclass
class BeamSearchOutput:
    """Finished hypotheses, best first: full sequences (prompt included) and their scores."""

    sequences: list[list[int]]
    scores: list[float]          # sum of log-probs / (generated length) ** length_penalty
    sum_logprobs: list[float]
    prompt_len: int
    steps: int                   # decoding steps run before stopping

    @property
    def new_tokens(self) -> list[list[int]]:
        return [s[self.prompt_len:] for s in self.sequences]


def _takes_last_only(model) -> bool:
    try:
        return "last_only" in inspect.signature(getattr(model, "forward", model)).parameters
    except (TypeError, ValueError):
        return False


def _last_logits(model, batch: torch.Tensor, last_only: bool) -> torch.Tensor:
    # without a cache every step re-reads the whole sequence; a labkit model can at least skip
    # the output projection of all but the last position
    out = model(batch, last_only=True) if last_only else model(batch)
    logits = getattr(out, "logits", out)  # a labkit model returns a tensor, an HF model an output object
    return logits[:, -1, :]


class _Recompute:
    """Next-token logits of every running beam by a forward pass over its whole sequence."""

    def __init__(self, model):
        self.model, self.last_only = model, _takes_last_only(model)

    def logits(self, running, parents) -> torch.Tensor:
        batch = torch.tensor([seq for seq, _ in running], dtype=torch.long)  # [R, cur_len]
        return _last_logits(self.model, batch, self.last_only)  # [R, V]


class _Cached:
    """The same logits from a KV cache: the prompt is prefilled once, then every step feeds one
    token per beam after `cache.reorder(parents)` has given each beam its parent's keys and values
    (what Hugging Face's `_reorder_cache` does)."""

    def __init__(self, model, prompt_len: int, max_new_tokens: int):
        self.model = model
        self.cache = model.new_cache(max_len=prompt_len + max_new_tokens, batch_size=1)

    def logits(self, running, parents) -> torch.Tensor:
        if parents is None:  # the first step: prefill the prompt
            ids = torch.tensor([running[0][0]], dtype=torch.long)
            return self.model(ids, cache=self.cache, last_only=True)[:, -1, :]
        self.cache.reorder(parents)
        last = torch.tensor([[seq[-1]] for seq, _ in running], dtype=torch.long)  # [R, 1]
        return self.model(last, cache=self.cache)[:, -1, :]


@torch.no_grad()
def beam_search(
    model,
    ids,
    num_beams: int = 4,
    max_new_tokens: int = 32,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    eos_token_id: int | list[int] | None = None,
    cache: bool | None = None,
) -> BeamSearchOutput:
    """Beam search over `model(ids [B, T]) -> logits [B, T, V]` from one prompt `ids` (list or `[T]`/`[1, T]`).

    length_penalty > 0 favours longer outputs (log-probs are negative), < 0 shorter ones.
    `num_beams=1` is greedy decoding. `cache`: keep a KV cache, one batch row per beam (the
    default when the model has `new_cache`, as a labkit model does), or recompute every
    beam's whole sequence each step (False; any callable model).
    """
    checks.positive_int("num_beams", num_beams)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    prompt = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    if prompt.numel() == 0:
        raise ValueError("ids must hold at least one token")
    eos = _id_set(eos_token_id)
    prompt_len = prompt.numel()
    n_candidates = max(2, 1 + len(eos)) * num_beams
    can_cache = hasattr(model, "new_cache")
    if cache not in (None, True, False):
        raise ValueError(f"cache must be True, False or None (automatic), got {cache!r}")
    if cache and not can_cache:
        raise ValueError("cache=True needs a model with new_cache() (a labkit model); use cache=False")
    use_cache = can_cache if cache is None else cache
    stepper = _Cached(model, prompt_len, max_new_tokens) if use_cache else _Recompute(model)

    running: list[tuple[list[int], torch.Tensor]] = [(prompt.tolist(), torch.zeros(()))]  # (sequence, sum logp)
    parents = None  # for each running beam, the row it came from in the previous step
    finished: list[tuple[float, float, list[int]]] = []  # (score, sum logp, sequence), best first
    step = 0
    while step < max_new_tokens and running:
        logits = stepper.logits(running, parents)  # [R, V]
        logp = torch.log_softmax(logits, dim=-1)
        V = logp.shape[-1]
        sums = torch.stack([s for _, s in running]).to(logp.dtype)
        cand = (sums[:, None] + logp).reshape(-1)  # [R * V], beam-major
        order = torch.sort(cand, descending=True, stable=True).indices[:n_candidates]
        last_step = step + 1 == max_new_tokens
        next_running, next_parents = [], []
        for rank, flat in enumerate(order.tolist()):
            total = cand[flat]
            if torch.isneginf(total):
                break
            beam, token = divmod(flat, V)
            seq = running[beam][0] + [token]
            if token in eos or last_step:
                if rank < num_beams:  # only the top num_beams candidates may finish
                    score = float(total) / (step + 1) ** length_penalty
                    finished.append((score, float(total), seq))
                    finished.sort(key=lambda h: -h[0])  # stable: the earlier of equal scores stays first
                    del finished[num_beams:]
            elif len(next_running) < num_beams:
                next_running.append((seq, total))
                next_parents.append(beam)
        running, parents = next_running, next_parents
        step += 1
        if len(finished) >= num_beams and running:
            if early_stopping is True:
                break
            hyp_len = max_new_tokens if (early_stopping == "never" and length_penalty > 0) else step
            best_possible = float(running[0][1]) / hyp_len ** length_penalty
            if not best_possible > finished[-1][0]:
                break
    if not finished and max_new_tokens == 0:
        finished = [(0.0, 0.0, prompt.tolist())]
    return BeamSearchOutput(
        sequences=[h[2] for h in finished],
        scores=[h[0] for h in finished],
        sum_logprobs=[h[1] for h in finished],
        prompt_len=prompt_len,
        steps=step,
    )
