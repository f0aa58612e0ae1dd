"""Speculation under load: one workload replayed at rising arrival rates with each speculation budget.

The workload mixes the two kinds of request a chat server sees: input-grounded ones (repeat,
rewrite or summarise a passage the prompt holds, rename a variable in code the prompt holds),
where prompt lookup finds most of the reply in the prompt, and open chat, where it finds little.

1. `record(model, tok, prompts)` serves every prompt once with the real model (greedy, the
   engine's batch-invariant mode, no drafts) and keeps each prompt and its reply.
2. `sweep(recorded, pass_time, ...)` replays those requests as a Poisson trace at each arrival
   rate, with each budget, through the engine itself: its scheduler, the prompt-lookup drafter,
   the budget, verification and rollback run as they do live, on `RecordedModel` (the recorded
   replies; exact because a greedy reply does not depend on what shares its passes) and timed by
   `pass_time` (this machine's measured pass costs, or the cost model's pass on a GPU). Every
   number it reports follows from the recording and the cost function: the same on every machine.

Load is stated as a multiple of capacity: the arrival rate over the rate at which the engine
without speculation finishes requests when every request arrives at once.
"""
from __future__ import annotations

from labkit.serving.engine.loop import Engine
from labkit.serving.studies.recorded import RecordedModel
from labkit.serving.engine.request import Request
from labkit.serving.studies.trace import summarize

__all__ = ["workload_prompts", "serve_once", "record", "trace", "replay", "sweep", "capacity", "ratios", "ModelledHead", "only", "copy_origins",
           "BUDGETS", "CHAT"]

BUDGETS = ("off", "fixed:3", "vllm:8:3", "auto")
CHAT = ["Tell me about {t} in three sentences.", "What is {t}? Answer briefly.", "Give me three facts about {t}.",
        "Explain {t} to a child."]
TOPICS = ["the moon", "volcanoes", "coffee", "bicycles", "the piano", "glaciers", "honey", "lighthouses",
          "paper", "tides", "owls", "clocks", "bridges", "salt"]
GROUNDED = ["Repeat this passage exactly:\n\n{p}", "Rewrite this passage in plain modern English:\n\n{p}",
            "Summarise this passage in two sentences, reusing its words:\n\n{p}"]
CODE = ("def {f}(items):\n    {v} = []\n    for item in items:\n        if item > 0:\n            {v}.append(item)\n"
        "    return {v}\n")
RENAME = "Rename the variable {v} to {w} in this code and return the whole code:\n\n{c}"
NAMES = [("positives", "out", "kept"), ("collect", "found", "matches"), ("keep_big", "result", "chosen"),
         ("select", "acc", "picked")]


def _passages(text: str, n: int, chars: int = 260) -> list[str]:
    """`n` passages of whole lines, about `chars` long each, from far-apart places in `text`."""
    lines, out = text.splitlines(), []
    for i in range(n):
        at, block = (len(lines) * (2 * i + 1)) // (2 * n), []
        while at < len(lines) and sum(len(x) + 1 for x in block) < chars:
            if lines[at].strip():
                block.append(lines[at])
            at += 1
        out.append("\n".join(block))
    return out


def workload_prompts(n_passages: int = 6) -> list[tuple[str, str]]:
    """(kind, prompt): every grounded task on held-out Shakespeare passages, code renames, and open chat
    (as many open-chat prompts as grounded ones)."""
    from labkit.data import data_path

    if not isinstance(n_passages, int) or not 1 <= n_passages <= 12:
        raise ValueError(f"n_passages must be an integer in [1, 12], got {n_passages!r}")
    passages = _passages(data_path("shakespeare_val.txt").read_text(), n_passages)
    grounded = [g.format(p=p) for p in passages for g in GROUNDED]
    grounded += [RENAME.format(v=v, w=w, c=CODE.format(f=f, v=v)) for f, v, w in NAMES[:max(1, n_passages // 2)]]
    chat = [t.format(t=topic) for topic in TOPICS for t in CHAT][:len(grounded)]
    return [("grounded", p) for p in grounded] + [("chat", p) for p in chat]


class ModelledHead:
    """A drafter that always proposes γ tokens, each right with probability `acceptance` (seeded), as a drafting
    head does (an MTP or Medusa head drafts at every step, where prompt lookup drafts only where the text repeats).

    A model of a head, not a head: it knows each request's recorded reply (`recorded`, from `record`) and proposes
    its next tokens, turning each wrong with probability 1 − `acceptance`; after a wrong token, the rest follow it.
    It lets a sweep ask what a head of a given acceptance would do under load, on the same requests. Like a head in
    the engine it is asked after the budget's decision (`drafts_after_budget`), and `step_s`, the seconds one drafted
    token's head step takes (measured live), is what it tells the budget its drafting took (`draft_seconds`); the
    engine puts the same seconds on its clock beside the pass's cost (`replay(head_step_s=...)`)."""

    drafts_after_budget = True

    def __init__(self, recorded: dict, acceptance: float, seed: int = 0, step_s: float = 0.0):
        import random

        if not (isinstance(acceptance, (int, float)) and 0 <= acceptance <= 1):
            raise ValueError(f"acceptance must be a number in [0, 1], got {acceptance!r}")
        if not (isinstance(step_s, (int, float)) and step_s >= 0):
            raise ValueError(f"step_s must be a number of seconds >= 0, got {step_s!r}")
        self.acceptance, self.rng, self.step_s = float(acceptance), random.Random(seed), float(step_s)
        self.replies = {tuple(p): list(r) for p, r in zip(recorded["prompts"], recorded["replies"])}
        self.lengths = sorted({len(p) for p in recorded["prompts"]})

    def propose(self, history: list[int], gamma: int, params=None, generator=None):
        n = next((n for n in self.lengths if tuple(history[:n]) in self.replies), None)
        if n is None:
            raise ValueError("ModelledHead drafts for recorded requests only: this history starts with no recorded prompt")
        tokens, right = [], True
        for t in self.replies[tuple(history[:n])][len(history) - n:len(history) - n + gamma]:
            right = right and self.rng.random() < self.acceptance
            tokens.append(t if right else t - 1 if t > 0 else t + 1)  # a wrong token: any other id
        return tokens, None

    def draft_seconds(self, tokens: int) -> float:
        """What drafting `tokens` tokens would take the head this models: one step of `step_s` each."""
        return tokens * self.step_s


def serve_once(model, tok, texts: list[str], max_new_tokens: int, *, max_batch: int = 16, min_token_budget: int = 512,
               batch_invariant: bool = True, prefix_cache: bool = False, progress: bool = False) -> list[Request]:
    """Each text in the chat template, served once by the continuous engine, greedy, to EOS or `max_new_tokens`: the
    requests, with their outputs (`Request.prompt + Request.output`: a whole conversation as token ids)."""
    from labkit.generation.reply import encode_prompt

    eos = getattr(tok, "eos_id", None)
    stop = frozenset() if eos is None else frozenset([eos])
    reqs = [Request(i, encode_prompt(tok, text), max_new_tokens, params={"temperature": 0.0}, stop_ids=stop)
            for i, text in enumerate(texts)]
    longest = max(len(r.prompt) for r in reqs) + max_new_tokens
    engine = Engine(model, policy="continuous", max_batch=max_batch, token_budget=max(min_token_budget, longest),
                    block_size=16, num_blocks=max_batch * -(-longest // 16) + 16, batch_invariant=batch_invariant,
                    prefix_cache=prefix_cache)
    engine.replay(reqs, progress=progress)
    return reqs


def record(model, tok, prompts: list[tuple[str, str]], max_new_tokens: int = 128, max_batch: int = 16,
           progress: bool = False) -> dict:
    """Serve each (kind, prompt) once, greedy, batch-invariant, no drafts: {kinds, prompts (ids), replies (ids),
    max_new_tokens, stop_ids}."""
    reqs = serve_once(model, tok, [text for _, text in prompts], max_new_tokens, max_batch=max_batch, progress=progress)
    return {"kinds": [k for k, _ in prompts], "prompts": [r.prompt for r in reqs], "replies": [r.output for r in reqs],
            "max_new_tokens": max_new_tokens, "stop_ids": sorted(reqs[0].stop_ids)}


def only(recorded: dict, kind: str) -> dict:
    """The recording's requests of one kind ("grounded" or "chat")."""
    keep = [i for i, k in enumerate(recorded["kinds"]) if k == kind]
    if not keep:
        raise ValueError(f"kind must be one of {sorted(set(recorded['kinds']))}, got {kind!r}")
    return {**recorded, **{k: [recorded[k][i] for i in keep] for k in ("kinds", "prompts", "replies")}}


def trace(recorded: dict, rate: float, copies: int = 1, seed: int = 0) -> list[Request]:
    """The recorded requests (each `copies` times, as new requests) arriving as a Poisson process at `rate`/s,
    conditioned on its span: the gaps are scaled so the last arrival is at exactly (n - 1) / rate, every seed at
    its stated load (the arrival times are then uniform over the span, as a Poisson process's given their count),
    so that seeds differ in the order and spacing of requests, not in how much load they carry."""
    import numpy as np

    if not (isinstance(rate, (int, float)) and rate > 0):
        raise ValueError(f"rate must be a positive number of requests per second, got {rate!r}")
    if not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be a positive integer, got {copies!r}")
    n = len(recorded["prompts"]) * copies
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    gaps = np.zeros(n) if rate == float("inf") else rng.exponential(1.0 / rate, n)
    if rate != float("inf") and n > 1:
        gaps *= (n - 1) / rate / gaps[1:].sum()
    arrivals = np.cumsum(gaps) - gaps[0]
    stop = frozenset(recorded["stop_ids"])
    m = len(recorded["prompts"])
    return [Request(int(i), list(recorded["prompts"][int(i) % m]), recorded["max_new_tokens"], arrival=float(a),
                    params={"temperature": 0.0}, stop_ids=stop) for i, a in zip(order, arrivals)]


def replay(recorded: dict, config, pass_time, *, rate: float, budget: str = "off", copies: int = 1,
           policy: str = "chunked", max_batch: int = 16, token_budget: int = 128, seed: int = 0, model=None,
           batch_invariant: bool = True, head: float | None = None, host_time: bool = False, drafter=None,
           head_step_s: float = 0.0) -> dict:
    """One replay: the summary (`trace.summarize`, plus drafted and accepted tokens and per-kind TPOT) and the
    requests served ("served"). `model`: serve with this model instead of the recording, to check the recording
    against it (`batch_invariant` as the recording was made, or False to time the default mode's passes);
    `pass_time` None: the wall time of each pass. `head`: draft with a `ModelledHead` of that acceptance instead of
    prompt lookup. `host_time`: the clock adds this machine's measured drafting, scheduling, verification
    and sampling to each pass's cost (`Engine`'s); False (the default) prices the passes alone: deterministic,
    and an upper bound on what speculation gains, since drafting and verification are left out of it.
    `drafter`: draft with this object (a real head on `model`) instead; `budget` "off" still drafts nothing.
    `head_step_s`: the modelled head's seconds per drafted token, on the clock beside each pass's cost (a head drafts
    one step per token, before the pass; the budget learns the pass's cost without it and the drafting as D, as it
    does live). The summary's `draft_s` is the drafting the engine timed (live: a real drafter's; replayed: the
    modelled head's seconds)."""
    from labkit.speculative import PromptLookup

    reqs = trace(recorded, rate, copies, seed)
    m = len(recorded["prompts"])
    if model is None:
        model = RecordedModel(config, {r.id: recorded["prompts"][r.id % m] + recorded["replies"][r.id % m] for r in reqs})
    longest = max(len(p) + len(r) for p, r in zip(recorded["prompts"], recorded["replies"]))
    engine = Engine(model, policy=policy, max_batch=max_batch, token_budget=token_budget, block_size=16,
                    num_blocks=max_batch * (-(-longest // 16) + 1), prefix_cache=False, pass_time=pass_time,
                    host_time=host_time,
                    drafter=None if budget == "off" else drafter if drafter is not None else PromptLookup()
                    if head is None else ModelledHead(recorded, head, seed, head_step_s), spec_budget=budget,
                    batch_invariant=batch_invariant and not isinstance(model, RecordedModel))
    out = summarize(engine.replay(reqs), ttft_slo_s=2.0, itl_slo_s=0.1)
    steps = engine.steps
    out.update(budget=budget, rate=rate, drafted=sum(s.drafted for s in steps), accepted=sum(s.accepted for s in steps),
               tested=sum(r.tested for r in reqs), draft_s=sum(s.parts.get("draft" if head is None else "draft (modelled)", 0.0) for s in steps),
               draft_passes=sum(1 for s in steps if s.drafted),
               tokens_per_pass=sum(s.n_tokens for s in steps) / max(1, len(steps)))
    for kind in sorted(set(recorded["kinds"])):
        per = [r for r in reqs if recorded["kinds"][r.id % m] == kind and len(r.token_times) > 1]
        out[f"tpot_{kind}_s"] = sum((r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1)
                                    for r in per) / max(1, len(per))
    out["served"] = reqs
    return out


def copy_origins(recorded: dict, gamma: int = 8, lookup=None) -> dict:
    """Where prompt lookup's accepted tokens come from, per kind of request: {kind: {"prompt": n, "reply": n,
    "tokens": n}}. Each recorded reply is decoded again in one stream, greedy, drafting γ tokens a round with
    `lookup` (default `PromptLookup()`): a draft is accepted as far as it equals the recorded reply (what greedy
    verification accepts), and its accepted tokens count as copied from the prompt when the match's continuation
    starts inside the prompt, from the reply itself (the model repeating its own text) when it starts later."""
    from labkit.speculative import PromptLookup

    lookup = PromptLookup() if lookup is None else lookup
    out: dict = {}
    for kind, prompt, reply in zip(recorded["kinds"], recorded["prompts"], recorded["replies"]):
        row = out.setdefault(kind, {"prompt": 0, "reply": 0, "tokens": 0})
        history, i = list(prompt), 0
        while i < len(reply):
            end = next((e for e in lookup.matches(history) if e < len(history)), None)
            draft = [] if end is None else history[end:end + gamma]
            n = next((j for j, (a, b) in enumerate(zip(draft, reply[i:])) if a != b), min(len(draft), len(reply) - i))
            if n:
                row["prompt" if end < len(prompt) else "reply"] += n
            history += reply[i:i + n + 1]
            i += n + 1
        row["tokens"] += len(reply)
    return out


def capacity(recorded: dict, config, pass_time, **opts) -> float:
    """Requests per second the engine without speculation finishes when every request arrives at once (`opts`: as
    `replay`'s)."""
    s = replay(recorded, config, pass_time, rate=float("inf"), budget="off", **opts)
    return s["requests"] / s["duration_s"]


def sweep(recorded: dict, config, pass_time, loads=(0.05, 0.3, 0.6, 1.0, 2.0), budgets=BUDGETS, progress=False,
          **opts) -> dict:
    """Each budget at each load (arrival rate as a multiple of `capacity`): {"capacity": req/s, "rows": [...]}."""
    cap = capacity(recorded, config, pass_time, **{k: v for k, v in opts.items() if k != "head"})
    rows, bar = [], None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(loads) * len(budgets), desc="load sweep", leave=False)
    for load in loads:
        for budget in budgets:
            row = replay(recorded, config, pass_time, rate=load * cap, budget=budget, **opts)
            row.pop("served")
            row.pop("draft_s")  # this machine's wall time: a sweep's rows are the model's figures alone
            rows.append({"load": load, **row})
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    return {"capacity_req_s": cap, "rows": rows}


def ratios(rows: list[dict]) -> list[dict]:
    """Each budget against no speculation at the same load: {load, budget, throughput (x off), speed (per-request
    decode speed, 1/TPOT, x off), accepted per drafted token, drafted share of the passes' tokens}."""
    off = {r["load"]: r for r in rows if r["budget"] == "off"}
    if not off:
        raise ValueError("rows must hold the 'off' budget at every load (what sweep() returns)")
    out = []
    for r in rows:
        base = off.get(r["load"])
        if base is None:
            raise ValueError(f"no 'off' row at load {r['load']}")
        out.append({"load": r["load"], "budget": r["budget"],
                    "throughput": r["throughput_tok_s"] / base["throughput_tok_s"],
                    "speed": base["tpot_mean_s"] / r["tpot_mean_s"],
                    "acceptance": r["accepted"] / r["drafted"] if r["drafted"] else float("nan"),
                    "drafted_share": r["drafted"] / (r["tokens_per_pass"] * r["steps"]) if r["steps"] else 0.0})
    return out
