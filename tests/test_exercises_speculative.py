"""Chapter 07's checkers pass the reference answers and fail the plausible wrong ones."""
import pytest
import torch

from labkit import exercises


def residual(p, q):
    r = (p - q).clamp(min=0)
    return r / r.sum()


def verify(p, q, draft, gen, *, accept=lambda px, qx, u: u < min(1.0, px / qx), replacement=residual, bonus_row=None):
    gamma = draft.numel()
    for i in range(gamma):
        x = int(draft[i])
        u = float(torch.rand((), generator=gen))
        if not accept(float(p[i, x]), float(q[i, x]), u):
            return i, int(torch.multinomial(replacement(p[i], q[i]), 1, generator=gen))
    row = gamma if bonus_row is None else bonus_row(gamma)
    return gamma, int(torch.multinomial(p[row], 1, generator=gen))


def verify_counting_every_pass(p, q, draft, gen):  # tests every draft and counts the passes, not the prefix
    passed, first_reject = 0, None
    for i, x in enumerate(draft.tolist()):
        if float(torch.rand((), generator=gen)) < min(1.0, float(p[i, x] / q[i, x])):
            passed += 1
        elif first_reject is None:
            first_reject = int(torch.multinomial(residual(p[i], q[i]), 1, generator=gen))
    if first_reject is None:
        return passed, int(torch.multinomial(p[len(draft)], 1, generator=gen))
    return passed, first_reject


def verify_replacing_from_the_last_rejection(p, q, draft, gen):  # keeps going; the replacement of the last rejection
    n, nxt = None, None
    for i, x in enumerate(draft.tolist()):
        if float(torch.rand((), generator=gen)) >= min(1.0, float(p[i, x] / q[i, x])):
            n = i if n is None else n
            nxt = int(torch.multinomial(residual(p[i], q[i]), 1, generator=gen))
    if n is None:
        return len(draft), int(torch.multinomial(p[len(draft)], 1, generator=gen))
    return n, nxt


def verify_one_uniform_per_round(p, q, draft, gen):  # one u for every position: the tests are coupled
    u = float(torch.rand((), generator=gen))
    for i, x in enumerate(draft.tolist()):
        if not u < min(1.0, float(p[i, x] / q[i, x])):
            return i, int(torch.multinomial(residual(p[i], q[i]), 1, generator=gen))
    return len(draft), int(torch.multinomial(p[len(draft)], 1, generator=gen))


WRONG_VERIFY = {
    "one uniform draw for the whole round": verify_one_uniform_per_round,
    "does not stop at the first rejection (counts every pass)": verify_counting_every_pass,
    "does not stop at the first rejection (the last rejection's replacement)": verify_replacing_from_the_last_rejection,
    "residual without the clamp": lambda p, q, d, g: verify(p, q, d, g, replacement=lambda p, q: (p - q) / (p - q).sum()),
    "resample from p, not the residual": lambda p, q, d, g: verify(p, q, d, g, replacement=lambda p, q: p),
    "resample from q": lambda p, q, d, g: verify(p, q, d, g, replacement=lambda p, q: q),
    "p/q unclipped, as a probability": lambda p, q, d, g: verify(
        p, q, d, g, accept=lambda px, qx, u: bool(torch.bernoulli(torch.tensor(px / qx), generator=g))),
    "accept with min(1, q/p)": lambda p, q, d, g: verify(
        p, q, d, g, accept=lambda px, qx, u: px > 0 and u < min(1.0, qx / px)),
    "accept with p(x) alone": lambda p, q, d, g: verify(p, q, d, g, accept=lambda px, qx, u: u < px),
    "always accept": lambda p, q, d, g: verify(p, q, d, g, accept=lambda px, qx, u: True),
    "forgets the bonus token (reuses the last draft row)": lambda p, q, d, g: verify(
        p, q, d, g, bonus_row=lambda gamma: gamma - 1),
    "returns the accepted count only": lambda p, q, d, g: verify(p, q, d, g)[0],
}


def test_verify_draft_passes_the_reference(capsys):
    assert exercises.check_verify_draft(verify)
    assert "[PASS]" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", sorted(WRONG_VERIFY))
def test_verify_draft_fails_plausible_mistakes(mistake, capsys):
    assert not exercises.check_verify_draft(WRONG_VERIFY[mistake])
    assert "[FAIL]" in capsys.readouterr().out


def test_verify_draft_passes_labkit_and_says_todo_for_the_stub(capsys):
    from labkit.speculative import accept_sampled

    assert exercises.check_verify_draft(lambda p, q, d, g: accept_sampled(p, q, d, g))

    def stub(p, q, draft, generator):
        raise NotImplementedError

    assert not exercises.check_verify_draft(stub)
    assert "[TODO]" in capsys.readouterr().out


def right_tokens(alphas):
    total, reach = 1.0, 1.0
    for a in alphas:
        reach *= a
        total += reach
    return total


@pytest.mark.parametrize("wrong", [
    lambda alphas: 1 + sum(alphas),  # adds the rates: forgets that position i needs 1 .. i - 1 accepted
    lambda alphas: right_tokens(alphas) - 1,  # forgets the target's own token
    lambda alphas: (1 - (sum(alphas) / len(alphas)) ** (len(alphas) + 1)) / (1 - sum(alphas) / len(alphas))
    if alphas and sum(alphas) < len(alphas) else len(alphas) + 1.0,  # the mean rate in the constant-α formula
])
def test_tokens_per_round(wrong, capsys):
    assert exercises.check_tokens_per_round(right_tokens)
    assert not exercises.check_tokens_per_round(wrong)
    out = capsys.readouterr().out
    assert "[PASS]" in out and "[FAIL]" in out


def right_break_even(alpha, t_rel, overhead):
    from labkit.speculative import expected_tokens

    best = max((expected_tokens(alpha, k - 1) - t - overhead) / (k - 1) for k, t in t_rel.items())
    return best if best > 0 else None


def only_gamma_one(alpha, t_rel, overhead):
    c = 1 + alpha - t_rel[2] - overhead
    return c if c > 0 else None


def off_by_one(alpha, t_rel, overhead):  # charges T(gamma) for a pass over gamma + 1 tokens
    from labkit.speculative import expected_tokens

    best = max((expected_tokens(alpha, k) - t - overhead) / k for k, t in t_rel.items())
    return best if best > 0 else None


def zero_not_none(alpha, t_rel, overhead):
    return right_break_even(alpha, t_rel, overhead) or 0.0


def undivided(alpha, t_rel, overhead):  # E - T is the saving of a whole round, not per drafted token
    from labkit.speculative import expected_tokens

    best = max(expected_tokens(alpha, k - 1) - t - overhead for k, t in t_rel.items())
    return best if best > 0 else None


def no_loop(alpha, t_rel, overhead):  # the loop's own work left out (review 07-2)
    return right_break_even(alpha, t_rel, 0.0)


def loop_per_token(alpha, t_rel, overhead):  # the loop charged per drafted token, not once per round
    from labkit.speculative import expected_tokens

    best = max((expected_tokens(alpha, k - 1) - t) / (k - 1) - overhead for k, t in t_rel.items())
    return best if best > 0 else None


@pytest.mark.parametrize("row", [{k: 1.0 + 0.05 * k for k in range(2, 10)},  # a flat-ish machine
                                 {2: 1.53, 3: 1.88, 4: 2.07, 5: 2.21, 6: 1.71, 7: 1.86, 8: 2.19, 9: 2.30}])
@pytest.mark.parametrize("wrong", [only_gamma_one, off_by_one, zero_not_none, undivided, no_loop, loop_per_token])
def test_break_even_c_on_any_measured_row(row, wrong, capsys):
    assert exercises.check_break_even_c(right_break_even, row, 0.27)
    assert not exercises.check_break_even_c(wrong, row, 0.27)
    out = capsys.readouterr().out
    assert "[PASS]" in out and "[FAIL]" in out


def test_break_even_c_names_a_bad_row_or_overhead():
    with pytest.raises(ValueError, match="t_rel must be a measured row"):
        exercises.check_break_even_c(right_break_even, {1: 1.0})
    with pytest.raises(ValueError, match="overhead must be a number >= 0"):
        exercises.check_break_even_c(right_break_even, {2: 1.1}, -0.1)


def test_the_loop_cost_decides_review_07_2():
    """The review's case: int8, alpha 0.5, c 0.239, T(2)/T(1) 1.01, loop 0.268: without the loop the head pays, with it
    it does not."""
    row = {2: 1.01, 3: 1.3}
    assert right_break_even(0.5, row, 0.0) > 0.239 > (right_break_even(0.5, row, 0.268) or 0.0)
