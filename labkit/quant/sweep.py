"""Quality against bits: one model quantized many ways, every variant scored by the same protocol.

The protocol is `labkit.metrics.quality`: perplexity on a held-out text in fixed windows,
the KL divergence of each next-token distribution to the float32 reference, and the share
of positions whose top token agrees. A variant is (method, bits, group size):

    >>> variant_name("gptq", 4, 32), variant_name("rtn", 8, "channel")
    ('int4 GPTQ g32', 'int8 RTN per-channel')

`STANDARD` is the sweep `labkit bench --only quality` runs on SmolLM2 and the Shakespeare
target; chapter 06 reads its results file and reruns a few rows live.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from labkit.metrics.protocol import quality, reference_logits
from labkit.quant.apply import METHODS, model_nbytes, quantize_model

__all__ = ["STANDARD", "QUICK", "held_out_ids", "calibration_ids", "variant_name", "quantize_variant", "quality_rows"]

STANDARD = [("rtn", 8, "channel"),
            ("rtn", 4, 32), ("gptq", 4, 32), ("awq", 4, 32),
            ("rtn", 4, 64), ("gptq", 4, 64), ("awq", 4, 64),
            ("rtn", 4, "channel"), ("gptq", 4, "channel"), ("awq", 4, "channel"),
            ("rtn", 3, 32), ("gptq", 3, 32),
            ("rtn", 3, "channel"), ("gptq", 3, "channel")]
QUICK = [("rtn", 8, "channel"), ("rtn", 4, 32), ("gptq", 4, 32), ("rtn", 4, "channel"), ("gptq", 4, "channel")]


def held_out_ids(tok, n_tokens: int = 1024) -> list[int]:
    """The protocol's text: the held-out play (the corpus's val split) from its first act, `n_tokens` long."""
    from labkit.data import corpus

    text = corpus.load_text("val")
    ids = tok.encode(text[text.index("ACT I"):][: 8 * n_tokens])[:n_tokens]
    if len(ids) < n_tokens:
        raise ValueError(f"n_tokens={n_tokens} is more than the held-out text holds ({len(ids)})")
    return ids


def calibration_ids(tok, n_seq: int = 16, seq_len: int = 128, seed: int = 0) -> torch.Tensor:
    """Calibration token ids [n_seq, seq_len]: windows at random places of the training split (never the held-out
    text), as GPTQ and AWQ draw theirs from a training corpus."""
    from labkit.data import corpus

    text = corpus.load_text("train")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(text) - 16 * seq_len, (n_seq,), generator=g).tolist()
    return torch.tensor([tok.encode(text[s: s + 16 * seq_len])[:seq_len] for s in starts])


def variant_name(method: str, bits: int, group_size) -> str:
    """A row's label: 'int4 GPTQ g32', 'int3 RTN per-channel'."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    group = "per-channel" if group_size == "channel" else f"g{group_size}"
    return f"int{bits} {method.upper()} {group}"


def quantize_variant(model, method: str, bits: int, group_size, calib=None, act_dtype=torch.float32,
                     progress: bool = False):
    """`quantize_model` for one variant; calibration data only for the methods that use it."""
    return quantize_model(model, method=method, bits=bits, group_size=group_size,
                          calib=None if method == "rtn" else calib, act_dtype=act_dtype, progress=progress)


def quality_rows(reference, variants: dict[str, Callable[[], object]], ids, window: int, stride: int,
                 on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Score the float `reference` and each variant (name → a function building the model) on `ids`.

    Each row: name, bytes read per decode step (`model_nbytes`), its ratio to float32, tokens
    scored, nll, ppl, the perplexity's change against the reference, KL and top-1 agreement
    against the reference, and the seconds building and scoring took. `on_row(row)` is called as
    each row is done (to print it, or to show progress).
    """
    ref = reference_logits(reference, ids, window, stride)
    base = quality(reference, ids, window, stride, reference=ref)
    fp32 = model_nbytes(reference)
    rows = [{"name": "float32", **base, "bytes": fp32, "vs_float32_bytes": 1.0, "ppl_change": 0.0, "seconds": 0.0}]
    if on_row is not None:
        on_row(rows[0])
    for name, build in variants.items():
        start = time.perf_counter()
        model = build()
        row = quality(model, ids, window, stride, reference=ref)
        nbytes = model_nbytes(model)
        rows.append({"name": name, **row, "bytes": nbytes, "vs_float32_bytes": nbytes / fp32,
                     "ppl_change": row["ppl"] / base["ppl"] - 1, "seconds": time.perf_counter() - start})
        del model
        if on_row is not None:
            on_row(rows[-1])
    return rows
