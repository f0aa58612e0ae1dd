"""The lab's own models: size, validation loss and bits per byte, the draft's agreement with the target, decode steps."""
from __future__ import annotations

TITLE = "Shakespeare target and draft: val loss (nats/token, bits/byte), draft top-1 agreement (greedy alpha), decode step"

PROMPT = "ROMEO:\nWhat light through yonder"
NO_DISTILL = "shakespeare-draft-nokd.safetensors"  # the same draft trained without distillation (for comparison)


def _windows(tok, seq_len: int, limit: int | None):
    from labkit.data import corpus
    from labkit.train.batches import encode_split, eval_windows

    ids = encode_split(tok, corpus.load_text("val"))
    n = ids.numel() // (seq_len + 1) if limit is None else limit
    return eval_windows(ids, seq_len, n)


def quality(models: dict, tok, x, y, batch: int = 8) -> dict:
    """Per model: nats per token and bits per byte on windows (x, y); the drafts' top-1 agreement with the first model."""
    import torch

    from labkit.metrics import bits_per_byte, kl_to_reference, top1_agreement

    names = list(models)
    out = {n: {"nll": 0.0} for n in names}
    agree = {n: [] for n in names[1:]}
    kl = {n: [] for n in names[1:]}
    with torch.inference_mode():
        for i in range(0, x.shape[0], batch):
            logits = {n: m(x[i:i + batch]).float() for n, m in models.items()}
            for n in names:
                out[n]["nll"] += float(torch.nn.functional.cross_entropy(
                    logits[n].reshape(-1, logits[n].shape[-1]), y[i:i + batch].reshape(-1), reduction="sum"))
            for n in names[1:]:
                agree[n].append(top1_agreement(logits[names[0]], logits[n]))
                kl[n].append(kl_to_reference(logits[names[0]], logits[n]))
    for n in names:
        nats = out[n].pop("nll") / y.numel()
        out[n].update(val_loss=nats, bits_per_byte=bits_per_byte(nats, tok, y))
    for n in names[1:]:
        out[n].update(top1_agreement=sum(agree[n]) / len(agree[n]), kl_to_target=sum(kl[n]) / len(kl[n]))
    return out


def run(quick: bool = False) -> dict:
    import torch

    import labkit
    from labkit import measure
    from labkit.data import paths
    from labkit.model.checkpoint import load_model, read_header

    from labkit.benchmarks.loading import load_or_skip

    target, tok, skipped = load_or_skip("shakespeare")
    draft, _, skipped = (None, None, skipped) if skipped else load_or_skip("shakespeare-draft")
    if skipped:
        return skipped
    models = {"shakespeare": target, "shakespeare-draft": draft}
    nokd = paths.data_path(NO_DISTILL)
    if nokd.exists():
        models["draft without distillation"] = load_model(nokd)[0]
    print(f"  torch threads: {torch.get_num_threads()}, float32")
    rows = {}
    for name in ("shakespeare", "shakespeare-draft"):
        file = paths.data_path(f"{name}.safetensors")
        rec = read_header(file)["record"]
        cfg = models[name].config
        rows[name] = {"params": cfg.n_params(), "file_mb": file.stat().st_size / 1e6, "train_wall_s": rec.get("wall_s"),
                      "train_tokens": rec.get("tokens"), "recorded_val_loss": rec.get("val_loss")}
        print(f"  {name:18s} {cfg.n_layers} layers, d={cfg.d_model}, heads {cfg.n_heads}/{cfg.n_kv_heads}: "
              f"{cfg.n_params() / 1e6:.2f} M params, {rows[name]['file_mb']:.1f} MB file, trained "
              f"{rec.get('steps')} steps / {rec.get('tokens', 0):,} tokens in {rec.get('wall_s', 0) / 60:.0f} min")

    x, y = _windows(tok, 256, 16 if quick else None)
    q = quality(models, tok, x, y)
    print(f"  held-out plays, {y.numel():,} tokens in {x.shape[0]} windows of 256:")
    for name, r in q.items():
        extra = (f"   top-1 agreement with the target (greedy alpha) {r['top1_agreement']:.3f}, KL {r['kl_to_target']:.3f}"
                 if "top1_agreement" in r else "")
        print(f"  {name:28s} {r['val_loss']:.3f} nats/token  {r['bits_per_byte']:.3f} bits/byte{extra}")

    def steps(model, n):
        state = labkit.prefill(model, tok.encode(PROMPT), max_len=600)
        return lambda: labkit.decode(model, state, n)

    # runs of 8 steps (as a draft runs its gamma steps back to back), and single steps alternating
    # with the other model (each starts with caches full of the other model's weights)
    pair = ("shakespeare", "shakespeare-draft")
    runs = measure.run({n: steps(models[n], 8) for n in pair}, rounds=8 if quick else 25, warmup=2, per=8, unit="token")
    cold_run = measure.run({n: steps(models[n], 1) for n in pair}, rounds=15 if quick else 40, warmup=3, unit="token")
    step, cold = runs.medians(), cold_run.medians()
    ratio_c, cold_c = measure.compare(runs[pair[0]], runs[pair[1]]), measure.compare(cold_run[pair[0]], cold_run[pair[1]])
    ratio, cold_ratio = ratio_c.ratio, cold_c.ratio
    print(f"  decode step (batch 1, medians, interleaved): target {step['shakespeare'] * 1e3:.2f} ms, draft "
          f"{step['shakespeare-draft'] * 1e3:.2f} ms in runs of 8 steps: the target costs {ratio:.1f} draft steps "
          f"(interval {ratio_c.low:.1f}–{ratio_c.high:.1f})")
    print(f"  single steps alternating between the models: target {cold['shakespeare'] * 1e3:.2f} ms, draft "
          f"{cold['shakespeare-draft'] * 1e3:.2f} ms ({cold_ratio:.1f}x): a draft step right after a target step "
          "finds its weights evicted from the caches")
    steps_s = step
    bytes_read = 4 * target.config.matmul_params()
    print(f"  the target reads {bytes_read / 1e6:.0f} MB of float32 weights a step: "
          f"{bytes_read / steps_s['shakespeare'] / 1e9:.1f} GB/s")

    samples = {}
    for name in ("shakespeare", "shakespeare-draft"):
        samples[name] = [labkit.generate(models[name], tok, PROMPT, max_new_tokens=40, temperature=0.8, top_k=50,
                                         seed=s).text for s in range(1 if quick else 2)]
        for s, text in enumerate(samples[name]):
            print(f"  sample from {name} (T=0.8, top-k 50, seed {s}): {PROMPT + text!r}")
    return {"models": rows, "quality": q, "decode_step_s": steps_s, "target_over_draft": ratio,
            "single_step_s": cold, "target_over_draft_single_steps": cold_ratio, "samples": samples,
            "decode_step_timings": runs.as_dict(), "single_step_timings": cold_run.as_dict(),
            "target_over_draft_comparison": ratio_c.as_dict(), "single_steps_comparison": cold_c.as_dict(),
            "threads": torch.get_num_threads()}
