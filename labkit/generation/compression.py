"""KV compression compared at equal bytes: perplexity, passkey retrieval and decode time, one row per cache kind.

For a byte budget (a fraction f of the full cache at L tokens), `equal_bytes_options`
(`labkit.kvcache.sizing`) gives each kind its option: the sliding window, H2O's and
SnapKV's token budgets; int8 and int4 KV (KIVI) reach a share of their own, reported as
it is. Each kind is then measured three ways:

- **perplexity** of held-out text of L tokens (`labkit.kvcache.longcontext.long_perplexity`:
  chunks, eviction between them; SnapKV's prompt in one pass, then a scored tail appended,
  so its budget leaves room for that tail);
- **passkey accuracy** over seeded trials of L tokens (`labkit.generation.passkey`); the
  full cache's accuracy comes first: where it fails, a compressed kind's failure says
  nothing about compression;
- **ITL against position** (`itl_by_position`): the decode step's time at positions up to
  L, the full cache against the compressed kinds at one fixed budget. The contiguous cache
  reads every key at every step, so its step grows with the position (the "long outputs
  raise ITL" of the serving chapter); a budgeted kind reads at most its budget.
"""
from __future__ import annotations

import statistics

import torch

from labkit.generation.latency import filler_ids, time_steps
from labkit.generation.passkey import passkey_accuracy
from labkit.kvcache.longcontext import feed, long_perplexity
from labkit.kvcache.sizing import equal_bytes_options, full_bytes

__all__ = ["budget_specs", "itl_by_position", "compare_at_budget", "PROTOCOLS"]


def budget_specs(model, length: int, fraction: float, appended: int = 0) -> list[dict]:
    """[{name, kind, options, fraction}] for the full cache and every kind at `fraction` of its bytes at `length`."""
    rows = equal_bytes_options(model.config, length, fraction, model.dtype, appended=appended)
    full = {"name": "full", "kind": "contiguous", "options": {}, "fraction": 1.0, "settable": True}
    return [full] + [{k: r[k] for k in ("name", "kind", "options", "fraction", "settable")} for r in rows]


@torch.inference_mode()
def itl_by_position(model, specs, positions, steps: int = 5, chunk: int = 512) -> list[dict]:
    """Median decode-step time of each cache spec ({name, kind, options}) at each position.

    Every (spec, position) gets its own cache, filled with `position` random tokens (`feed`:
    chunks of `chunk`, SnapKV in one pass), and one untimed step; then `steps` timed steps go
    round-robin over all of them, so machine noise hits every kind and position alike.
    Rows: {name, position, itl_s, samples}: `samples` holds every timed step's seconds, paired step by step
    across the rows (one interleaved run: `labkit.measure.Run.from_samples` and `compare`).
    """
    positions = list(positions)
    if not positions or any(not isinstance(p, int) or p < 1 for p in positions):
        raise ValueError(f"positions must be a non-empty list of positive integers, got {positions!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if max(positions) + steps + 1 > model.config.max_seq_len:
        raise ValueError(f"positions must leave room for {steps + 1} decode steps in the context window of "
                         f"{model.config.max_seq_len}: the largest may be {model.config.max_seq_len - steps - 1}, "
                         f"got {max(positions)}")
    runs = []  # [name, position, cache, next token]
    for spec in specs:
        for p in positions:
            kv = model.new_cache(spec["kind"], **{"max_len": p + steps + 2, **spec["options"]})
            token = torch.tensor([[int(feed(model, filler_ids(p, model.config.vocab_size), kv, chunk).argmax())]])
            model.step(token, cache=kv)  # warm-up: the first step after a prompt may allocate
            runs.append([spec["name"], p, kv, token])
    timed = time_steps(model, runs, steps, samples=True)
    return [{"name": name, "position": p, "itl_s": statistics.median(t), "samples": t}
            for (name, p, *_), t in zip(runs, timed)]


PROTOCOLS = {  # the feeding each budgeted kind gets by default, and the variant that swaps it
    "snapkv, chunks": ("snapkv", {"every_pass": True}, False),
    "h2o, one pass": ("h2o", {}, True),
}


def compare_at_budget(model, tok, text_ids, fraction: float, *, trials: int = 3, tail: int = 256, chunk: int = 256,
                      itl_positions=None, itl_steps: int = 5, seed: int = 0, filler: str = "repeat",
                      known: dict | None = None, log=None, protocols: bool = False, itl_by: bool = True) -> dict:
    """Every kind at `fraction` of the full cache's bytes at L = len(text_ids) tokens.

    Returns {length, fraction, full_bytes, rows, baseline_passkey, itl}. A row: {name, kind,
    options, fraction (of the full cache's bytes, as held at L), bytes_per_token (bytes held at L
    over L), ppl, ppl_tail, passkey (accuracy over `trials` prompts of L tokens), itl_s (at the
    last of `itl_positions`, default [L])}. `known`: rows of an earlier call on the same text, by name;
    the kinds a budget does not change (full, int8, int4) reuse their perplexity and passkey from it.
    `log`: called with a line of progress, if given. Every row also says how its prompt was fed ("feeding":
    "one pass" or "chunks of N"), the most tokens per layer and KV head a prompt pass attended over
    ("peak_tokens", the memory's peak, which equal *held* bytes do not equalise) and, per passkey trial, the
    share of (layer, KV head) pairs that still held every token of the key after the prompt ("key_kept").
    `protocols`: add the two swapped feedings (`PROTOCOLS`): SnapKV voting after every chunk as H2O is fed
    (its peak is then H2O's), and H2O reading the prompt in one pass as SnapKV does (its peak is then the whole
    prompt), so the selection rule and the feeding can be told apart. `itl_by=False`: no decode-time rows.
    """
    text_ids = list(text_ids)
    L = len(text_ids)
    say = log or (lambda line: None)
    ppl_specs = {s["name"]: s for s in budget_specs(model, L, fraction, appended=tail)}
    specs = budget_specs(model, L, fraction)  # SnapKV: the whole prompt of L tokens compressed
    positions = list(itl_positions or [L])
    itl = itl_by_position(model, specs, positions, itl_steps) if itl_by else []
    last = {r["name"]: r["itl_s"] for r in itl if r["position"] == positions[-1]}
    if protocols:
        options = {sp["kind"]: sp["options"] for sp in specs}
        for name, (kind, extra, one) in PROTOCOLS.items():
            specs.append({"name": name, "kind": kind, "options": {**options[kind], **extra}, "one_pass": one,
                          "fraction": None, "settable": True})
            ppl_specs[name] = {"options": {**options[kind], **extra}}  # no tail appended: it holds its budget
    rows = []
    for spec in specs:
        old = (known or {}).get(spec["name"])
        if old is not None and spec["kind"] in ("contiguous", "quantized") and old["options"] == spec["options"]:
            rows.append({**old, "itl_s": last.get(spec["name"])})
            continue
        one = spec.get("one_pass")
        ppl = long_perplexity(model, text_ids, spec["kind"], ppl_specs[spec["name"]]["options"], chunk, tail, one)
        key = passkey_accuracy(model, tok, L, trials, spec["kind"], spec["options"], seed, filler, chunk, one)
        fed = "one pass" if (one if one is not None else spec["kind"] == "snapkv") else f"chunks of {chunk}"
        rows.append({"name": spec["name"], "kind": spec["kind"], "options": spec["options"],
                     "fraction": ppl["bytes"] / full_bytes(model.config, L, model.dtype),
                     "bytes_per_token": ppl["bytes"] / L, "settable": spec["settable"], "ppl": ppl["ppl"],
                     "ppl_tail": ppl["ppl_tail"], "passkey": key["accuracy"], "passkey_replies": key["replies"],
                     "key_kept": key["key_kept"], "peak_tokens": key["peak_tokens"], "feeding": fed,
                     "itl_s": last.get(spec["name"])})
        say(f"{spec['name']}: ppl {ppl['ppl']:.2f}, passkey {key['correct']}/{trials}")
    return {"length": L, "fraction": fraction, "full_bytes": full_bytes(model.config, L, model.dtype), "rows": rows,
            "baseline_passkey": rows[0]["passkey"], "itl": itl, "trials": trials, "tail": tail}
