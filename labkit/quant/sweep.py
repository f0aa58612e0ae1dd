"""Quality against bits: one model quantized many ways, every variant scored by the same protocol.

The protocol is `labkit.metrics.quality`: perplexity on a held-out text in fixed windows,
the KL divergence of each next-token distribution to the float32 reference, and the share
of positions whose top token agrees. A variant is (method, bits, group size):

    >>> variant_name("gptq", 4, 32), variant_name("rtn", 8, "channel")
    ('int4 GPTQ g32', 'int8 RTN per-channel')

A block format is (the format, "float" or "int8" activations): `FORMATS` are the rows for GGUF's
Q8_0 and Q4_1, the microscaling MXFP4, MXFP8 and NVFP4, and Q8_0 / Q4_1 weights with int8
activations (W8A8, W4A8: llama.cpp's integer dot products):

    >>> variant_name("MXFP4", "float"), variant_name("Q8_0", "int8")
    ('MXFP4', 'Q8_0 W8A8 (int8 activations)')

`SEED_BAND` are the calibrated rows rerun with other calibration seeds: how far a row moves when
only the calibration windows change is the noise band a claim about a method must clear.

`STANDARD` is the sweep `labkit bench --only quality` runs on SmolLM2 and the Shakespeare
target; chapter 06 reads its results file and reruns a few rows live.
"""
from __future__ import annotations

from typing import Callable

import torch

from labkit.measure.clock import now as clock_now
from labkit.metrics.protocol import quality, reference_logits
from labkit.quant.apply import METHODS, model_nbytes, quantize_model
from labkit.quant.blocklinear import ACTIVATIONS, BLOCK_FORMATS

__all__ = ["STANDARD", "QUICK", "FORMATS", "SEED_BAND", "held_out_ids", "calibration_ids", "variant_name",
           "quantize_variant", "quality_rows", "seed_verdict", "apart"]

STANDARD = [("rtn", 8, "channel"),
            ("rtn", 4, 32), ("gptq", 4, 32), ("awq", 4, 32),
            ("rtn", 4, 64), ("gptq", 4, 64), ("awq", 4, 64),
            ("rtn", 4, "channel"), ("gptq", 4, "channel"), ("awq", 4, "channel"),
            ("rtn", 3, 32), ("gptq", 3, 32),
            ("rtn", 3, "channel"), ("gptq", 3, "channel")]
QUICK = [("rtn", 8, "channel"), ("rtn", 4, 32), ("gptq", 4, 32), ("rtn", 4, "channel"), ("gptq", 4, "channel")]
FORMATS = [("Q8_0", "float"), ("Q8_0", "int8"), ("Q4_1", "float"), ("Q4_1", "int8"),
           ("MXFP8", "float"), ("MXFP4", "float"), ("NVFP4", "float")]
SEED_BAND = [("gptq", 4, 32), ("awq", 4, 32), ("gptq", 3, 32), ("gptq", 4, "channel"), ("gptq", 3, "channel")]


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


def variant_name(method: str, bits, group_size=None) -> str:
    """A row's label: 'int4 GPTQ g32', 'int3 RTN per-channel'; for a block format (fmt, activations): 'MXFP4'."""
    if method in BLOCK_FORMATS:
        if bits not in ACTIVATIONS:
            raise ValueError(f"a block format's second item is its activations, one of {ACTIVATIONS}; got {bits!r}")
        return method if bits == "float" else f"{method} {'W8A8' if method == 'Q8_0' else 'W4A8'} (int8 activations)"
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    group = "per-channel" if group_size == "channel" else f"g{group_size}"
    return f"int{bits} {method.upper()} {group}"


def quantize_variant(model, method: str, bits, group_size=None, calib=None, act_dtype=torch.float32,
                     progress: bool = False):
    """`quantize_model` for one variant; calibration data only for the methods that use it."""
    if method in BLOCK_FORMATS:
        return quantize_model(model, fmt=method, activations=bits)
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
        start = clock_now()
        model = build()
        row = quality(model, ids, window, stride, reference=ref)
        nbytes = model_nbytes(model)
        rows.append({"name": name, **row, "bytes": nbytes, "vs_float32_bytes": nbytes / fp32,
                     "ppl_change": row["ppl"] / base["ppl"] - 1, "seconds": clock_now() - start})
        del model
        if on_row is not None:
            on_row(rows[-1])
    return rows


def seed_verdict(changes: list[float], limit: float) -> str:
    """Does "loses at most `limit`" hold for a row measured with several calibration seeds?

    'holds' when every seed's perplexity change is within the limit, 'fails' when none is, and
    'inconclusive' when the seeds fall on both sides: the noise band straddles the limit.

    >>> seed_verdict([0.004, 0.011], 0.02), seed_verdict([0.015, 0.027], 0.02), seed_verdict([0.3, 0.5], 0.02)
    ('holds', 'inconclusive', 'fails')
    """
    if not changes:
        raise ValueError("changes must hold at least one seed's perplexity change")
    within = [c <= limit for c in changes]
    return "holds" if all(within) else "fails" if not any(within) else "inconclusive"


def apart(a: list[float], b: list[float]) -> bool:
    """Whether two sets of measurements (one per seed) do not overlap: a difference the seeds cannot explain.

    >>> apart([0.010, 0.012], [0.020]), apart([0.010, 0.030], [0.020])
    (True, False)
    """
    if not a or not b:
        raise ValueError("a and b must each hold at least one measurement")
    return max(a) < min(b) or max(b) < min(a)
