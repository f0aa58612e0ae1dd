"""Speculation under load, live: the real engine on the wall clock with drafts, beside the replay of the same traces.

`python -m labkit.benchmarks.serving_spec_live --model float32 --json data/serving_spec_live.json` and
`... --model native --json data/serving_spec_live_native.json` (deep dive 09a reads both).
SmolLM2-135M (batch-invariant: the mode whose greedy replies are exact), in float32 or from its GGUF file on labkit's
own kernels (`MODELS`: what a drafted token costs differs between the two), serves the recorded requests of
`data/serving_spec.json` (the model's own greedy replies to them, `NEW_TOKENS` at most, served in the live runs'
engine: `rerecord`), two traces of `N_REQ` requests each: input-grounded
ones, and a mix of grounded and open chat. Each trace runs as `SEEDS` seeded Poisson traces at a low load and at
saturation (arrival rate as a multiple of the capacity measured live: every request at once, no drafts), with
no speculation and with each budget (fixed:3, fixed:8, auto), drafting with prompt lookup and with the MTP
head. Every run is live: each step's whole work (drafting, scheduling, the pass, verification and sampling) on
the wall clock, idle gaps skipped. Its replies must equal the recording; no block may leak.

Beside each live run, the replay of the same trace (`specload.replay` on the recording, no model): its passes
priced by this machine's pass costs measured in the batch-invariant mode, passes with drafted tokens on their
own curve (`passcost.measure_pass_costs(..., verify_rows, gammas)`); the head replayed as a `ModelledHead`
accepting what the live head accepted, each drafted token's head step priced at the drafting seconds per token its
fixed-budget runs measured at that point, on the clock beside the pass (the head drafts after the budget's
decision, live and replayed; the budget learns the pass's cost and the drafting apart, as live: `one_point`). The replay leaves out verification and
prompt lookup's drafting: the ratio shows it.

Each speed-up (per-request decode speed, 1/TPOT; throughput; TTFT p50) is a paired comparison over the seeds
(`labkit.measure.compare`: sign-test interval, which needs 6 seeds at 95 %).
"""
from __future__ import annotations

TITLE = "Speculation under load, live on the wall clock (prompt lookup and the MTP head) beside the replay"

N_REQ, NEW_TOKENS, SEEDS = 8, 48, 6
LOADS = (0.1, 2.0)
ENGINE = dict(max_batch=4, token_budget=16)  # every pass <= 16 tokens: each row's bits its own (INVARIANT_MAX_ROWS)
BUDGETS = ("fixed:3", "fixed:8", "auto")
METRICS = {"speed": "tpot_mean_s", "throughput": "s_per_token", "ttft_p50": "ttft_p50_s"}  # lower is better


def traces(recorded: dict) -> dict:
    """The two traces: N_REQ input-grounded requests; N_REQ / 2 grounded and N_REQ / 2 open chat. Replies cut to
    NEW_TOKENS (a greedy reply's first tokens do not depend on where it stops)."""
    from labkit.serving.studies import specload

    def cut(rec, idx):
        return {**rec, "kinds": [rec["kinds"][i] for i in idx], "prompts": [rec["prompts"][i] for i in idx],
                "replies": [rec["replies"][i][:NEW_TOKENS] for i in idx], "max_new_tokens": NEW_TOKENS}

    grounded, chat = specload.only(recorded, "grounded"), specload.only(recorded, "chat")
    half = N_REQ // 2
    mixed = {k: grounded[k][:half] + chat[k][:half] for k in ("kinds", "prompts", "replies")}
    return {"grounded": cut(grounded, range(N_REQ)), "mixed": cut({**recorded, **mixed}, range(N_REQ))}


def _summary(s: dict) -> dict:
    keep = ("throughput_tok_s", "tpot_mean_s", "ttft_p50_s", "duration_s", "drafted", "accepted", "tested", "steps",
            "draft_s", "draft_passes")
    out = {k: s[k] for k in keep}
    out["s_per_token"] = s["duration_s"] / s["output_tokens"]
    return out


def one_point(model, rec, cost, rate, seed, drafters, heads_alpha, budgets=BUDGETS) -> list[dict]:
    """Every configuration at one load and seed, live and replayed: rows {drafter, budget, live, replay, exact}.

    The live runs come first (their order alternates by seed), then each one's replay. A head is replayed as a
    `ModelledHead` with the live run's own acceptance per tested token (where it tested none: its fixed budgets'
    at this point, else the last measured, `heads_alpha`) and one drafting cost per head and point: the drafting
    seconds per token of its fixed-budget runs, which draft enough tokens to measure it."""
    from labkit.serving.studies import specload

    configs = [(name, drafter, budget) for name, drafter in (("none", None), *drafters.items())
               for budget in (("off",) if drafter is None else budgets)]
    lives = {}
    for name, drafter, budget in configs[::-1] if seed % 2 else configs:  # drift enters the pairs both ways
        live = specload.replay(rec, model.config, None, rate=rate, budget=budget, seed=seed, model=model,
                               drafter=drafter, **ENGINE)
        served = live.pop("served")
        lives[name, budget] = live, all(r.output == rec["replies"][r.id % len(rec["replies"])] for r in served)
    for name in drafters:
        if name == "prompt lookup":
            continue
        fixed = [lives[name, b][0] for b in budgets if b.startswith("fixed")] or [lives[name, b][0] for b in budgets]
        tested, drafted = sum(r["tested"] for r in fixed), sum(r["drafted"] for r in fixed)
        a, step_s = heads_alpha.get(name, (0.0, 0.0))
        heads_alpha[name] = (sum(r["accepted"] for r in fixed) / tested if tested else a,
                             sum(r["draft_s"] for r in fixed) / drafted if drafted else step_s)
    rows = []
    for name, drafter, budget in configs:
        live, exact = lives[name, budget]
        head, step_s = None, 0.0  # the replay's drafter: prompt lookup, or a modelled head as the live one ran
        if drafter is not None and name != "prompt lookup":
            head, step_s = heads_alpha[name]
            head = live["accepted"] / live["tested"] if live["tested"] else head
        replayed = specload.replay(rec, model.config, cost, rate=rate, budget=budget, seed=seed, head=head,
                                   head_step_s=step_s, **ENGINE)
        replayed.pop("served")
        rows.append({"drafter": name, "budget": budget, "seed": seed, "live": _summary(live),
                     "replay": _summary(replayed), "exact": exact})
    return rows


def compare_rows(rows: list[dict], side: str) -> list[dict]:
    """Each (drafter, budget) against no speculation, paired by seed: ratio of off's metric to its (>1: better)."""
    from labkit import measure

    off = {r["seed"]: r[side] for r in rows if r["budget"] == "off"}
    out = []
    for key in sorted({(r["drafter"], r["budget"]) for r in rows if r["budget"] != "off"}):
        mine = {r["seed"]: r[side] for r in rows if (r["drafter"], r["budget"]) == key}
        seeds = sorted(set(off) & set(mine))
        row = {"drafter": key[0], "budget": key[1]}
        for label, metric in METRICS.items():
            paired = measure.Run.from_samples({key[1]: [mine[s][metric] for s in seeds],  # the same seeded trace
                                               "off": [off[s][metric] for s in seeds]}, paired=True)
            c = measure.compare(paired[key[1]], paired["off"], margin=0.03)
            row[label] = {"x": 1 / c.ratio, "low": 1 / c.high if c.high else float("inf"),
                          "high": 1 / c.low if c.low else float("inf"), "verdict": c.verdict}
        row["acceptance"] = sum(mine[s]["accepted"] for s in seeds) / max(1, sum(mine[s]["drafted"] for s in seeds))
        out.append(row)
    return out


MODELS = {"float32": "SmolLM2-135M in float32 (torch's products; a multi-token row is one call per token in the "
                      "batch-invariant mode where the CPU's kernel is not row-invariant)",
          "native": "SmolLM2-135M from its GGUF file on labkit's own int4 x int8 and int8 x int8 kernels "
                    "(row-invariant by construction: a multi-token row is one call)"}


def load_model(name: str):
    """(model, tokenizer) for `name` in `MODELS`."""
    import labkit

    if name not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {name!r}")
    model, tok = labkit.load("smollm2-135m")
    if name == "native":
        import torch

        from labkit.data import paths
        from labkit.model.gguf_native import load_gguf_native

        model = load_gguf_native(paths.smollm2_gguf_path(), act_dtype=torch.float32, kernel="q4q8", head="q8_0")
    return model, tok


def rerecord(model, rec: dict) -> dict:
    """The trace's prompts served once by `model` in the live runs' engine (greedy, batch-invariant, no drafts, every
    request at once): its own replies, which every live run must reproduce and the replay replays. In passes of at
    most 16 tokens every row gets the bits it gets alone, so a reply does not depend on the schedule (the recording
    in the data file was served with whole prompts in one pass, whose bits can differ at near-ties)."""
    from labkit.serving.studies import specload

    served = specload.replay(rec, model.config, None, rate=float("inf"), model=model, **ENGINE)["served"]
    return {**rec, "replies": [r.output for r in sorted(served, key=lambda r: r.id)]}


DRAFTERS = ("prompt lookup", "mtp head")


def run(quick: bool = False, checkpoint: str | None = None, model_name: str = "float32", drafters=DRAFTERS,
        budgets=BUDGETS) -> dict:
    import json

    bad = [d for d in drafters if d not in DRAFTERS] + [b for b in budgets if b not in BUDGETS]
    if bad or not drafters or not budgets:
        raise ValueError(f"drafters must be among {DRAFTERS} and budgets among {BUDGETS} (at least one each), got "
                         f"{list(drafters)} and {list(budgets)}")
    from labkit.benchmarks.loading import source_ids
    from labkit.data import data_path
    from labkit.measure.clock import now
    from labkit.serving.studies import specload
    from labkit.serving.studies.passcost import measure_pass_costs, step_time
    from labkit.speculative import PromptLookup
    from labkit.speculative.mtp import MTPDrafter

    model, tok = load_model(model_name)
    recorded = json.loads(data_path("serving_spec.json").read_text())["results"]["recorded"]
    t0 = now()
    table = measure_pass_costs(model, decode_rows=(1, 2, 4), prefill_tokens=(8, 16), verify_rows=(1, 2, 4),
                               gammas=(1, 3), source=source_ids(tok), context=128, repeats=3 if quick else 7,
                               batch_invariant=True)
    print(f"  pass costs, batch-invariant ({now() - t0:.0f} s): " + ", ".join(
        f"{r['kind']} {r['tokens']} {r['seconds'] * 1e3:.1f} ms" for r in table))
    cost = step_time(table)
    made = {"prompt lookup": PromptLookup, "mtp head": lambda: MTPDrafter.from_file(model)}
    drafters = {name: made[name]() for name in DRAFTERS if name in drafters}
    seeds = range(2 if quick else SEEDS)
    report = {"drafters": list(drafters), "budgets": list(budgets), "model": model_name,
              "model_note": MODELS[model_name], "n_requests": N_REQ, "new_tokens": NEW_TOKENS, "engine": ENGINE,
              "loads": LOADS, "seeds": len(seeds), "pass_costs": table, "copy_origins": specload.copy_origins(recorded), "traces": {}}
    for trace_name, rec in traces(recorded).items():
        rec = rerecord(model, rec)
        cap_run = specload.replay(rec, model.config, None, rate=float("inf"), model=model, **ENGINE)
        cap = cap_run["requests"] / cap_run["duration_s"]
        rows, alpha = [], {}
        for load in LOADS:
            for seed in seeds:
                rows += [{"load": load, **r} for r in one_point(model, rec, cost, load * cap, seed, drafters, alpha,
                                                                budgets)]
                print(f"  {trace_name} load {load} seed {seed}: {now() - t0:.0f} s", flush=True)
                if checkpoint:  # every run so far, so that a long sweep cut short loses nothing
                    with open(checkpoint, "w") as f:
                        json.dump({**report, "partial": {trace_name: rows}}, f, default=float)
        per_load = {}
        for load in LOADS:
            at = [r for r in rows if r["load"] == load]
            per_load[str(load)] = {"live": compare_rows(at, "live"), "replay": compare_rows(at, "replay")}
        report["traces"][trace_name] = {"capacity_req_s": cap, "rows": rows, "compared": per_load,
                                        "exact": all(r["exact"] for r in rows)}
        show(trace_name, report["traces"][trace_name])
    for drafter in drafters.values():
        getattr(drafter, "close", lambda: None)()
    return report


def show(name: str, res: dict) -> None:
    print(f"  {name} trace: capacity {res['capacity_req_s']:.2f} req/s live; every reply equal to the recording: "
          f"{res['exact']}")
    for load, both in res["compared"].items():
        for live, rep in zip(both["live"], both["replay"]):
            s, t = live["speed"], live["throughput"]
            print(f"    load {load:>4s} {live['drafter']:13s} {live['budget']:8s} speed {s['x']:.2f}x "
                  f"({s['low']:.2f}-{s['high']:.2f}, {s['verdict']}), throughput {t['x']:.2f}x ({t['low']:.2f}-"
                  f"{t['high']:.2f}); replay {rep['speed']['x']:.2f}x / {rep['throughput']['x']:.2f}x; "
                  f"acceptance {live['acceptance']:.2f}", flush=True)


def main(argv=None) -> int:
    import argparse
    import platform

    from labkit.costmodel.cpu import cpu_info, describe

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--model", choices=sorted(MODELS), default="float32", help="the target: " + "; ".join(
        f"{k}: {v}" for k, v in MODELS.items()))
    p.add_argument("--drafters", default=",".join(DRAFTERS), help=f"comma-separated, among {', '.join(DRAFTERS)}")
    p.add_argument("--budgets", default=",".join(BUDGETS), help=f"comma-separated, among {', '.join(BUDGETS)}")
    args = p.parse_args(argv)
    drafters, budgets = args.drafters.split(","), args.budgets.split(",")
    print(f"on {describe()}; {MODELS[args.model]}")
    command = f"python -m labkit.benchmarks.serving_spec_live --model {args.model}" + (
        f" --drafters '{args.drafters}'" if drafters != list(DRAFTERS) else "") + (
        f" --budgets '{args.budgets}'" if budgets != list(BUDGETS) else "")
    report = {"machine": platform.platform(), "cpu": cpu_info(), "command": command,
              "results": run(args.quick, args.json and args.json + ".partial", args.model, drafters, budgets)}
    from labkit.benchmarks.loading import write_report

    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
