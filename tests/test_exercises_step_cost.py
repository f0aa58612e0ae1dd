"""The checkers of the step-cost deep dive (03a) pass the answer derived from the statement and fail the plausible
wrong ones; the head-share reference agrees with the bytes of a model labkit builds."""
import pytest

from tests.conftest import assert_checker_separates


def _gamma(t_rel, alpha, *, plain=True, mean_slope=False):
    best, best_s = 0, 1.0 if plain else 0.0
    slope = (t_rel[max(t_rel)] - 1) / (max(t_rel) - 1)
    for g in range(1, max(t_rel)):
        t = 1 + slope * g if mean_slope else t_rel[g + 1]
        s = sum(alpha ** i for i in range(g + 1)) / t
        if s > best_s + 1e-12:
            best, best_s = g, s
    return best


@pytest.mark.parametrize("wrong", [
    lambda t, a: _gamma(t, a, plain=False),        # never answers plain decoding
    lambda t, a: _gamma(t, a, mean_slope=True),    # one slope for the table: the cliff hidden
    lambda t, a: max(t) - 1,                       # always the longest draft
])
def test_the_gamma_checker_separates(wrong, capsys):
    assert_checker_separates("check_best_gamma", _gamma, wrong, capsys)


def _cheapest(processes, tokens, paths, *, later_once=False, first_every=False):
    def total(p):
        first, later, token = p
        starts = first + (later if later_once else (processes - 1) * later)
        if first_every:
            starts = processes * first
        return starts + processes * tokens * token
    return min(sorted(paths), key=lambda n: total(paths[n]))


@pytest.mark.parametrize("wrong", [
    lambda *a: _cheapest(*a, later_once=True),     # a later process's cost paid once
    lambda *a: _cheapest(*a, first_every=True),    # the first build paid in every process
    lambda p, t, paths: min(paths, key=lambda n: paths[n][2]),  # per-token time only
])
def test_the_cheapest_path_checker_separates(wrong, capsys):
    assert_checker_separates("check_cheapest_path", _cheapest, wrong, capsys)


def _share(cfg, head_bits, body_bits, *, mha=False, one_bits=False):
    d, hd = cfg.d_model, cfg.head_dim or cfg.d_model // cfg.n_heads
    kv = cfg.n_heads if mha else (cfg.n_kv_heads or cfg.n_heads)
    body = cfg.n_layers * (2 * d * cfg.n_heads * hd + 2 * d * kv * hd + 3 * d * cfg.ffn_dim)
    head = cfg.vocab_size * d
    if one_bits:
        return head / (head + body)
    return head * head_bits / (head * head_bits + body * body_bits)


@pytest.mark.parametrize("wrong", [
    lambda *a: _share(*a, mha=True),               # k and v as wide as q
    lambda *a: _share(*a, one_bits=True),          # the head at the body's bits
])
def test_the_head_share_checker_separates(wrong, capsys):
    assert_checker_separates("check_head_share", _share, wrong, capsys)


def test_the_head_share_reference_matches_a_built_model():
    from labkit.exercises.step_cost import _reference_head_share
    from labkit.model.config import ModelConfig
    from labkit.model.transformer import Transformer
    from labkit.quant import model_nbytes

    cfg = ModelConfig(vocab_size=3000, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=24, ffn_dim=96,
                      tie_embeddings=True)
    model = Transformer(cfg)
    head = cfg.vocab_size * cfg.d_model * 4
    assert _reference_head_share(cfg, 32, 32) == pytest.approx(head / model_nbytes(model), rel=1e-9)
