"""What speculative decoding should gain: the measured costs, the formula, and the exactness of the output.

A round drafts γ tokens (each costing c, relative to one plain target step T(1)) and runs
the target once over γ + 1 positions (T(γ+1), relative to T(1)). With an acceptance rate α
it emits E(γ) = (1 − α^(γ+1)) / (1 − α) tokens on average, so the speed-up over plain
decoding is

    S(γ) = E(γ) / (γ·c + T(γ+1)/T(1))

Leviathan et al. (2023, §3.3) take T(γ+1) = T(1): a batch-1 forward reads the weights once
whatever the number of tokens. On a CPU with little arithmetic to spare that is only
roughly true; `relative_costs` measures it.

    >>> round(predicted_speedup(0.8, 4, 0.05), 2)      # the paper's assumption T(γ+1) = T(1)
    2.8
"""
from __future__ import annotations

from collections import Counter
from contextlib import nullcontext

import torch

from labkit import checks, measure
from labkit.speculative.decode import expected_tokens
from labkit.speculative.mtp import MTPHead, head_step_s
from labkit.speculative.verify import accept_sampled

__all__ = ["target_pass_s", "pass_timings", "step_timings", "invariant_cost", "within", "verification_costs", "cheapest_verifier", "relative_costs", "product_costs", "predicted_speedup", "round_overhead", "decomposition",
           "conditional_acceptance", "acceptance_by_position", "decay_verdict", "first_token_counts",
           "measure_speedups"]


@torch.inference_mode()
def target_pass_s(model, k: int, position: int = 64, repeat: int = 5) -> float:
    """Median seconds of one forward over k new tokens on a cache already holding `position` tokens."""
    checks.positive_int("k", k)
    return pass_timings(model, [k], position=position, rounds=repeat)[f"T({k})"].median


@torch.inference_mode()
def _pass_run(passes: dict, position: int, rounds: int, warmup: int = 1):
    """A `labkit.measure.Run` of name -> (model, k, batch-invariant?): one forward over k new tokens each, the names
    interleaved round by round, each pass on a fresh cache after an untimed prefill of `position` tokens."""
    from labkit.model.kernels import batch_invariant

    prompt, caches = torch.zeros(1, position, dtype=torch.long), {}

    def setup(name):
        model, k, _ = passes[name]
        caches[name] = model.new_cache(max_len=position + k + 1)
        model(prompt, cache=caches[name])

    def one(name):
        model, k, invariant = passes[name]
        with batch_invariant(model) if invariant else nullcontext():
            model(torch.ones(1, k, dtype=torch.long), cache=caches[name])

    return measure.run({name: (lambda name=name: one(name)) for name in passes}, rounds=rounds, warmup=warmup,
                       setup=setup, machine=False)


def pass_timings(model, ks, position: int = 64, rounds: int = 10, warmup: int = 1):
    """A `labkit.measure.Run` of one forward over k new tokens ("T(k)") for each k, on a cache holding `position`
    tokens: the k's interleaved round by round, the prompt's prefill untimed before every pass."""
    ks = list(ks)
    if not ks or not all(checks.is_int(k) and k >= 1 for k in ks):
        raise ValueError(f"ks must be positive integers, got {ks!r}")
    return _pass_run({f"T({k})": (model, k, False) for k in ks}, position, rounds, warmup)


def step_timings(models: dict, position: int = 64, rounds: int = 8):
    """A `labkit.measure.Run` of one forward over one new token per name -> model, the models interleaved round by
    round, each pass after an untimed prefill of `position` tokens."""
    return _pass_run({name: (m, 1, False) for name, m in models.items()}, position, rounds)


def invariant_cost(model, k: int = 5, position: int = 64, rounds: int = 8):
    """A `labkit.measure.Comparison` of a k-token pass with the batch-invariant mode on against the same pass
    with the default kernels: paired rounds, each pass after an untimed prefill of `position` tokens."""
    run = _pass_run({"mode on": (model, k, True), "default": (model, k, False)}, position, rounds)
    return measure.compare(run["mode on"], run["default"])


def verification_costs(models: dict, ks=range(2, 10), position: int = 64, rounds: int = 10) -> dict:
    """{name: {k: Comparison of T(k) against T(1)}} for each name -> model, every pass timed in one run per model.

    A `Comparison`'s `ratio` is T(k)/T(1) (the median over rounds of the paired ratio) with its interval; its
    verdict says whether the pass over k tokens is measurably dearer than one token ("slower"), the same within
    3 % or undecided, so a noisy T(1) cannot pass for a cheap T(k)."""
    ks = sorted(set(ks) - {1})
    out = {}
    for name, model in models.items():
        pass_timings(model, [max(ks)], position=position, rounds=1, warmup=1)  # a fresh model's first passes run slow
        run = pass_timings(model, [1] + ks, position=position, rounds=rounds)
        out[name] = {k: measure.compare(run[f"T({k})"], run["T(1)"]) for k in ks}
    return out


def within(comparison, limit: float = 1.3):
    """`labkit.measure.claim` that a pass's T(k)/T(1) (a `verification_costs` entry) is at most `limit`: holds when
    its whole interval is, fails when none of it is, inconclusive otherwise."""
    return measure.claim(f"T(k)/T(1) within {limit:g}x", comparison.ratio, high=limit,
                         interval=(comparison.low, comparison.high))


def cheapest_verifier(costs: dict, k: int, margin: float = 0.05):
    """Which of `verification_costs`' models has the lowest T(k)/T(1), and whether the data can tell.

    Returns (name, `Comparison` of its per-round ratios against the runner-up's, unpaired): "faster" means its
    relative cost is measurably lower; otherwise the ranking is not decided by these runs."""
    if len(costs) < 2:
        raise ValueError(f"costs must hold at least two models, got {len(costs)}")
    if any(k not in row for row in costs.values()):
        raise ValueError(f"k must be one of the measured k's, got {k!r}")
    ranked = sorted(costs, key=lambda name: costs[name][k].ratio)
    a, b = (costs[n][k] for n in ranked[:2])

    def ratios(name, c):
        return measure.Timing(f"{name} T({k})/T(1)", tuple(x / y for x, y in zip(c.a.samples, c.b.samples)), 0,
                              "ratio")

    return ranked[0], measure.compare(ratios(ranked[0], a), ratios(ranked[1], b), margin=margin)


def relative_costs(target, draft=None, layers: int | None = None, ks=range(2, 10), repeat: int = 5) -> tuple[float, dict]:
    """(c, {k: T(k)/T(1)}): a draft step relative to a target step, and a target pass over k tokens.

    `draft` is a draft model (its one-token step is timed) or an `MTPHead` (one chained head step), or `layers` the number of the
    target's own layers a layer-skip draft runs (c = layers / n_layers); neither: c = 0
    (n-gram lookup costs next to nothing).
    """
    ks = sorted(set(ks) - {1})
    pass_timings(target, [max(ks)], rounds=1, warmup=1)  # warm up: a freshly loaded model's first passes run slow
    run = pass_timings(target, [1] + ks, rounds=repeat)  # every k interleaved with T(1), round by round
    t1 = run["T(1)"].median
    t_rel = {k: measure.compare(run[f"T({k})"], run["T(1)"]).ratio for k in ks}
    if isinstance(draft, MTPHead):  # a head on the target's own hidden states: one chained head step
        c = head_step_s(target, draft, repeat=repeat) / t1
    elif draft is not None:
        c = target_pass_s(draft, 1, repeat=repeat) / t1
    elif layers is not None:
        c = layers / target.config.n_layers
    else:
        c = 0.0
    return c, t_rel


@torch.inference_mode()
def product_costs(layer, ks=range(1, 10), repeat: int = 20) -> dict:
    """{k: t(k)/t(1)}: one weight product (`layer`, a linear module) over k rows against one row, nothing else.

    The model's T(k) with the attention, norms and Python taken out: where the row of `relative_costs` jumps
    at the same k as this one, the product's kernel is where the jump comes from."""
    ks = sorted(set(ks) | {1})
    x = torch.randn(max(ks), layer.in_features).to(getattr(layer, "act_dtype", None) or layer.weight.dtype)
    run = measure.run({k: (lambda k=k: layer(x[:k])) for k in ks}, rounds=repeat, warmup=2, machine=False)
    return {k: measure.compare(run[k], run[1]).ratio for k in ks}


def predicted_speedup(alpha: float, gamma: int, c: float, t_rel: dict | None = None, overhead: float = 0.0) -> float:
    """S(γ) = E(γ) / (γ·c + T(γ+1)/T(1) + o); without `t_rel`, T(γ+1) = T(1) as in the paper.

    `overhead` o: what a round costs beyond its draft steps and its target pass (the loop's own work:
    feeding the drafter, rolling caches back, verifying), relative to T(1); see `round_overhead`.
    """
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")
    if not (isinstance(overhead, (int, float)) and overhead >= 0):
        raise ValueError(f"overhead must be a number >= 0 (a round's extra cost relative to T(1)), got {overhead!r}")
    checks.positive_int("gamma", gamma, why="draft tokens per round")
    if t_rel is not None and gamma + 1 not in t_rel:
        raise ValueError(f"t_rel must hold T({gamma + 1})/T(1) for gamma={gamma} (a verification pass over "
                         f"gamma + 1 tokens); it holds k = {sorted(t_rel)}")
    t = 1.0 if t_rel is None else t_rel[gamma + 1]
    return expected_tokens(min(alpha, 0.999), gamma) / (gamma * c + t + overhead)


def round_overhead(out, plain_step_s: float, c: float, t_rel: dict) -> float:
    """A run's cost per round beyond its draft steps and target passes, relative to one plain step T(1).

    `out` is a `SpeculativeOutput`; its rounds took wall_s − prefill_s. By the measured costs they
    should have taken Σ over rounds (γ_i·c + T(γ_i+1)/T(1))·T(1); the rest, per round, is the loop's
    own work. `plain_step_s`: T(1), a plain decode step's seconds measured in the same run. The value is
    signed: below 0, the rounds ran faster than their parts timed alone add up to (the separately measured
    T(k) and c overstate the loop's costs), which is reported as it is, not clamped to 0.
    """
    if not out.gammas:
        raise ValueError("out has no rounds (max_new_tokens of 1?): nothing to attribute")
    if not plain_step_s > 0:
        raise ValueError(f"plain_step_s must be a positive number of seconds, got {plain_step_s!r}")
    missing = sorted({g + 1 for g in out.gammas if g} - set(t_rel))
    if missing:
        raise ValueError(f"t_rel must hold T(k)/T(1) for k = {missing} (the passes this run made)")
    modelled = sum(g * c + (t_rel[g + 1] if g else 1.0) for g in out.gammas)
    return ((out.wall_s - out.prefill_s) / plain_step_s - modelled) / len(out.gammas)


def decomposition(alpha: float, gamma: int, c: float, t_rel: dict, overhead: float, measured: float) -> list[dict]:
    """The speed-up from the paper's promise to the measurement, one cost at a time: rows of step, speedup.

    1. the paper: T(γ+1) = T(1) (a pass over γ + 1 tokens costs one step); 2. this machine's T(γ+1);
    3. plus the loop's own work per round (`round_overhead`, from a separate calibration run); 4. measured.
    """
    return [{"step": "paper: T(γ+1) = T(1)", "speedup": predicted_speedup(alpha, gamma, c)},
            {"step": "this machine's T(γ+1)", "speedup": predicted_speedup(alpha, gamma, c, t_rel)},
            {"step": "+ the loop's own work", "speedup": predicted_speedup(alpha, gamma, c, t_rel, overhead)},
            {"step": "measured", "speedup": measured}]


def conditional_acceptance(acceptance: list[float]) -> list[float]:
    """P(position i accepted | position i − 1 accepted), from the share of rounds accepting each position
    (`SpeculativeOutput.acceptance`): where it falls with i, later guesses are worse guesses (suffix decay),
    not just guesses that are reached less often."""
    out, before = [], 1.0
    for share in acceptance:
        out.append(share / before if before > 0 else float("nan"))
        before = share
    return out


def acceptance_by_position(*outs) -> list[dict]:
    """Per draft position i, pooled over runs (`SpeculativeOutput`s): reached (rounds that proposed position i
    with every position before it accepted), accepted, rate = accepted / reached (P(i accepted | i − 1
    accepted)) and its standard error sqrt(rate·(1 − rate) / reached)."""
    depth = max((len(o.reached) for o in outs), default=0)
    rows = []
    for i in range(depth):
        reached = sum(o.reached[i] for o in outs if i < len(o.reached))
        accepted = sum(round(o.acceptance[i] * o.proposed[i]) for o in outs if i < len(o.acceptance))
        rate = accepted / reached if reached else float("nan")
        rows.append({"position": i + 1, "reached": reached, "accepted": accepted, "rate": rate,
                     "stderr": (rate * (1 - rate) / reached) ** 0.5 if reached else float("nan")})
    return rows


def decay_verdict(rows: list[dict], min_rounds: int = 20) -> str:
    """What `acceptance_by_position` rows can decide: 'falls', 'rises', 'no change detected' (the first and the
    deepest position with at least `min_rounds` rounds, 2 standard errors apart or not: within them, a change
    smaller than the counts can resolve is not ruled out) or 'inconclusive' (fewer than two positions with that
    many rounds)."""
    usable = [r for r in rows if r["reached"] >= min_rounds]
    if len(usable) < 2:
        return "inconclusive"
    first, last = usable[0], usable[-1]
    diff = last["rate"] - first["rate"]
    se = (first["stderr"] ** 2 + last["stderr"] ** 2) ** 0.5
    if se == 0:  # both rates 0 or 1
        return "no change detected" if diff == 0 else ("falls" if diff < 0 else "rises")
    return "falls" if diff < -2 * se else "rises" if diff > 2 * se else "no change detected"


def first_token_counts(p: torch.Tensor, q: torch.Tensor, n: int = 20000, seed: int = 0) -> torch.Tensor:
    """How often each token comes out first when a draft sampled from q is verified against p, over n rounds.

    The experiment behind the exactness proof: the counts / n approach p, not q, whatever q is.
    """
    if p.dim() != 1 or p.shape != q.shape:
        raise ValueError(f"p and q must be distributions over one vocabulary, got {tuple(p.shape)} and {tuple(q.shape)}")
    for name, d in (("p", p), ("q", q)):
        if (d < 0).any() or abs(float(d.sum()) - 1) > 1e-5:
            raise ValueError(f"{name} must be a probability distribution (non-negative, summing to 1)")
    gen = torch.Generator().manual_seed(seed)
    both, q_row = torch.stack([p, p]), q[None]
    counts = torch.zeros(p.numel(), dtype=torch.long)
    drafts = torch.multinomial(q, n, replacement=True, generator=gen)
    for d in drafts:
        accepted, nxt = accept_sampled(both, q_row, d[None], gen)
        counts[int(d) if accepted else nxt] += 1
    return counts


def measure_speedups(target, make_drafter, tok, prompt, gammas, n: int = 48, rounds: int = 3, chat=None) -> list[dict]:
    """Plain and speculative greedy decoding of `prompt`, interleaved over `rounds`: one row per γ in `gammas`.

    Each row: gamma, alpha (accepted / tested), tokens_per_call, speedup (plain wall time / speculative, the
    median of the rounds' ratios: one `measure.run`, a fresh order each round), compare (its
    `measure.Comparison`), same_as_plain, acceptance_by_position, gammas_used (for "auto").
    """
    from labkit.generation.reply import generate as plain_generate
    from labkit.speculative.decode import generate

    outs = {}

    def call(g):
        if g is None:
            outs[None] = plain_generate(target, tok, prompt, max_new_tokens=n, chat=chat)
        else:
            outs[g] = generate(target, make_drafter(), tok, prompt, gamma=g, max_new_tokens=n, chat=chat)

    run = measure.run({"plain": lambda: call(None), **{f"γ={g}": (lambda g=g: call(g)) for g in gammas}},
                      rounds=rounds, warmup=0, machine=False, loops=1)
    plain = outs[None]
    rows = []
    for g in gammas:
        out = outs[g]
        c = measure.compare(run[f"γ={g}"], run["plain"])
        rows.append({"gamma": g, "alpha": out.alpha, "tokens_per_call": out.tokens_per_call,
                     "speedup": c.speedup, "compare": c,
                     "same_as_plain": out.token_ids == plain.token_ids, "acceptance_by_position": out.acceptance,
                     "gammas_used": Counter(out.gammas).most_common()})
    return rows
