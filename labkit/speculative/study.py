"""Speculative decoding measured as a learner should see it: drafters raced against plain decoding,
a prediction from a separate calibration run, and a mixed workload for choosing γ.

    rows = race(target, tok, prompt, {"lookup": (PromptLookup, 8)}, n=40, rounds=2)
    rows["lookup"]["decode_speedup"], rows["lookup"]["alpha"], rows["lookup"]["c"], rows["lookup"]["overhead"]

`race` interleaves plain greedy decoding of the target with every drafter, round after round, so that
all of them see the machine in the same state; every speculative reply is compared with the plain one.
A row's costs are in units of T(1), the plain loop's own decode step measured in the same race:
c is the drafter's seconds per drafted token, `overhead` the loop's own seconds per round beyond its
draft steps and its target pass (`costs.round_overhead`, given this machine's T(k)/T(1)).

`predict(calibration, gamma, t_rel)` is the formula with α, c and the overhead of *another* run (the
calibration), so checking it against a measurement is not circular. `mixed_workload` races fixed γs
and the schedules over prompts of different kinds and totals their decode time.
"""
from __future__ import annotations

from collections import Counter

from labkit.speculative.costs import predicted_speedup, round_overhead
from labkit.speculative.decode import generate

__all__ = ["race", "predict", "mixed_workload", "head_cache_bytes"]


def _spec(target, drafter, tok, prompt, gamma, n, chat):
    try:
        return generate(target, drafter, tok, prompt, gamma=gamma, max_new_tokens=n, chat=chat)
    finally:
        if hasattr(drafter, "close"):
            drafter.close()


def race(target, tok, prompt, drafters: dict, n: int = 40, rounds: int = 2, chat=None, t_rel: dict | None = None) -> dict:
    """Plain decoding and each drafter on `prompt`, interleaved over `rounds`.

    `drafters`: name -> (make_drafter, gamma), `make_drafter()` giving a fresh drafter (or draft model) per run.
    Returns {name: row} and {"plain": row}. A row: gamma, alpha, acceptance (by position), tokens_per_call,
    speedup (plain wall time / speculative wall time, the median of the rounds' ratios, prefill included: one
    `measure.run`, a fresh order each round), compare (its `measure.Comparison`, with the interval),
    decode_speedup (the same for the tokens after the first), same_as_plain, c, overhead (with `t_rel`; else
    None), gammas_used, out.
    """
    from labkit.generation.reply import generate as plain_generate

    if not drafters:
        raise ValueError("drafters must name at least one drafter: {name: (make_drafter, gamma)}")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2 (tokens per reply), got {n!r}")
    from labkit import measure

    decode_s = {name: [] for name in ("plain", *drafters)}  # seconds a token after the first, per call
    outs = {}

    def plain_call():
        outs["plain"] = out = plain_generate(target, tok, prompt, max_new_tokens=n, chat=chat)
        decode_s["plain"].append(out.decode_s / max(1, len(out.token_ids) - 1))

    def spec_call(name, make, gamma):
        outs[name] = out = _spec(target, make(), tok, prompt, gamma, n, chat)
        decode_s[name].append((out.wall_s - out.prefill_s) / max(1, len(out.token_ids) - 1))

    fns = {"plain": plain_call, **{name: (lambda name=name, mg=mg: spec_call(name, *mg)) for name, mg in drafters.items()}}
    run = measure.run(fns, rounds=rounds, warmup=0, machine=False, loops=1)  # whole replies, a fresh order each round
    decodes = measure.Run.from_samples(decode_s, paired=True)  # the same rounds
    plain = outs["plain"]
    t1 = decodes["plain"].median
    rows = {"plain": {"wall_s": run["plain"].median, "t1_s": t1, "token_ids": plain.token_ids}}
    for name, (_, gamma) in drafters.items():
        out = outs[name]
        drafted = sum(out.gammas)
        c = out.draft_s / drafted / t1 if drafted else 0.0
        wall = measure.compare(run[name], run["plain"])
        rows[name] = {
            "gamma": gamma, "alpha": out.alpha, "acceptance": out.acceptance, "tokens_per_call": out.tokens_per_call,
            "speedup": wall.speedup, "compare": wall,
            "decode_speedup": measure.compare(decodes[name], decodes["plain"]).speedup,
            "same_as_plain": out.token_ids == plain.token_ids, "c": c,
            "overhead": round_overhead(out, t1, c, t_rel) if t_rel is not None and out.gammas else None,
            "gammas_used": Counter(out.gammas).most_common(), "out": out}
    return rows


def predict(calibration: dict, gamma: int, t_rel: dict) -> dict:
    """The formula's speed-up at `gamma`, with α, c and the overhead of a calibration row (from `race`).

    Returns the steps of `costs.decomposition` without the measurement: paper, with T(k), with the overhead
    (a negative overhead, rounds faster than their parts timed alone, counts as 0 here)."""
    if calibration.get("overhead") is None:
        raise ValueError("the calibration row has no overhead: race it with t_rel=")
    a, c, o = calibration["alpha"], calibration["c"], max(0.0, calibration["overhead"])  # a negative one adds nothing
    return {"paper": predicted_speedup(a, gamma, c), "with T(k)": predicted_speedup(a, gamma, c, t_rel),
            "with overhead": predicted_speedup(a, gamma, c, t_rel, o)}


def mixed_workload(target, tok, prompts: dict, make_drafter, gammas, n: int = 40, rounds: int = 1, chat=None) -> dict:
    """Race every γ in `gammas` (integers, "auto", "heuristic") on each prompt kind; total the decode time.

    Returns by_kind {kind: {γ: decode speed-up}}, overall {γ: plain decode time / speculative decode time,
    over all kinds}, best_fixed {kind: γ}, same_as_plain (every reply equal to plain)."""
    by_kind, plain_total, spec_total, same = {}, 0.0, Counter(), True
    for kind, prompt in prompts.items():
        rows = race(target, tok, prompt, {str(g): (make_drafter, g) for g in gammas}, n=n, rounds=rounds, chat=chat)
        plain = rows.pop("plain")
        steps = len(plain["token_ids"]) - 1
        plain_total += plain["t1_s"] * steps
        by_kind[kind] = {}
        for g in gammas:
            row = rows[str(g)]
            by_kind[kind][g] = row["decode_speedup"]
            spec_total[g] += plain["t1_s"] * steps / row["decode_speedup"]
            same &= row["same_as_plain"]
    fixed = [g for g in gammas if isinstance(g, int)]
    return {"by_kind": by_kind, "overall": {g: plain_total / spec_total[g] for g in gammas},
            "best_fixed": {k: max(fixed, key=v.get) for k, v in by_kind.items()} if fixed else {}, "same_as_plain": same}


def head_cache_bytes(config, context: int, bytes_per_value: float = 2) -> float:
    """Bytes of the one-layer KV cache a chained MTP head keeps for `context` tokens (what the zero-copy head saves)."""
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"context must be an integer >= 1, got {context!r}")
    return 2 * config.n_kv_heads * config.head_dim * bytes_per_value * context
