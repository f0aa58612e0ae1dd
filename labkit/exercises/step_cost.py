"""Exercises of the deep dive on a decode step's own cost (03a): the draft length a pass-cost table allows, which
way to run the step pays for a workload, and the LM head's share of what a step reads.

Each checker compares the learner's function with a reference on cases built to separate the plausible wrong
answers (a cliff in T(k) that a mean slope hides, a build paid once against a compile paid in every process, a
head counted with the body's bits), not with one figure the notebook printed.
"""
from __future__ import annotations

from labkit.exercises._core import check

__all__ = ["check_best_gamma", "check_cheapest_path", "check_head_share"]


def _reference_best_gamma(t_rel: dict, alpha: float) -> int:
    # prompt lookup drafts for free (c = 0): a round of gamma drafts costs one pass over gamma + 1 tokens
    from labkit.speculative.costs import predicted_speedup

    best, best_speedup = 0, 1.0  # gamma = 0: plain decoding, speed 1
    for gamma in sorted(k - 1 for k in t_rel if k >= 2):
        s = predicted_speedup(alpha, gamma, 0.0, t_rel)
        if s > best_speedup + 1e-12:
            best, best_speedup = gamma, s
    return best


def check_best_gamma(fn) -> bool:
    """Check `fn(t_rel, alpha) -> gamma`: the number of free drafted tokens per round (prompt lookup) that makes
    decoding fastest, when a pass over k tokens costs `t_rel[k]` = T(k)/T(1) one-token steps (k = 1 ... K) and each
    drafted token is accepted with probability `alpha` while the ones before it were; 0 when no gamma up to K - 1
    beats plain decoding, the smallest gamma on a tie."""
    flat = {k: 1.0 for k in range(1, 9)}
    cliff = {1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15, 5: 2.3, 6: 2.35, 7: 2.4, 8: 2.45}
    slope = {k: 1.0 + 0.5 * (k - 1) for k in range(1, 9)}
    steep = {k: float(k) for k in range(1, 9)}
    cases = [(flat, 0.8), (flat, 0.3), (cliff, 0.8), (cliff, 0.95), (slope, 0.8), (slope, 0.5), (steep, 0.9),
             (cliff, 0.0), ({1: 1.0, 2: 1.3}, 0.6)]
    return check("best_gamma", fn, _reference_best_gamma, cases,
                 hint="a round of gamma drafts emits (1 - alpha^(gamma+1)) / (1 - alpha) tokens on average for one "
                      "pass over gamma + 1 tokens: compare tokens / T(gamma + 1) over every gamma the table allows, "
                      "and against plain decoding's 1 token per T(1)")


def _reference_cheapest_path(processes: int, tokens: int, paths: dict) -> str:
    def total(p):
        first_s, later_s, token_s = p
        return first_s + (processes - 1) * later_s + processes * tokens * token_s

    return min(paths, key=lambda name: (total(paths[name]), name))


def check_cheapest_path(fn) -> bool:
    """Check `fn(processes, tokens, paths) -> name`: the way to run the step that takes the least time in total
    when `processes` processes (one after another) each decode `tokens` tokens. `paths` maps a name to
    (first_s, later_s, token_s): what the first process pays before its first token, what every later process
    pays (a compile cache or a saved package makes it cheaper), and the seconds per token; ties go to the name
    that sorts first."""
    paths = {"eager": (0.0, 0.0, 0.040), "compiled": (360.0, 190.0, 0.033), "exported": (110.0, 0.8, 0.0076)}
    cases = [(1, 100, paths), (1, 100_000, paths), (50, 200, paths), (3, 10, paths), (1000, 20, paths),
             (2, 40_000, {"eager": (0.0, 0.0, 0.040), "compiled": (360.0, 190.0, 0.033)}),
             (1, 1, {"b": (0.0, 0.0, 1.0), "a": (0.0, 0.0, 1.0)})]
    return check("cheapest_path", fn, _reference_cheapest_path, cases,
                 hint="the first process pays first_s, each of the other processes - 1 pays later_s, and every "
                      "process decodes its tokens at token_s: add them up per path and take the smallest")


def _reference_head_share(cfg, head_bits: float, body_bits: float) -> float:
    d, hd = cfg.d_model, cfg.head_dim or cfg.d_model // cfg.n_heads
    kv = cfg.n_kv_heads or cfg.n_heads
    per_layer = d * cfg.n_heads * hd * 2 + d * kv * hd * 2 + 3 * d * cfg.ffn_dim  # q and o, k and v, gate up down
    head = cfg.vocab_size * d * head_bits
    return head / (head + cfg.n_layers * per_layer * body_bits)


def _close_share(expected, got) -> bool:
    try:
        return abs(float(got) - expected) <= 1e-3 * expected
    except (TypeError, ValueError):
        return False


def check_head_share(fn) -> bool:
    """Check `fn(cfg, head_bits, body_bits) -> share`: the LM head's share of the weight bytes one decode step
    reads, for a `labkit.model.ModelConfig` with a tied head (the embedding lookup reads one row, left out; the
    norms left out), the head stored at `head_bits` bits a weight and every block product at `body_bits`."""
    from labkit.model.config import ModelConfig

    smol = ModelConfig(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536)
    gemma = ModelConfig(vocab_size=262144, d_model=640, n_layers=18, n_heads=4, n_kv_heads=1, head_dim=256,
                        ffn_dim=2048)
    wide = ModelConfig(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336)
    cases = [(smol, 32, 32), (gemma, 32, 32), (gemma, 8.5, 5.5), (wide, 16, 16), (wide, 16, 4.5), (smol, 8.5, 4.5)]
    return check("head_share", fn, _reference_head_share, cases, compare=_close_share,
                 hint="per block: q and o are d_model x (n_heads * head_dim), k and v d_model x (n_kv_heads * "
                      "head_dim), the MLP three d_model x ffn_dim; the head vocab_size x d_model; weigh each by its "
                      "bits (head_dim may be None: d_model // n_heads)")
