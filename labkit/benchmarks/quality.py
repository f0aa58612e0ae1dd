"""Quality against bits: SmolLM2 and the Shakespeare target at float32, bfloat16, int8 and int4/int3 by RTN, GPTQ, AWQ.

The fixed protocol (`labkit.metrics.quality`): the held-out play's first `TOKENS` tokens
from ACT I, scored in windows of `WINDOW` tokens every `STRIDE`; KL divergence to the
float32 model's next-token distribution and top-1 agreement on the same positions.
GPTQ and AWQ calibrate on `CALIB` windows of the training split. SmolLM2's GGUF file
as stored (Q4_1 blocks on the int4 kernel) is one more row. Chapter 06 reads the results
this writes with `labkit bench --only quality --json data/quant_quality.json`.

Block formats follow (GGUF's Q8_0 and Q4_1, MXFP8, MXFP4, NVFP4, and Q8_0 / Q4_1 weights with
int8 activations). On the Shakespeare target the calibrated rows of `sweep.SEED_BAND` are rerun
with `SEEDS` more calibration seeds: the spread is the noise band chapter 06's verdicts use.
"""
from __future__ import annotations

TITLE = "Quality vs bits (ppl, KL, top-1 vs float32) for RTN / GPTQ / AWQ at two group sizes, SmolLM2 and Shakespeare"

TOKENS, WINDOW, STRIDE = 1024, 256, 128
CALIB = (32, 128)  # sequences x tokens
SEEDS = (1, 2)  # more calibration seeds for the noise band (seed 0 is the main row)


def _one_model(name: str, quick: bool) -> dict:
    import torch

    import labkit
    from labkit.benchmarks.loading import load_or_skip
    from labkit.quant import sweep

    model, tok, skipped = load_or_skip(name)
    if skipped:
        return skipped
    model.requires_grad_(False)
    tokens = 256 if quick else TOKENS
    ids = sweep.held_out_ids(tok, tokens)
    calib = sweep.calibration_ids(tok, *((8, 64) if quick else CALIB))
    variants = {"bfloat16": lambda: labkit.load(name, dtype=torch.bfloat16)[0]}
    if name == "smollm2-135m":
        # the file's Q4_1 codes with float32 activations and the re-rounded int8 head, as the stored rows were measured
        # (labkit's int4 × int8 kernel, the default of weights="gguf" now, quantizes the activations too)
        variants["GGUF Q4_1 as stored"] = lambda: _gguf_float_activations()
    for method, bits, group in (sweep.QUICK if quick else sweep.STANDARD):
        variants[sweep.variant_name(method, bits, group)] = (
            lambda m=method, b=bits, g=group: sweep.quantize_variant(model, m, b, g, calib))
    for fmt, act in sweep.FORMATS[:2] if quick else sweep.FORMATS:
        variants[sweep.variant_name(fmt, act)] = lambda f=fmt, a=act: sweep.quantize_variant(model, f, a)
    seeds = () if quick or name != "shakespeare" else SEEDS
    for seed in seeds:
        more = sweep.calibration_ids(tok, *CALIB, seed=seed)
        for method, bits, group in sweep.SEED_BAND:
            variants[f"{sweep.variant_name(method, bits, group)} seed {seed}"] = (
                lambda m=method, b=bits, g=group, c=more: sweep.quantize_variant(model, m, b, g, c))
    print(f"  {name}: {len(ids)} held-out tokens, window {WINDOW}, stride {STRIDE}; calibration {tuple(calib.shape)}")
    print(f"  {'format':24s} {'bytes vs fp32':>13s} {'ppl':>8s} {'ppl change':>10s} {'KL nats':>9s} {'top-1':>6s} {'s':>5s}")

    def show(row):
        print(f"  {row['name']:24s} {row['vs_float32_bytes']:13.3f} {row['ppl']:8.2f} {row['ppl_change']:+10.1%} "
              f"{row.get('kl', 0.0):9.4f} {row.get('top1', 1.0):6.1%} {row['seconds']:5.0f}", flush=True)

    rows = sweep.quality_rows(model, variants, ids, WINDOW, STRIDE, on_row=show)
    return {"tokens": len(ids), "window": WINDOW, "stride": STRIDE, "calibration": list(calib.shape), "rows": rows,
            "seeds": [0, *seeds]}


def run(quick: bool = False) -> dict:
    return {name: _one_model(name, quick) for name in ("smollm2-135m", "shakespeare")}


def _gguf_float_activations():
    import torch

    from labkit.data import paths
    from labkit.model.gguf_native import load_gguf_native

    model = load_gguf_native(paths.smollm2_gguf_path(), act_dtype=torch.float32, head="int8", kernel="torch-int4")
    model.config = model.config.replace(name="smollm2-135m")
    return model
