"""Exercises of chapter 07: the accept/reject step, tokens per round when acceptance depends on the position,
and the draft cost at which drafting stops paying on a measured T(k) row.

`check_verify_draft` tests properties of the learner's sampler, not its outputs case by case: a draft equal to
the target is never rejected, a token the target gives zero probability is always rejected, the round stops at
its first rejection (with the replacement from that position's residual), the first emitted
token follows the target (a chi-squared test with a fixed seed, beside a negative control: the same counts
against the draft's distribution), and a round whose drafts all pass adds a bonus token from the last row.
"""
from __future__ import annotations

import torch

from labkit.exercises._core import Verdict, check

__all__ = ["check_verify_draft", "check_tokens_per_round", "check_break_even_c"]

# chi-squared critical values at p = 1e-4 by degrees of freedom (a correct sampler fails one test in 10,000)
_CHI2_CRIT = {5: 25.74}
_TARGET = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04], dtype=torch.float64)
_POOR_DRAFT = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.25, 0.25], dtype=torch.float64)


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = float(counts.sum())
    expected = probs * n
    return float(((counts.double() - expected) ** 2 / expected).sum())


def _call(fn, p, q, draft, gen):
    got = fn(p.clone(), q.clone(), draft.clone(), gen)
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise TypeError(f"expected a pair (accepted, next_token), got {got!r}"[:200])
    n, nxt = int(got[0]), int(got[1])
    if not 0 <= n <= draft.numel():
        raise ValueError(f"accepted = {n} is outside 0 .. gamma = {draft.numel()}")
    if not 0 <= nxt < p.shape[1]:
        raise ValueError(f"next_token = {nxt} is not a token of the {p.shape[1]}-token vocabulary")
    return n, nxt


def check_verify_draft(fn, trials: int = 4000) -> Verdict:
    """Check `fn(p, q, draft, generator) -> (accepted, next_token)`: one round of speculative sampling.

    p [γ+1, V]: the target's distributions at the γ draft positions and after them; q [γ, V]: the draft's;
    draft [γ]: the drafted tokens (each drawn from its row of q); `generator`: the torch.Generator to draw from.
    """
    name = "verify_draft"
    gen = torch.Generator().manual_seed(0)
    try:
        # 1. a draft that is the target is never rejected (random distributions over 8 tokens, gamma = 3)
        for _ in range(200):
            p = torch.rand(4, 8, generator=gen, dtype=torch.float64) ** 3 + 1e-3
            p = p / p.sum(-1, keepdim=True)
            draft = torch.stack([torch.multinomial(p[i], 1, generator=gen)[0] for i in range(3)])
            n, _ = _call(fn, p, p[:3].clone(), draft, gen)
            if n != 3:
                print(f"[FAIL] {name}: a draft equal to the target (q = p) was rejected at position {n + 1}")
                print("       hint: accept with probability min(1, p(x) / q(x)), which is 1 when q = p")
                return Verdict(False)
        # 2. a token the target never emits is always rejected, and never comes back as the replacement
        p = torch.stack([torch.tensor([0.0, 0.5, 0.5, 0.0], dtype=torch.float64), torch.full((4,), 0.25, dtype=torch.float64)])
        q = torch.tensor([[0.7, 0.1, 0.1, 0.1]], dtype=torch.float64)
        for _ in range(100):
            n, nxt = _call(fn, p, q, torch.tensor([0]), gen)
            if n != 0 or nxt in (0, 3):
                print(f"[FAIL] {name}: p(x) = 0 for the drafted x = 0 but the round returned accepted = {n}, "
                      f"next_token = {nxt}")
                print("       hint: p(x) / q(x) = 0 rejects always; the replacement comes from the residual "
                      "norm(max(0, p - q)), which is zero wherever p is")
                return Verdict(False)
        # 3. the round stops at the first rejection: position 1 always passes (q = p), position 2 always fails
        # (p(0) = 0), position 3 would pass half the time; what comes back is 1 accepted and a token of position 2's
        # residual ({2, 3}), never a count that includes position 3 or a token of its residual ({0, 1})
        p = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 0.5, 0.5], [0.3, 0.3, 0.4, 0.0], [0.25, 0.25, 0.25, 0.25]],
                         dtype=torch.float64)
        q = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.6, 0.0, 0.2, 0.2], [0.1, 0.1, 0.8, 0.0]], dtype=torch.float64)
        for _ in range(100):
            draft = torch.tensor([int(torch.multinomial(q[0], 1, generator=gen)), 0, 2])
            n, nxt = _call(fn, p, q, draft, gen)
            if n != 1 or nxt not in (2, 3):
                print(f"[FAIL] {name}: drafts {draft.tolist()}: position 1 always passes (q = p), position 2 always "
                      f"fails (p(0) = 0), so the round must return accepted = 1 and a token of position 2's residual "
                      f"(2 or 3); it returned accepted = {n}, next_token = {nxt}")
                print("       hint: stop at the first rejection: later drafts were guessed after a token the target "
                      "refused, and the replacement comes from that position's residual")
                return Verdict(False)
        # 4. the first emitted token follows the target, whatever the draft (gamma = 1)
        p = torch.stack([_TARGET, torch.full((6,), 1 / 6, dtype=torch.float64)])
        counts = torch.zeros(6, dtype=torch.long)
        for _ in range(trials):
            x = torch.multinomial(_POOR_DRAFT, 1, generator=gen)
            n, nxt = _call(fn, p, _POOR_DRAFT[None], x, gen)
            counts[int(x[0]) if n else nxt] += 1
        vs_p, vs_q = _chi2(counts, _TARGET), _chi2(counts, _POOR_DRAFT)
        if vs_p > _CHI2_CRIT[5]:
            print(f"[FAIL] {name}: over {trials} rounds the first emitted token is not distributed as the target: "
                  f"chi-squared {vs_p:.1f} > {_CHI2_CRIT[5]} (5 degrees of freedom, p = 1e-4)")
            print(f"       emitted shares: {[round(v, 3) for v in (counts.double() / trials).tolist()]}; "
                  f"target: {_TARGET.tolist()}")
            print("       hint: a rejected position draws from norm(max(0, p - q)), not from p or q")
            return Verdict(False)
        if vs_q <= _CHI2_CRIT[5]:  # the negative control: these counts must be far from the draft's distribution
            raise AssertionError("the chi-squared test cannot tell the target from the draft at this sample size")
        # 5. the second emitted token follows the target too, given that the first draft passed (gamma = 2, q != p
        # at both positions): each position needs its own uniform draw, a shared one couples the two tests
        p = torch.stack([_TARGET, _TARGET.flip(0), torch.full((6,), 1 / 6, dtype=torch.float64)])
        q = torch.stack([_POOR_DRAFT, _POOR_DRAFT])
        second = torch.zeros(6, dtype=torch.long)
        for _ in range(2 * trials):
            draft = torch.stack([torch.multinomial(q[i], 1, generator=gen)[0] for i in range(2)])
            n, nxt = _call(fn, p, q, draft, gen)
            if n >= 1:
                second[int(draft[1]) if n == 2 else nxt] += 1
        if _chi2(second, p[1]) > _CHI2_CRIT[5]:
            print(f"[FAIL] {name}: over rounds whose first draft passed, the second emitted token is not distributed "
                  f"as the target's second row: chi-squared {_chi2(second, p[1]):.1f} > {_CHI2_CRIT[5]}")
            print(f"       emitted shares: {[round(v, 3) for v in (second.double() / second.sum()).tolist()]}; "
                  f"target: {[round(v, 3) for v in p[1].tolist()]}")
            print("       hint: the second position's test must not depend on how the first one's went")
            return Verdict(False)
        # 6. all drafts accepted: the bonus token comes from the last row of p
        bonus_row = torch.tensor([0.05, 0.05, 0.10, 0.15, 0.25, 0.40], dtype=torch.float64)
        p = torch.stack([_TARGET, _POOR_DRAFT, bonus_row])
        bonus = torch.zeros(6, dtype=torch.long)
        for _ in range(trials // 2):
            draft = torch.stack([torch.multinomial(p[i], 1, generator=gen)[0] for i in range(2)])
            n, nxt = _call(fn, p, p[:2].clone(), draft, gen)
            bonus[nxt] += 1
        if _chi2(bonus, bonus_row) > _CHI2_CRIT[5]:
            print(f"[FAIL] {name}: when every draft passes, the token after them is not drawn from p[gamma] "
                  f"(shares {[round(v, 3) for v in (bonus.double() / bonus.sum()).tolist()]}, p[gamma] "
                  f"{bonus_row.tolist()})")
            print("       hint: the target's pass gave gamma + 1 rows; the last one is free, use it for a bonus token")
            return Verdict(False)
    except NotImplementedError:
        print(f"[TODO] {name}: not implemented yet - replace the `raise NotImplementedError` with your code.")
        return Verdict(False)
    except AssertionError:
        raise
    except Exception as exc:  # the learner's bug, reported, not raised
        print(f"[FAIL] {name}: raised {type(exc).__name__}: {str(exc)[:200]}")
        print("       hint: probabilities must be non-negative (clamp p - q at zero) and a probability above 1 "
              "is not one (min(1, p/q))")
        return Verdict(False)
    print(f"[PASS] {name}: q = p never rejected, p(x) = 0 always rejected, the round stops at the first rejection, "
          "first and second tokens distributed as the target (chi-squared tests at p = 1e-4), bonus token from the "
          "last row.")
    return Verdict(True)


def _tokens_per_round(alphas) -> float:
    total, reach = 1.0, 1.0
    for a in alphas:
        reach *= a
        total += reach
    return total


def check_tokens_per_round(fn) -> Verdict:
    """Check `fn(alphas) -> tokens` a round emits on average, where alphas[i] is the probability that draft
    position i + 1 is accepted given that every position before it was."""
    cases = [([],), ([0.5] * 4,), ([1.0, 1.0, 1.0],), ([0.9, 0.0, 0.9],), ([0.47, 0.33, 0.11, 0.0],),
             ([0.2, 0.9, 0.9, 0.9, 0.9],), ([0.0],)]
    return check("tokens_per_round", fn, _tokens_per_round, cases,
                 hint="a round always emits one token of the target's own; draft position i is emitted only if "
                      "positions 1 .. i all pass, and that probability is a product")


def _break_even_c(alpha, t_rel, overhead):
    from labkit.speculative import expected_tokens

    best = max((expected_tokens(alpha, k - 1) - t - overhead) / (k - 1) for k, t in t_rel.items() if k >= 2)
    return best if best > 0 else None


def check_break_even_c(fn, t_rel: dict, overhead: float = 0.0) -> Verdict:
    """Check `fn(alpha, t_rel, overhead) -> c`: the largest draft cost (per drafted token, in units of T(1)) at which
    the best γ still beats plain decoding, for acceptance α, a T(k)/T(1) row {k: ratio} and the loop's own work per
    round `overhead` (in units of T(1), `speculative.costs.round_overhead`); None where no γ pays even with free
    drafts. Cases: the row and loop cost measured on this machine (`t_rel`, `overhead`) and a few made-up ones."""
    if not (isinstance(t_rel, dict) and t_rel and all(isinstance(k, int) and k >= 2 for k in t_rel)):
        raise ValueError(f"t_rel must be a measured row {{k: T(k)/T(1)}} with integer k >= 2, got {t_rel!r}"[:200])
    if not (isinstance(overhead, (int, float)) and overhead >= 0):
        raise ValueError(f"overhead must be a number >= 0 (a round's extra cost relative to T(1)), got {overhead!r}")
    measured = {k: float(v) for k, v in t_rel.items()}
    flat = {k: 1.0 for k in range(2, 10)}
    step = {k: 1.5 for k in range(2, 10)}  # every extra token costs the same: larger gammas amortise it
    linear = {k: float(k) for k in range(2, 10)}  # a pass over k tokens costs k steps: drafting never pays
    jump = {2: 1.0, 3: 1.05, 4: 1.1, 5: 2.0, 6: 2.05, 7: 2.1, 8: 2.2, 9: 3.0}  # a kernel working in blocks of 4
    cases = [(a, measured, float(overhead)) for a in (0.3, 0.5, 0.8, 0.95)]
    cases += [(a, measured, 0.0) for a in (0.5, 0.8)]
    cases += [(0.5, flat, 0.0), (0.5, flat, 0.3), (0.9, step, 0.2), (0.95, linear, 0.0), (0.0, flat, 0.0),
              (0.8, jump, 0.0), (0.97, jump, 0.5), (0.6, flat, 0.7)]
    return check("break_even_c", fn, _break_even_c, cases,
                 hint="drafting pays while E(gamma) > gamma*c + T(gamma+1)/T(1) + overhead; solve for c at each gamma "
                      "the row allows (gamma = k - 1) and keep the best; None if even c = 0 does not pay")
