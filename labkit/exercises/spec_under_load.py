"""Exercises of the deep dive on speculation under load (09a): what share of a request's passes must carry a draft
for a target speed-up. (Its other checked exercise, which drafted tokens a load-aware budget keeps, is
`check_spec_keep` in the serving exercises.)"""
from __future__ import annotations

from labkit.exercises._core import check

__all__ = ["check_needed_share"]


def _reference_needed_share(accepted_per_draft: float, t_draft: float, target: float) -> float | None:
    # a request runs P passes (each emits its own token); a share s of them carries a draft that costs t_draft plain
    # passes and adds accepted_per_draft tokens: speed-up (1 + s m) / (1 + s (t - 1)) = target, solved for s
    reachable = accepted_per_draft - target * (t_draft - 1.0)
    if target <= 1.0:
        return 0.0
    if reachable <= 0:
        return None
    share = (target - 1.0) / reachable
    return share if share <= 1.0 else None


def _same_share(expected, got) -> bool:
    if expected is None or got is None:
        return expected is got
    try:
        return abs(float(got) - expected) <= 1e-6
    except (TypeError, ValueError):
        return False


def check_needed_share(fn) -> bool:
    """Check `fn(accepted_per_draft, t_draft, target) -> share or None`: the share of a request's passes that must
    carry a draft for its decode speed to reach `target` times plain decoding's, when a pass with a draft costs
    `t_draft` plain passes and adds `accepted_per_draft` accepted tokens on average (a pass without one emits its
    own token only); None when no share up to 1 (a draft on every pass) reaches it, 0.0 for a target of 1 or less."""
    cases = [
        (1.0, 1.43, 1.3),      # a 1 + 3 pass accepting one token on average, on a flat-ish kernel
        (0.6, 1.43, 1.3),      # the same pass, accepting less: a draft on every pass is not enough
        (2.0, 1.13, 1.5),      # a good drafter on a nearly flat pass
        (0.5, 2.24, 1.1),      # a steep pass: unreachable
        (1.2, 1.0, 1.2),       # free verification: a draft on a sixth of the passes is enough
        (1.5, 1.2, 1.0),       # no gain wanted: nothing needed
        (3.0, 1.5, 2.0),       # a long, good draft
    ]
    return check("needed_share", fn, _reference_needed_share, cases, compare=_same_share,
                 hint="with P passes, a share s drafts: tokens P (1 + s m), time P (1 - s + s t); set their ratio to "
                      "the target and solve for s; a share above 1, or a denominator at or below 0, is out of reach")
