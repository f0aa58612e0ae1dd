"""The logits processors one by one: penalties, temperature and the truncation filters.

Each function takes logits `[B, V]` (float) and returns new logits `[B, V]`; a removed
token gets `-inf`, so a later softmax renormalises over the survivors. The definitions
follow Hugging Face transformers (`generation/logits_process.py`): the repetition
penalty of CTRL (Keskar et al. 2019) with the sign split, top-k (Fan et al. 2018),
top-p / nucleus (Holtzman et al. 2020), min-p (Nguyen et al. 2024), locally typical
sampling (Meister et al. 2023); frequency and presence penalties follow the OpenAI API
(as in vLLM and llama.cpp). `labkit.sampling` chains them in a documented order.

    >>> import torch
    >>> l = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    >>> top_k_filter(l, 2).isfinite().tolist()
    [[True, True, False, False]]
"""
from __future__ import annotations

import torch

__all__ = [
    "apply_temperature",
    "top_k_filter",
    "top_p_filter",
    "min_p_filter",
    "typical_filter",
    "greedy_filter",
    "apply_repetition_penalty",
    "apply_frequency_presence_penalty",
    "token_counts",
]

NEG_INF = float("-inf")


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """`logits / T`: T < 1 sharpens the distribution, T > 1 flattens it (T > 0).

    >>> apply_temperature(torch.tensor([[2.0, -1.0]]), 0.5).tolist()
    [[4.0, -2.0]]
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 here (0 means greedy), got {temperature}")
    return logits / temperature


def top_k_filter(logits: torch.Tensor, top_k: int, min_keep: int = 1) -> torch.Tensor:
    """Keep the k largest logits. Ties with the k-th value are all kept (as in HF).

    >>> top_k_filter(torch.tensor([[1.0, 3.0, 2.0]]), 1).tolist()
    [[-inf, 3.0, -inf]]
    """
    k = min(max(int(top_k), min_keep), logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # [B, 1]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: torch.Tensor, top_p: float, min_keep: int = 1) -> torch.Tensor:
    """Nucleus: keep the smallest set of most likely tokens whose mass is >= top_p.

    The token that crosses the threshold is kept. Computed like HF: sort ascending,
    remove the prefix whose cumulative probability is <= 1 - top_p.

    >>> l = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    >>> top_p_filter(l, 0.75).isfinite().tolist()
    [[True, True, False, False]]
    """
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cum <= (1 - top_p)
    remove_sorted[..., -min_keep:] = False  # the largest ones always survive
    remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)


def min_p_filter(logits: torch.Tensor, min_p: float, min_keep: int = 1) -> torch.Tensor:
    """Keep tokens with probability >= min_p * (probability of the most likely token).

    >>> l = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    >>> min_p_filter(l, 0.2).isfinite().tolist()   # threshold 0.2 * 0.5 = 0.1
    [[True, True, True, False]]
    """
    probs = logits.softmax(dim=-1)
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)
    if min_keep <= 1:  # the most likely token always passes (min_p <= 1): no sort needed
        return logits.masked_fill(remove, NEG_INF)
    order = torch.argsort(logits, dim=-1, descending=True)
    remove_sorted = remove.gather(-1, order)
    remove_sorted[..., :min_keep] = False
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)


def typical_filter(logits: torch.Tensor, typical_p: float, min_keep: int = 1) -> torch.Tensor:
    """Locally typical sampling: keep the tokens whose surprisal is closest to the entropy,
    in that order, until their mass reaches typical_p (the crossing token included).

    >>> l = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    >>> typical_filter(l, 0.5).isfinite().tolist()
    [[True, True, False, False]]
    """
    logp = logits.log_softmax(dim=-1)
    entropy = -(logp * logp.exp()).nansum(dim=-1, keepdim=True)  # -inf * 0 = nan is skipped
    distance = (-logp - entropy).abs()  # how far each token's surprisal is from the entropy
    sorted_dist, order = torch.sort(distance, dim=-1, descending=False)
    cum = logits.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
    last = (cum < typical_p).sum(dim=-1, keepdim=True).clamp(max=logits.shape[-1] - 1)
    remove_sorted = sorted_dist > sorted_dist.gather(-1, last)
    remove_sorted[..., :min_keep] = False
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)


def greedy_filter(logits: torch.Tensor) -> torch.Tensor:
    """Keep only the argmax; ties go to the lowest token id.

    >>> greedy_filter(torch.tensor([[1.0, 3.0, 3.0]])).tolist()
    [[-inf, 3.0, -inf]]
    """
    best = torch.argmax(logits, dim=-1, keepdim=True)  # documented: first maximal index
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, best, True)
    return logits.masked_fill(~keep, NEG_INF)


def token_counts(history: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Count each token id in each row of `history [B, T]` -> LongTensor `[B, V]`; negative ids are padding.

    >>> token_counts(torch.tensor([[2, 2, 0, -1]]), 4).tolist()
    [[1, 0, 2, 0]]
    """
    padded = torch.where(history < 0, vocab_size, history)  # padding goes to an extra column, dropped below
    counts = torch.zeros(history.shape[0], vocab_size + 1, dtype=torch.long, device=history.device)
    counts.scatter_add_(1, padded, torch.ones_like(padded))
    return counts[:, :vocab_size]


def apply_repetition_penalty(logits: torch.Tensor, counts: torch.Tensor, penalty: float) -> torch.Tensor:
    """Once per distinct seen token: divide a positive logit by the penalty, multiply a negative one.

    `counts [B, V]` comes from `token_counts`. penalty > 1 discourages repeats, < 1 rewards them.

    >>> apply_repetition_penalty(torch.tensor([[2.0, -1.0, 0.5, 0.0]]), torch.tensor([[1, 2, 0, 1]]), 2.0).tolist()
    [[1.0, -2.0, 0.5, 0.0]]
    """
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(counts > 0, penalised, logits)


def apply_frequency_presence_penalty(
    logits: torch.Tensor, counts: torch.Tensor, frequency_penalty: float, presence_penalty: float
) -> torch.Tensor:
    """`l - count * frequency_penalty - [count > 0] * presence_penalty` (OpenAI's definition).

    >>> apply_frequency_presence_penalty(torch.tensor([[1.0, 1.0]]), torch.tensor([[3, 0]]), 0.5, 0.25).tolist()
    [[-0.75, 1.0]]
    """
    counts_f = counts.to(logits.dtype)
    return logits - counts_f * frequency_penalty - (counts_f > 0).to(logits.dtype) * presence_penalty
