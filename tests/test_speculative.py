"""Speculative decoding: exact in distribution, identical to greedy, reproducible, and its cache rolls back."""
import pytest
import torch

import labkit
from labkit.speculative import DraftModel, LayerSkip, PromptLookup, accept_sampled, expected_tokens, generate, residual
from labkit.tokenizer import BPETokenizer
from tests.kvcache_shared import tiny

CHI2_999 = {9: 27.88}  # the 0.999 quantile of χ² with 9 degrees of freedom


def _chi2(counts: torch.Tensor, p: torch.Tensor) -> float:
    expected = p * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0  # nothing where the target puts no mass
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def _rounds(accept, n=20000, gamma=2, seed=0):
    """Context-free toy: the target's distribution at position i is P[i] whatever came before; the draft's is Q[i]."""
    g = torch.Generator().manual_seed(seed)
    P = torch.softmax(torch.randn(gamma + 1, 10, generator=g) * 1.5, -1)
    Q = torch.softmax(torch.randn(gamma, 10, generator=g) * 1.5, -1)
    first, second = torch.zeros(10), torch.zeros(10)
    for _ in range(n):
        draft = torch.stack([torch.multinomial(Q[i], 1, generator=g)[0] for i in range(gamma)])
        k, nxt = accept(P, Q, draft, g)
        emitted = draft[:k].tolist() + [nxt]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    return P, first, second


def test_verification_reproduces_the_target_distribution():
    for gamma in (1, 2):  # gamma 1: the second token is the bonus whenever the draft passes
        P, first, second = _rounds(accept_sampled, gamma=gamma)
        assert _chi2(first, P[0]) < CHI2_999[9] and _chi2(second, P[1]) < CHI2_999[9]


def test_a_wrong_residual_is_caught():
    def wrong(P, Q, draft, g):  # resamples from p itself after a rejection: biased towards the draft's picks
        for i in range(draft.numel()):
            if float(torch.rand((), generator=g)) >= min(1.0, float(P[i, draft[i]] / Q[i, draft[i]])):
                return i, int(torch.multinomial(P[i], 1, generator=g))
        return draft.numel(), int(torch.multinomial(P[draft.numel()], 1, generator=g))

    P, first, _ = _rounds(wrong)
    assert _chi2(first, P[0]) > 10 * CHI2_999[9]


def test_residual_and_expected_tokens():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.3, 0.5])
    assert torch.allclose(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.equal(residual(p, p), p)
    assert expected_tokens(0.0, 4) == 1 and expected_tokens(1.0, 4) == 5 and expected_tokens(0.5, 2) == 1.75
    with pytest.raises(ValueError, match="alpha must be in"):
        expected_tokens(1.5, 2)


@pytest.fixture(scope="module")
def pair():
    tok = BPETokenizer.train("the cat sat on the mat and the dog sat on the log. " * 6, 280)
    target = tiny(vocab_size=tok.vocab_size, max_seq_len=256)
    with torch.no_grad():  # a draft close to the target: the target with small noise
        draft = tiny(vocab_size=tok.vocab_size, max_seq_len=256)
        for a, b in zip(draft.parameters(), target.parameters()):
            a.copy_(b + 0.05 * torch.randn_like(b))
    return target, draft, tok


@pytest.mark.parametrize("drafter", ["model", "lookup", "layerskip"])
@pytest.mark.parametrize("gamma", [1, 3, "auto"])
def test_greedy_speculation_is_token_for_token_the_target(pair, drafter, gamma):
    target, draft, tok = pair
    d = {"model": lambda: DraftModel(draft), "lookup": PromptLookup, "layerskip": lambda: LayerSkip(target, 1)}[drafter]()
    out = generate(target, d, tok, "the cat sat on the mat and the dog", gamma=gamma, max_new_tokens=30, compare=True,
                   chat=False)
    assert out.plain["same_tokens"], (out.token_ids, out.plain["token_ids"])
    assert len(out.token_ids) == 30 and out.target_calls <= 30
    assert all(0 <= a <= 1 for a in out.acceptance)


def test_sampled_speculation_is_seeded(pair):
    target, draft, tok = pair
    kw = dict(gamma=3, max_new_tokens=20, temperature=0.9, top_k=20, chat=False)
    a = generate(target, draft, tok, "the dog", seed=5, **kw)
    assert a.token_ids == generate(target, draft, tok, "the dog", seed=5, **kw).token_ids
    assert a.target_calls < 20  # some drafts passed


def test_truncated_cache_equals_one_that_never_saw_the_rejected_tokens(pair):
    target, _, _ = pair
    ids = torch.randint(0, target.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    a, b = target.new_cache(max_len=32), target.new_cache(max_len=32)
    target(ids, cache=a)
    a.truncate(8)  # four "rejected" positions dropped
    target(ids[:, :8], cache=b)
    nxt = torch.tensor([[7, 9]])
    assert torch.allclose(target(nxt, cache=a), target(nxt, cache=b), atol=1e-6)


def test_bad_input_names_the_parameter(pair):
    target, draft, tok = pair
    for gamma in (0, -1, 2.5, "fast", True):
        with pytest.raises(ValueError, match="gamma must be an integer in"):
            generate(target, draft, tok, "the", gamma=gamma)
    other = tiny(vocab_size=300)
    with pytest.raises(ValueError, match=rf"the draft's vocabulary \(300\) differs from the target's \({tok.vocab_size}\)"):
        generate(target, other, tok, "the")
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        PromptLookup(max_ngram=1, min_ngram=2)


def test_speculation_on_the_shakespeare_pair_is_exact():
    target, tok = labkit.load("shakespeare")
    draft, _ = labkit.load("shakespeare-draft")
    out = generate(target, draft, tok, "ROMEO:\nWhat light through yonder window", gamma=4, max_new_tokens=40,
                   compare=True)
    assert out.plain["same_tokens"] and out.tokens_per_call > 1


def test_bench_prediction_formula():
    from labkit.speculative.costs import predicted_speedup

    t_rel = {k: 1.0 for k in range(2, 10)}  # a target pass costs the same for any k (a GPU's ideal)
    assert predicted_speedup(0.0, 4, 0.0, t_rel) == 1.0  # nothing accepted: one token per pass
    assert predicted_speedup(1.0 - 1e-9, 4, 0.0, t_rel) == pytest.approx(5.0, rel=1e-2)
    t_rel = {k: 1.0 + 0.5 * (k - 1) for k in range(2, 10)}  # a CPU: the pass grows with k
    assert predicted_speedup(0.8, 4, 0.1, t_rel) == pytest.approx((1 - 0.8 ** 5) / 0.2 / (0.4 + 3.0))


def test_layer_skip_leaves_the_target_cache_as_it_found_it(pair):
    target, _, tok = pair
    cache = target.new_cache(max_len=64)
    ids = [5, 9, 30, 2, 7]
    target(torch.tensor([ids[:-1]]), cache=cache)
    keys = cache.keys[:, :, :, :4].clone()
    d = LayerSkip(target, 1)
    d.attach(cache)
    tokens, q = d.propose(ids, 3, labkit.sampling.SamplingParams())
    assert len(tokens) == 3 and q is None and cache.seq_len == 4 and torch.equal(cache.keys[:, :, :, :4], keys)
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 1\]"):
        LayerSkip(target, 2)
    with pytest.raises(ValueError, match="n_layers must be an integer in"):
        target(torch.tensor([ids]), n_layers=0)


def test_alpha_counts_only_the_draft_tokens_verification_tested(pair):
    target, draft, tok = pair
    same = generate(target, target, tok, "the cat", gamma=3, max_new_tokens=20, chat=False)
    assert same.alpha == 1.0 and same.tested == same.accepted > 0  # the target drafting for itself
    out = generate(target, draft, tok, "the cat", gamma=3, max_new_tokens=20, chat=False)
    rounds = len(out.gammas)
    assert out.accepted == round(sum(a * p for a, p in zip(out.acceptance, out.proposed)))
    # every round emits its accepted drafts plus one token of the target's; the prefill emits the first
    assert len(out.token_ids) <= 1 + out.accepted + rounds
    assert out.tested <= sum(out.gammas) and out.tested >= rounds - out.gammas.count(0)
    assert 0 <= out.alpha <= 1


def test_heuristic_gamma_grows_after_full_acceptance_and_shrinks_after_a_rejection(pair):
    from labkit.speculative.decode import GAMMA_MAX, _HeuristicGamma

    h = _HeuristicGamma(start=4)
    h.update(4, 4, 0.0, 0.0)
    assert h.next() == 6
    h.update(6, 2, 0.0, 0.0)
    assert h.next() == 5
    for _ in range(10):
        h.update(h.next(), h.next(), 0.0, 0.0)
    assert h.next() == GAMMA_MAX
    for _ in range(20):
        h.update(h.next(), 0, 0.0, 0.0)
    assert h.next() == 1
    target, draft, tok = pair
    out = generate(target, draft, tok, "the cat", gamma="heuristic", max_new_tokens=24, chat=False, compare=True)
    assert out.plain["same_tokens"] and len(set(out.gammas)) >= 1


def test_auto_gamma_measures_two_pass_lengths_then_picks_the_fastest_gamma():
    from labkit.speculative.decode import GAMMA_MAX, _AutoGamma, expected_tokens

    cost = lambda k: 1.0 + 0.3 * (k - 1)  # noqa: E731  a CPU-like pass: grows with its tokens
    auto = _AutoGamma(start=4)
    seen = []
    for _ in range(40):
        g = auto.next()
        seen.append(g)
        accepted = int(0.4 * g)  # a poor draft: about 40 % of its tokens pass
        auto.update(g, accepted, 0.1 * g, cost(g + 1))
    assert seen[:2] == [4, 1]  # the start, then the other end, before any model is trusted
    rate = {g: expected_tokens(min(auto.alpha, 0.999), g) / (0.1 * g + cost(g + 1)) for g in range(1, GAMMA_MAX + 1)}
    rate[0] = 1 / auto._t(1)  # not drafting at all is a choice too
    best = max(rate, key=rate.get)
    assert seen[-1] == best or (best == 0 and seen[-1] == 1)  # a probe round drafts one token


def test_auto_gamma_stops_drafting_where_it_cannot_pay_and_probes_now_and_then():
    from labkit.speculative.decode import PROBE_EVERY, _AutoGamma

    cost = lambda k: 1.0 + 0.3 * (k - 1)  # noqa: E731
    auto = _AutoGamma(start=4)
    seen = []
    for _ in range(6 * PROBE_EVERY):
        g = auto.next()
        seen.append(g)
        auto.update(g, 0, 0.1 * g, cost(g + 1))  # a useless draft: nothing is ever accepted
    tail = seen[2 * PROBE_EVERY:]
    assert set(tail) == {0, 1} and tail.count(1) <= len(tail) // PROBE_EVERY + 1  # plain steps, and a probe now and then
    good = _AutoGamma(start=4)
    for _ in range(40):  # a draft that is always right: drafting pays, never a plain step
        g = good.next()
        good.update(g, g, 0.01 * g, cost(g + 1))
    assert g >= 2


def test_reached_counts_the_rounds_that_tested_each_position():
    import labkit
    from labkit import speculative

    target, tok = labkit.load("shakespeare")
    draft, _ = labkit.load("shakespeare-draft")
    out = speculative.generate(target, speculative.DraftModel(draft), tok, "ROMEO:\n", gamma=3, max_new_tokens=40)
    accepted = [round(a * n) for a, n in zip(out.acceptance, out.proposed)]
    assert out.reached[0] == out.proposed[0]  # position 1 is tested in every round that drafts
    for i in range(1, len(out.reached)):  # position i + 1 is tested only after position i passed
        assert out.reached[i] <= accepted[i - 1] and accepted[i] <= out.reached[i]
    assert sum(accepted) == out.accepted and sum(out.reached) == out.tested


def test_the_exact_mode_refuses_passes_it_cannot_make_invariant():
    """Batch invariance covers passes of up to INVARIANT_MAX_ROWS tokens: a longer draft or tree is refused with the
    mode on (its greedy output could depend on gamma), accepted with it off."""
    import labkit
    from labkit.quant.rows import INVARIANT_MAX_ROWS
    from labkit.speculative import PromptLookup, TreeLookup, generate, generate_tree

    target, tok = labkit.load("shakespeare")
    with pytest.raises(ValueError, match=f"gamma must be at most {INVARIANT_MAX_ROWS - 1} with batch_invariant"):
        generate(target, PromptLookup(), tok, "ROMEO:", gamma=INVARIANT_MAX_ROWS, max_new_tokens=4)
    with pytest.raises(ValueError, match=f"max_nodes must be at most {INVARIANT_MAX_ROWS} with batch_invariant"):
        generate_tree(target, TreeLookup(), tok, "ROMEO:", max_nodes=INVARIANT_MAX_ROWS + 1, max_new_tokens=4)
    out = generate(target, PromptLookup(), tok, "ROMEO:", gamma=INVARIANT_MAX_ROWS, max_new_tokens=4,
                   batch_invariant=False)
    assert len(out.token_ids) >= 1
