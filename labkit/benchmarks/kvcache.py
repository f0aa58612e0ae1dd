"""SmolLM2 on this machine: the KV cache's speed-up vs generated length, TTFT vs prompt length, ITL vs position;
then KV compression at equal bytes (`labkit.generation.compression`): per byte budget, each kind's bytes per
token held, perplexity of held-out Shakespeare, passkey accuracy and ITL at the longest position."""
from __future__ import annotations

TITLE = ("KV cache: speed-up over no cache vs length (where it crosses 5x), TTFT vs prompt, ITL vs position; "
         "compression at equal bytes (perplexity, passkey, ITL)")

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def run(quick: bool = False) -> dict:
    import torch

    from labkit.benchmarks.loading import load_or_skip
    from labkit.generation import latency

    model, tok, skipped = load_or_skip("smollm2-135m")
    if skipped:
        return skipped
    print(f"  torch threads: {torch.get_num_threads()}, SmolLM2-135M float32")
    ids = tok.encode_chat([{"role": "user", "content": PROMPT}])

    n, repeat = (48, 1) if quick else (128, 3)
    rows = latency.speedup_run(model, ids, n, repeat=repeat)
    print(f"  speed-up of the KV cache over re-running the sequence (greedy, prompt {len(ids)} tokens, median of {repeat}):")
    print(f"  {'new tokens':>10s} {'cached s':>9s} {'no cache s':>10s} {'speed-up':>8s}")
    for r in rows:
        if r["new_tokens"] in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128):
            print(f"  {r['new_tokens']:10d} {r['cached_s']:9.2f} {r['uncached_s']:10.2f} {r['speedup']:7.1f}x")
    cross = latency.crossing(rows, "new_tokens", "speedup", 5.0)
    where = f"at about {cross:.0f} new tokens" if cross is not None else f"not within {n} new tokens"
    print(f"  the speed-up crosses 5x {where} (sequence of {len(ids)} + n tokens)")

    prompt_lens = [16, 64, 256] if quick else [16, 64, 256, 1024, 2048]
    ttft = latency.ttft_sweep(model, prompt_lens, repeat=2 if quick else 3)
    print("  TTFT (prefill) vs prompt length:")
    for r in ttft:
        print(f"  {r['prompt_len']:6d} tokens  {r['ttft_s'] * 1e3:8.1f} ms  ({r['prompt_len'] / r['ttft_s']:6.0f} tokens/s)")

    positions = [16, 256, 1024] if quick else [16, 256, 1024, 2048, 4096]
    itl = latency.itl_sweep(model, positions, steps=3 if quick else 7)
    print("  ITL (one decode step) vs position:")
    for r in itl:
        print(f"  {r['position']:6d}         {r['itl_s'] * 1e3:8.1f} ms  ({1 / r['itl_s']:5.1f} tokens/s)")

    kinds = {}
    if not quick:
        print("  ITL at position 1024 by cache kind (steps interleaved across kinds):")
        for row in latency.itl_sweep(model, [1024], steps=7, cache=["contiguous", "paged", "sliding", "quantized"]):
            kinds[row["cache"]] = row["itl_s"]
            print(f"  {row['cache']:12s}   {row['itl_s'] * 1e3:8.1f} ms")
    compression = compression_tables(model, tok, COMPRESSION[quick])
    return {"prompt_len": len(ids), "speedup": rows, "crosses_5x_at": cross, "ttft": ttft, "itl": itl,
            "itl_by_kind_at_1024": kinds, "compression": compression, "compressed_attention": csa_section(quick),
            "threads": torch.get_num_threads()}


# quick: 2k tokens, one budget; full: the model's 8k context (8,192 less room for the reply), three budgets
COMPRESSION = {True: dict(length=2048, fractions=(0.25,), trials=3, positions=[512, 1024, 2048], steps=5,
                          passkey_lengths=[1024, 2048]),
               False: dict(length=8176, fractions=(0.1, 0.25, 0.5), trials=5, positions=[1024, 2048, 4096, 8176],
                           steps=7, passkey_lengths=[1024, 2048, 4096, 8176])}


def compression_tables(model, tok, plan: dict) -> dict:
    """Every cache kind at equal bytes: one table per budget, plus the full cache's passkey accuracy by length.

    ITL is measured at every position of `plan["positions"]` for the first budget, at L for the others.
    """
    from labkit.benchmarks.loading import source_ids
    from labkit.generation.compression import compare_at_budget
    from labkit.generation.passkey import passkey_accuracy

    L, trials = plan["length"], plan["trials"]
    print(f"  KV compression at equal bytes, L = {L} tokens (held-out Shakespeare for perplexity; passkey: "
          f"a 5-digit key in repeated neutral filler, {trials} seeded trials, greedy)")
    baseline = {}
    for n in plan["passkey_lengths"][:-1]:  # the last length is measured in the table itself
        baseline[n] = passkey_accuracy(model, tok, n, trials)["accuracy"]
    text = source_ids(tok, 12 * L)[:L]
    tables = []
    for f in plan["fractions"]:
        out = compare_at_budget(model, tok, text, f, trials=trials, itl_positions=plan["positions"] if not tables else [L],
                                itl_steps=plan["steps"], known={r["name"]: r for t in tables for r in t["rows"]},
                                protocols=plan.get("protocols", False))
        baseline[L] = out["baseline_passkey"]
        tables.append(out)
        print(f"  budget {f:.0%} of the full cache's bytes at {L} tokens ({out['full_bytes'] / 2**20:.0f} MiB); "
              f"SnapKV's perplexity row keeps room for its {out['tail']}-token scored tail")
        print(f"  {'method':9s} {'options':38s} {'bytes/tok':>9s} {'share':>6s} {'ppl':>7s} {'ppl tail':>8s} "
              f"{'passkey':>7s} {'ITL ms @' + str(max(r['position'] for r in out['itl'])):>12s}")
        for r in out["rows"]:
            opts = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or f"max_len={L}"
            share = ("-" if r["fraction"] is None else f"{r['fraction']:.3f}") + ("" if r["settable"] else "*")
            print(f"  {r['name']:9s} {opts:38s} {r['bytes_per_token']:9.0f} {share:>6s} {r['ppl']:7.2f} "
                  f"{r['ppl_tail']:8.2f} {r['passkey']:7.2f} "
                  + ("-".rjust(12) if r["itl_s"] is None else f"{r['itl_s'] * 1e3:12.1f}"))
        print("  * quantized KV cannot be set to a budget: its share is what its bit width gives")
    print("  full cache passkey accuracy by length: " + ", ".join(f"{n}: {a:.2f}" for n, a in baseline.items()))
    failing = [n for n, a in baseline.items() if a < 1]
    if failing:
        print(f"  the full cache fails the passkey too at {failing} tokens: compressed rows there are bounded by it")
    print("  ITL (ms) by position, full cache vs the kinds at the first budget:")
    for p in plan["positions"]:
        cells = "  ".join(f"{r['name']} {r['itl_s'] * 1e3:6.1f}" for r in tables[0]["itl"] if r["position"] == p)
        print(f"  {p:6d}  {cells}")
    return {"length": L, "tables": tables, "baseline_passkey": baseline, "plan": plan}


CSA_PLAN = {True: dict(contexts=(256, 512, 1024), positions=(256, 1024), steps=5),
            False: dict(contexts=(256, 512, 1024), positions=(256, 1024, 2048, 4096, 8192), steps=9)}


def csa_section(quick: bool) -> dict:
    """The lab's Shakespeare target against its compressed-attention variant (`labkit.train.compare`)."""
    import labkit
    from labkit.data import paths
    from labkit.tokenizer.named import get_tokenizer
    from labkit.train.compare import compare_models

    if not paths.data_path("shakespeare-csa.safetensors").exists():
        print("  compressed attention: data/shakespeare-csa.safetensors is missing (labkit train --model shakespeare-csa)")
        return {"skipped": "no shakespeare-csa checkpoint"}
    plan = CSA_PLAN[quick]
    models = {name: labkit.load(name)[0] for name in ("shakespeare", "shakespeare-csa")}
    out = compare_models(models, get_tokenizer("shakespeare"), plan["contexts"], plan["positions"], plan["steps"])
    c = models["shakespeare-csa"].config
    print(f"  compressed sparse attention, trained by the lab: blocks of {c.csa_block} tokens, top-{c.csa_topk} entries, "
          f"a window of {c.csa_window}; the dense target's recipe (same tokens, steps, parameters within 1 %)")
    print(f"  {'model':16s} {'params':>10s} " + " ".join(f"{'bits/B @' + str(n):>11s}" for n in plan["contexts"])
          + f" {'KV B/token @1024':>17s} {'share':>6s}")
    for name, model in models.items():
        q = {r["context"]: r["val_bits_per_byte"] for r in out["quality"] if r["name"] == name}
        kv = next(r for r in out["kv"] if r["name"] == name)
        cells = " ".join(f"{q[n]:11.3f}" if n in q else f"{'-':>11s}" for n in plan["contexts"])
        print(f"  {name:16s} {model.config.n_params():10,d} {cells} {kv['bytes_per_token']:17.0f} {kv['share']:6.3f}")
    print("  both were trained on 256-token windows: longer contexts score positions neither saw in training; "
          "'-': past the model's window")
    print("  decode step (ms) by position, interleaved (* past the model's window: a longer RoPE table, timed only):")
    for p in plan["positions"]:
        cells = "  ".join(f"{r['name']} {r['itl_s'] * 1e3:6.2f}{'*' if r['stretched'] else ' '}"
                          for r in out["decode"] if r["position"] == p)
        print(f"  {p:6d}  {cells}")
    return out
