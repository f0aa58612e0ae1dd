"""The checker of the speculation-under-load deep dive accepts the answer derived from the statement and rejects the
plausible wrong ones."""
import pytest

from tests.conftest import assert_checker_separates


def _share(m, t, target, *, cap=True, own_token=True, cost_extra=True):
    if target <= 1:
        return 0.0
    gain = m if own_token else m - 1
    extra = (t - 1) if cost_extra else t
    denom = gain - target * extra
    if denom <= 0:
        return None
    s = (target - 1) / denom
    return s if s <= 1 or not cap else None


@pytest.mark.parametrize("wrong", [
    lambda *a: _share(*a, cap=False),          # a share above 1 called reachable
    lambda *a: _share(*a, own_token=False),    # counts the pass's own token as drafted
    lambda *a: _share(*a, cost_extra=False),   # prices a draft pass at t on top of the plain pass
    lambda m, t, target: (target - 1) / m,     # leaves the draft pass's cost out
])
def test_the_share_checker_passes_the_derivation_and_fails_a_broken_one(wrong, capsys):
    assert_checker_separates("check_needed_share", _share, wrong, capsys)


def test_the_share_reaches_its_target_in_the_pass_count_model():
    from labkit.exercises.spec_under_load import _reference_needed_share

    for m, t, target in ((1.0, 1.43, 1.3), (2.0, 1.13, 1.5), (3.0, 1.5, 2.0)):
        s = _reference_needed_share(m, t, target)
        passes = 1000
        tokens, time = passes * (1 + s * m), passes * (1 - s + s * t)
        assert tokens / time == pytest.approx(target)
