"""Gemma 3 270M's quality per format: the file as stored against its block products re-rounded to each GGML type.

There is no float original here (the lab reads only the Q4_K_M file), so the reference is the file as stored,
dequantized to float32. Each row re-rounds every block product (attention and FFN; the embedding and the tied
head stay as stored, Q8_0) to one GGML type by round to nearest, and rows of 640 weights, which a K-quant's
super-block of 256 does not cut, take the fallback llama.cpp's quantizer takes (Q4_K → Q5_0, Q6_K → Q8_0).
Scored with the fixed protocol of `labkit.metrics.protocol` (the held-out play, windows of 256 every 128):
perplexity, KL divergence to the file's next-token distribution, top-1 agreement. A row measures what that
format loses on top of the file's own rounding. Chapter 06 reads what
`labkit bench --only gemma3_quality --json data/gemma3_quality.json` writes.
"""
from __future__ import annotations

TITLE = "Gemma 3 270M quality per GGML format (ppl, KL, top-1 against the Q4_K_M file as stored)"

TOKENS, WINDOW, STRIDE = 1024, 256, 128
# (format, fallback for rows of 640): llama.cpp's rules; Q5_K's would be Q5_1, which labkit does not store
FORMATS = (("Q8_0", None), ("Q6_K", "Q8_0"), ("Q5_0", None), ("Q4_K", "Q5_0"), ("Q4_1", None), ("Q4_0", None))


def block_bytes(model) -> int:
    """Bytes the re-rounded block products store: every `BlockLinear`'s blocks."""
    from labkit.quant.blocklinear import BlockLinear

    return sum(m.nbytes() for m in model.modules() if isinstance(m, BlockLinear))


def file_block_bytes(reader) -> dict[str, int]:
    """The file's block products (every 2-D tensor of a layer, norms aside) by GGML type: bytes."""
    out: dict[str, int] = {}
    for t in reader.tensors:
        if t.name.startswith("blk.") and len(t.shape) == 2:
            out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + int(t.data.nbytes)
    return out


def run(quick: bool = False) -> dict:
    from labkit.benchmarks.loading import load_or_skip
    from labkit.measure.clock import now
    from labkit.metrics.protocol import quality, reference_logits
    from labkit.model.gguf import open_gguf
    from labkit.quant import quantize_model, sweep

    model, tok, skipped = load_or_skip("gemma3-270m")
    if skipped:
        return skipped
    stored = file_block_bytes(open_gguf(model.source_file))
    tokens = 256 if quick else TOKENS
    ids = sweep.held_out_ids(tok, tokens)
    ref = reference_logits(model, ids, WINDOW, STRIDE)
    base = quality(model, ids, WINDOW, STRIDE, reference=ref)
    total = sum(stored.values())
    mix = " + ".join(f"{k} {v / total:.0%}" for k, v in sorted(stored.items(), key=lambda kv: -kv[1]))
    rows = [{"name": f"as stored ({mix})", "bytes": total, **base}]
    print(f"  {len(ids)} held-out tokens, window {WINDOW}, stride {STRIDE}; block products only (embedding and head "
          f"as stored)")
    print(f"  {'format':34s} {'MB':>7s} {'bits/w':>6s} {'ppl':>8s} {'change':>8s} {'KL nats':>9s} {'top-1':>6s}")
    n_weights = sum(m.weight.numel() for b in model.layers for m in (b.attn.wqkv, b.attn.wo, b.mlp.w_gate_up, b.mlp.w_down))

    def show(row):
        print(f"  {row['name']:34s} {row['bytes'] / 1e6:7.1f} {8 * row['bytes'] / n_weights:6.2f} {row['ppl']:8.2f} "
              f"{row['ppl'] / base['ppl'] - 1:+8.2%} {row.get('kl', 0.0):9.5f} {row.get('top1', 1.0):6.1%}", flush=True)

    show(rows[0])
    for fmt, fallback in FORMATS[:2] if quick else FORMATS:
        start = now()
        q = quantize_model(model, fmt=fmt, fallback=fallback, include_head=False)
        name = fmt if fallback is None else f"{fmt} ({fallback} on rows of {model.config.d_model})"
        row = {"name": name, "fmt": fmt, "fallback": fallback, "bytes": block_bytes(q),
               **quality(q, ids, WINDOW, STRIDE, reference=ref)}
        row["ppl_change"], row["seconds"] = row["ppl"] / base["ppl"] - 1, now() - start
        rows.append(row)
        show(row)
        del q
    return {"tokens": len(ids), "window": WINDOW, "stride": STRIDE, "weights": n_weights,
            "file_block_bytes": stored, "rows": rows}
