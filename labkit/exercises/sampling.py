"""Exercises of chapter 05's sampling half: top-p checked by its properties, and the penalty that flips greedy.

Both checkers test properties and edge cases, not one formula's outputs: top-p must return the
*smallest* top set of tokens reaching `top_p` (any of several tied tokens may be the one kept);
the flip penalty is checked against the repetition penalty as `process_logits` applies it.
"""
from __future__ import annotations

import copy
import math
from typing import Callable

import torch

from labkit.exercises._core import Verdict, _short, run_steps

__all__ = ["check_top_p", "check_flip_penalty", "check_typical_cutoff"]


def property_check(name: str, fn: Callable, cases: list[tuple], prop: Callable, hint: str = "") -> Verdict:
    """Run `fn(*case)` on each case and `prop(case, result)`: None when the result is right, else why not.

    The loop is `run_steps`'; a failure names the case, its input and what came back.
    """
    def step(f, i, case):
        got = f(*copy.deepcopy(case))
        why = prop(case, got)
        return why and f"case {i}/{len(cases)}: {why}\n       input: {_short(case)}\n       got:   {_short(got)}"

    steps = [(lambda f, i=i, case=case: step(f, i, case)) for i, case in enumerate(cases, start=1)]
    return run_steps(name, fn, steps, hint=hint, passed=f"all {len(cases)} cases hold every property.")


# ---- 1. top-p, checked by what the nucleus is -----------------------------------------------------

def _top_p_cases() -> list[tuple]:
    gen = torch.Generator().manual_seed(5)
    f64 = dict(dtype=torch.float64)
    cases = [
        (torch.tensor([0.5, 0.3, 0.15, 0.05], **f64).log(), 0.75),   # keeps 2
        (torch.tensor([0.05, 0.15, 0.5, 0.3], **f64).log(), 0.6),    # unsorted input
        (torch.tensor([0.9, 0.05, 0.05], **f64).log(), 0.5),         # one token is enough
        (torch.zeros(4, **f64), 0.5),                                 # four-way tie: exactly two of them
        (torch.tensor([1.0, 3.0, 1.0, 3.0, 0.0], **f64), 0.6),       # ties at the top and at the crossing
        (torch.tensor([2.0, 1.0, 0.0, -1.0], **f64), 1.0),           # p = 1 keeps every token
        (torch.tensor([0.0, float("-inf"), float("-inf")], **f64), 0.9),  # one token holds all the mass
        (torch.tensor([40.0, 0.0, 0.0, 0.0]), 0.99),                  # float32, nearly all mass on one token
        (torch.tensor([5.0, 4.0, 3.0]), 0.01),                        # tiny p: the favourite alone
    ]
    for top_p in (0.3, 0.9):  # random logits, away from the boundary
        cases.append((torch.randn(50, generator=gen, **f64) * 2, top_p))
    return cases


def _top_p_property(case, got) -> str | None:
    logits, top_p = case
    if not isinstance(got, torch.Tensor) or got.shape != logits.shape:
        return f"expected logits of shape {tuple(logits.shape)}, got {type(got).__name__} {getattr(got, 'shape', '')}"
    kept = torch.isfinite(got)
    if not kept.any():
        return "no token kept: the nucleus always holds at least one token"
    if not torch.equal(got[kept], logits[kept]) or (got[~kept] != float("-inf")).any():
        return "kept tokens must keep their own logits unchanged and the others be -inf"
    if (kept & ~torch.isfinite(logits)).any():
        return "a token with logit -inf (probability 0) was kept"
    probs = logits.double().softmax(-1)
    mass, tol = float(probs[kept].sum()), 1e-9
    if top_p >= 1.0:
        return None if bool(kept[probs > 0].all()) else "top_p = 1 must keep every token with probability > 0"
    if (~kept).any() and float(probs[kept].min()) < float(probs[~kept].max()) - tol:
        return "a removed token is more likely than a kept one: the nucleus is the *most likely* tokens"
    if mass < top_p - tol:
        return f"the kept tokens hold {mass:.4f} of the mass, less than top_p = {top_p}"
    if mass - float(probs[kept].min()) >= top_p - tol:
        return (f"not the smallest set: without its least likely token the set still holds "
                f"{mass - float(probs[kept].min()):.4f} >= top_p = {top_p}")
    return None


def check_top_p(fn) -> Verdict:
    """Check `fn(logits [V], top_p) -> logits [V]` with the removed tokens at -inf.

    The kept tokens must be the smallest set of most likely tokens whose probabilities reach top_p
    (the token that crosses top_p is kept; of tied tokens, any may be kept); top_p = 1 keeps every
    token; the kept logits come back unchanged.
    """
    return property_check("top_p", fn, _top_p_cases(), _top_p_property,
                          hint="rank the tokens by probability, and keep each one while the mass *before* it is "
                               "still below top_p; work on probabilities (softmax), not on logits")


# ---- 2. the repetition penalty that makes greedy leave the history ---------------------------------

def _reference_flip(logits: torch.Tensor, history: list[int]) -> float:
    seen = torch.zeros(logits.numel(), dtype=torch.bool)
    seen[sorted(set(history))] = True
    if seen.all():
        return math.inf
    s, u = float(logits[seen].max()), float(logits[~seen].max())
    if int(logits.argmax()) not in set(history):
        return 1.0
    if s > 0:
        return max(1.0, s / u) if u > 0 else math.inf
    if s < 0:
        return max(1.0, u / s) if u < 0 else 1.0
    return 1.0 if u > 0 else math.inf      # a zero logit is left at zero by every penalty


def _flip_cases() -> list[tuple]:
    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    gen = torch.Generator().manual_seed(7)
    cases = [
        (t(4.0, 1.0, 2.0, -1.0), [0]),            # positive favourite: divide until it falls below 2
        (t(4.0, 3.0, 2.0, -1.0), [0, 1]),         # the runner-up is also in the history: the best *unseen* counts
        (t(4.0, -1.0, -2.0), [0]),                # every unseen logit negative: dividing never goes below 0
        (t(-1.0, -3.0, -2.0), [0]),               # negative favourite: multiplying pushes it down
        (t(0.5, 2.0, -1.0), [0, 0]),              # greedy already picks an unseen token
        (t(3.0, 1.0, 0.5), [0, 0, 0, 2]),         # repeats count once: a distinct token is penalised once
        (t(1.0, 2.0), [0, 1]),                    # everything seen: no penalty helps
        (t(0.0, -1.0, -0.5), [0]),                # a zero logit never moves
        (t(0.0, 0.5, -1.0), [0, 1]),              # seen positive token on top
        (t(2.0, 2.0, 1.0), [1]),                  # tie: greedy picks id 0, which is unseen
    ]
    for _ in range(4):
        logits = torch.randn(12, generator=gen, dtype=torch.float64) * 2
        history = [int(logits.argmax())] + torch.randint(0, 12, (3,), generator=gen).tolist()
        cases.append((logits, history))
    return cases


def _flip_property(case, got) -> str | None:
    logits, history = case
    try:
        got = float(got)
    except (TypeError, ValueError):
        return f"expected a float (math.inf when no penalty works), got {type(got).__name__}"
    want = _reference_flip(logits, history)
    if math.isinf(want) or math.isinf(got):
        return None if got == want else f"expected {want}"
    return None if math.isclose(got, want, rel_tol=1e-6) else f"expected {want:.6g}"


def check_flip_penalty(fn) -> Verdict:
    """Check `fn(logits [V], history: list[int]) -> float`: the smallest repetition penalty >= 1 above which
    greedy decoding no longer picks a token of `history` (1.0 if it already does not; math.inf if no penalty
    gets there). The penalty is CTRL's with Hugging Face's sign rule, applied once per distinct token."""
    return property_check("flip_penalty", fn, _flip_cases(), _flip_property,
                          hint="only two logits matter: the largest seen one and the largest unseen one; follow what "
                               "the penalty does to the seen one as the penalty grows, for each sign")


# ---- 3. the largest typical_p that removes the favourite ------------------------------------------

def _typical_cutoff(logits):
    from labkit.sampling.processors import typical_filter

    fav = int(torch.argmax(logits))
    logp = logits.log_softmax(-1)
    entropy = -(logp * logp.exp()).nansum()
    order = torch.argsort((-logp - entropy).abs(), stable=True)
    # removal is monotone in typical_p: the answer is one of the cumulative masses in typical order
    for p in sorted(set(logits[order].softmax(-1).cumsum(-1).tolist()), reverse=True):
        if 0 < p <= 1 and not torch.isfinite(typical_filter(logits[None], p)[0, fav]):
            return p
    return None


def _cutoff_same(want, got) -> bool:
    if want is None or got is None:
        return want is None and got is None
    try:
        return math.isclose(float(want), float(got), rel_tol=1e-5, abs_tol=1e-7)
    except (TypeError, ValueError):
        return False


def check_typical_cutoff(fn) -> Verdict:
    """Check `fn(logits) -> float or None`: the largest `typical_p` at which typical-p filtering (section 4, as
    `labkit.sampling.processors.typical_filter` applies it) removes the most likely token; None where no
    typical_p in (0, 1] removes it."""
    from labkit.exercises._core import check

    gen = torch.Generator().manual_seed(11)
    cases = [(torch.tensor([0.5, 0.3, 0.15, 0.05]).log(),),          # one token more typical than the favourite
             (torch.tensor([0.6, 0.1, 0.1, 0.1, 0.1]).log(),),        # the favourite is the most typical: never
             (torch.tensor([0.4, 0.35, 0.2, 0.05]).log(),),
             (torch.tensor([0.25, 0.25, 0.25, 0.25]).log(),),         # all equally typical: the favourite stays
             (torch.tensor([0.9, 0.1]).log(),),
             (torch.tensor([3.0, 1.0, 1.0, 0.5, -1.0, float("-inf")]),),
             *[(torch.randn(50, generator=gen) * s,) for s in (1.0, 2.5, 4.0)]]
    return check("typical_cutoff", fn, _typical_cutoff, cases, compare=_cutoff_same,
                 hint="typical-p keeps tokens in order of |surprisal - entropy| until their mass reaches "
                      "typical_p, the crossing token included: the favourite goes only while the tokens more "
                      "typical than it already hold typical_p")
