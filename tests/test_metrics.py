"""labkit.metrics: one way to measure quality, checked against direct computations."""
import math

import pytest
import torch

from labkit import metrics
from tests.kvcache_shared import ids, tiny


def test_perplexity_is_exp_of_the_mean_cross_entropy():
    model = tiny().requires_grad_(False)
    x = ids(40)[0].tolist()
    logits = model(torch.tensor([x]))[0, :-1]
    ce = torch.nn.functional.cross_entropy(logits, torch.tensor(x[1:]))
    assert metrics.nll(model, x) == pytest.approx(float(ce), rel=1e-6)
    assert metrics.perplexity(model, x) == pytest.approx(math.exp(float(ce)), rel=1e-6)


def test_windows_cover_every_token_once_and_equal_the_full_pass_when_they_fit():
    model = tiny().requires_grad_(False)
    x = ids(50)[0].tolist()
    full = metrics.nll(model, x)
    assert metrics.nll(model, x, window=64) == pytest.approx(full, rel=1e-6)  # one window holds it all
    # a window of 2 every 1 token: each token predicted from its predecessor only
    logits = model(torch.tensor(x).view(-1, 1)[:-1])[:, 0]  # every token alone
    bigram = float(torch.nn.functional.cross_entropy(logits, torch.tensor(x[1:])))
    assert metrics.nll(model, x, window=2, stride=1) == pytest.approx(bigram, rel=1e-5)
    strided = metrics.nll(model, x, window=16, stride=8)
    assert full * 0.5 < strided < full * 2  # some context lost, same order
    with pytest.raises(ValueError, match=r"stride must be an integer in \[1, 16\] \(at most the window\)"):
        metrics.nll(model, x, window=16, stride=20)


def test_kl_and_top1_agreement():
    ref = torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
    assert metrics.kl_to_reference(ref, ref) == 0.0 and metrics.top1_agreement(ref, ref) == 1.0
    other = torch.tensor([[0.0, 3.0, 0.0], [0.0, 0.0, 2.0]])
    p, q = ref[0].softmax(-1), other[0].softmax(-1)
    assert metrics.kl_to_reference(ref, other) == pytest.approx(float((p * (p / q).log()).sum()) / 2, rel=1e-5)
    assert metrics.top1_agreement(ref, other) == 0.5
    with pytest.raises(ValueError, match="logits of one shape"):
        metrics.kl_to_reference(ref, other[:1])


def test_quality_windows_score_every_position_once():
    for n, w, s in [(10, 4, 2), (50, 16, 8), (7, 8, 3), (33, 5, 5), (2, 2, 1)]:
        scored = [t for _, end, first in metrics.protocol.windows(n, w, s) for t in range(first, end)]
        assert scored == list(range(1, n))
        assert all(end - begin <= w for begin, end, _ in metrics.protocol.windows(n, w, s))
        assert all(begin < first for begin, _, first in metrics.protocol.windows(n, w, s))  # a prediction needs its input
    with pytest.raises(ValueError, match="window must be an integer >= 2"):
        metrics.protocol.windows(10, 1, 1)


def test_quality_of_the_reference_is_zero_kl_full_agreement_and_its_own_perplexity():
    model = tiny().requires_grad_(False)
    x = ids(60)[0].tolist()
    ref = metrics.reference_logits(model, x, window=16, stride=8)
    row = metrics.quality(model, x, window=16, stride=8, reference=ref)
    assert row["tokens"] == 59 and row["kl"] == pytest.approx(0.0, abs=1e-7) and row["top1"] == 1.0
    assert row["nll"] == pytest.approx(metrics.nll(model, x, window=16, stride=8), rel=1e-6)
    noisy = tiny().requires_grad_(False)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    worse = metrics.quality(noisy, x, window=16, stride=8, reference=ref)
    assert worse["kl"] > 1e-4 and worse["nll"] != row["nll"]
    with pytest.raises(ValueError, match="reference holds logits of shape"):
        metrics.quality(model, x[:30], window=16, stride=8, reference=ref)


def test_the_default_stride_scores_with_windows_that_begin_before_what_they_score():
    """stride = window (the default) crashed: a window began at the first position it had to score."""
    model = tiny().requires_grad_(False)
    x = ids(60)[0].tolist()
    assert metrics.protocol.windows(60, 16, 16) == metrics.protocol.windows(60, 16, 15)
    assert metrics.nll(model, x, window=16) == pytest.approx(metrics.nll(model, x, window=16, stride=15), rel=1e-6)
    assert metrics.perplexity(model, x, window=16) > 1.0
