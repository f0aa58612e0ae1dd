"""Exercises of chapter 06: a Q4_1 block round trip, and the bytes a labkit layer's product really reads.

The first checker tests properties of the learner's quantizer (the error bound, all-zero and constant
blocks, blocks that do not see each other's outliers, idempotence, sign symmetry), not one formula's
outputs; the second compares a prediction with labkit's own accounting (`labkit.quant.read_nbytes`)
on layers the learner has not seen, built on the spot.
"""
from __future__ import annotations

import torch

from labkit.exercises._core import Verdict, check, run_steps

__all__ = ["check_q4_1_roundtrip", "check_step_bytes", "check_quantize_rows"]

BLOCK = 32


def _run(name: str, fn, properties, hint: str) -> Verdict:
    """Each property: (label, test(fn) -> bool), run by `run_steps`."""
    steps = [(lambda f, label=label, test=test, i=i:
              None if test(f) else f"property {i}/{len(properties)} does not hold: {label}")
             for i, (label, test) in enumerate(properties, start=1)]
    return run_steps(name, fn, steps, hint=hint, passed=f"all {len(properties)} properties hold.")


def _deq(out, n: int) -> torch.Tensor:
    """The values (codes, d, m) stand for, flat; checks the parts' shapes and the codes' range on the way."""
    codes, d, m = out
    codes, d, m = torch.as_tensor(codes), torch.as_tensor(d).float(), torch.as_tensor(m).float()
    blocks = n // BLOCK
    if codes.dtype.is_floating_point or tuple(codes.shape) != (blocks, BLOCK):
        raise ValueError(f"codes must be integers of shape ({blocks}, {BLOCK}), got {codes.dtype} {tuple(codes.shape)}")
    if int(codes.min()) < 0 or int(codes.max()) > 15:
        raise ValueError(f"codes must lie in 0..15 (4 bits), got {int(codes.min())}..{int(codes.max())}")
    if tuple(d.reshape(-1).shape) != (blocks,) or tuple(m.reshape(-1).shape) != (blocks,):
        raise ValueError(f"d and m must hold one number per block ({blocks})")
    return (codes.float() * d.reshape(-1, 1) + m.reshape(-1, 1)).reshape(-1)


def _within_half_step(x: torch.Tensor, y: torch.Tensor) -> bool:
    b, yb = x.reshape(-1, BLOCK), y.reshape(-1, BLOCK)
    rng = b.amax(1) - b.amin(1)
    bound = rng / 15 / 2 + 1e-6 * (1 + b.abs().amax(1))
    return bool(torch.isfinite(y).all()) and bool(((yb - b).abs() <= bound[:, None]).all())


def check_q4_1_roundtrip(fn) -> Verdict:
    """Check `fn(x) -> (codes, d, m)`: x a 1-D float32 tensor whose length is a multiple of 32, quantized
    per block of 32 with 4-bit codes 0..15 (integer tensor [blocks, 32]), one step d and one offset m per
    block (float tensors [blocks]), the weights standing for codes·d + m, as GGUF's Q4_1 (float32 d and m
    here). A length that is not a multiple of 32 raises ValueError.
    """
    g = torch.Generator().manual_seed(61)
    x = torch.randn(8 * BLOCK, generator=g) * torch.linspace(0.01, 3.0, 8).repeat_interleave(BLOCK)
    x[5] += 0.37  # no block symmetric around zero by accident
    skewed = torch.rand(4 * BLOCK, generator=g) * 2 + 5  # all positive, far from zero
    outlier = x.clone()
    outlier[BLOCK + 3] = 40.0  # one outlier in block 1

    def deq(f, v):
        return _deq(f(v.clone()), v.numel())

    def raises_value_error(f):
        try:
            f(torch.randn(40, generator=g))
        except ValueError:
            return True
        return False

    def zero_block(f):
        v = torch.cat([torch.zeros(BLOCK), x[:BLOCK]])
        y = deq(f, v)
        return bool(torch.isfinite(y).all()) and bool((y[:BLOCK] == 0).all())

    def constant_block(f):
        v = torch.cat([torch.full((BLOCK,), 0.7), -torch.full((BLOCK,), 2.5)])
        y = deq(f, v)
        return bool(torch.isfinite(y).all()) and bool(torch.allclose(y, v, atol=1e-6, rtol=0))

    properties = [
        ("every weight within half a step of its block, step = (max - min) / 15", lambda f: _within_half_step(x, deq(f, x))),
        ("a block far from zero (5..7) keeps the bound: the offset m does the work", lambda f: _within_half_step(skewed, deq(f, skewed))),
        ("an all-zero block comes back as zeros, with no NaN", zero_block),
        ("a constant block comes back exactly, with no NaN", constant_block),
        ("an outlier in block 1 leaves every other block's values unchanged",
         lambda f: bool(torch.equal(torch.cat([deq(f, x)[:BLOCK], deq(f, x)[2 * BLOCK:]]),
                                    torch.cat([deq(f, outlier)[:BLOCK], deq(f, outlier)[2 * BLOCK:]])))
         and _within_half_step(outlier, deq(f, outlier))),
        ("quantizing the dequantized values again changes nothing (idempotent)",
         lambda f: bool(torch.allclose(deq(f, deq(f, x)), deq(f, x), atol=1e-5, rtol=0))),
        ("negating the input negates the output (no tie in these values)",
         lambda f: bool(torch.allclose(deq(f, -x), -deq(f, x), atol=1e-5, rtol=0))),
        ("a length that is not a multiple of 32 raises ValueError", raises_value_error),
    ]
    return _run("q4_1_roundtrip", fn, properties,
                hint="per block: which two values must the 16 codes reach, and what happens to d when the "
                     "block's largest and smallest values are equal? round, do not truncate")


def _layer(kind: str, out_features: int, in_features: int):
    from labkit.quant.blocklinear import BlockLinear
    from labkit.quant.linear import QuantLinear

    g = torch.Generator().manual_seed(out_features * 7 + in_features)
    w = torch.randn(out_features, in_features, generator=g)
    bf16 = torch.bfloat16
    makers = {
        "int8 packed": lambda: QuantLinear.from_float(w, 8, act_dtype=bf16),
        "int4 g64 packed": lambda: QuantLinear.from_float(w, 4, 64, act_dtype=bf16),
        "int4 g128 packed": lambda: QuantLinear.from_float(w, 4, 128, act_dtype=bf16),
        "int3 per-channel": lambda: QuantLinear.from_float(w, 3, "channel", reference=True),
        "NVFP4": lambda: BlockLinear(w, "NVFP4"),
        "Q8_0 W8A8": lambda: BlockLinear(w, "Q8_0", activations="int8", sums="reference"),
        "Q4_1 W4A8": lambda: BlockLinear(w, "Q4_1", activations="int8", sums="reference"),
    }
    return makers[kind]()


STEP_BYTES_KINDS = ("int8 packed", "int4 g64 packed", "int4 g128 packed", "int3 per-channel", "NVFP4", "Q8_0 W8A8",
                    "Q4_1 W4A8")


def _step_bytes(kind: str, out_features: int, in_features: int) -> int:
    from labkit.quant.apply import read_nbytes

    return read_nbytes(_layer(kind, out_features, in_features))


def check_step_bytes(fn) -> Verdict:
    """Check `fn(kind, out_features, in_features) -> bytes` that one product of such a labkit layer reads:
    every tensor of weights the product touches, in the dtype labkit keeps it in, float copies included.

    kinds: "int8 packed", "int4 g64 packed", "int4 g128 packed" (`QuantLinear.from_float(w, bits, group,
    act_dtype=torch.bfloat16)`; int8 is per channel), "int3 per-channel" (`QuantLinear.from_float(w, 3,
    "channel", reference=True)`), "NVFP4" (`BlockLinear(w, "NVFP4")`), "Q8_0 W8A8" and "Q4_1 W4A8"
    (`BlockLinear(w, fmt, activations="int8")`). Checked against `labkit.quant.read_nbytes` of the layers
    built, on shapes the chapter does not use.
    """
    shapes = [(96, 256), (16, 1024), (208, 128)]  # the int4 kernel packs rows by 16
    cases = [(kind, o, i) for kind in STEP_BYTES_KINDS for o, i in shapes]
    return check("step_bytes", fn, _step_bytes, cases,
                 compare=lambda expected, got: isinstance(got, (int, float)) and abs(got - expected) < 0.5,
                 hint="build one such layer and look at the buffers its forward reads (their dtypes and shapes): "
                      "the format's storage is not always what the product touches")


def check_quantize_rows(fn) -> Verdict:
    """Check `fn(w, bits) -> (codes, scale)`: symmetric round-to-nearest with one scale per row of the 2-D
    float tensor `w`: integer codes in -(2^(bits-1) - 1) .. 2^(bits-1) - 1 (an int8 tensor, the shape of `w`) and
    a float scale per row (shape [rows, 1]), the row standing for codes · scale. Every row uses its full range
    (its largest magnitude gets the largest code), every weight lies within half a step, an all-zero row comes
    back as zero codes with a positive scale (no 0 / 0), and a row whose largest magnitude is negative is no different from its negation.
    """
    g = torch.Generator().manual_seed(64)
    w = torch.randn(12, 64, generator=g)
    w[3, 7] = -9.0  # a row whose largest magnitude is negative
    w[5] = 0.0  # an all-zero row

    def parts(f, x, bits):
        codes, scale = f(x.clone(), bits)
        codes, scale = torch.as_tensor(codes), torch.as_tensor(scale).float().reshape(-1, 1)
        if codes.dtype.is_floating_point or tuple(codes.shape) != tuple(x.shape):
            raise ValueError(f"codes must be integers shaped like w {tuple(x.shape)}, got {codes.dtype} "
                             f"{tuple(codes.shape)}")
        if scale.shape[0] != x.shape[0]:
            raise ValueError(f"one scale per row ({x.shape[0]}), got {scale.numel()}")
        return codes.long(), scale

    def in_range(f, bits):
        codes, _ = parts(f, w, bits)
        q = 2 ** (bits - 1) - 1
        return int(codes.abs().max()) <= q

    def full_range(f, bits):
        codes, _ = parts(f, w, bits)
        q, live = 2 ** (bits - 1) - 1, w.abs().amax(1) > 0
        return bool((codes.abs().amax(1)[live] == q).all())

    def half_step(f, bits):
        codes, scale = parts(f, w, bits)
        y = codes.float() * scale
        return bool(torch.isfinite(y).all()) and bool(((y - w).abs() <= scale / 2 + 1e-6).all())

    def zero_row(f, bits):
        codes, scale = parts(f, w, bits)
        return bool(torch.isfinite(scale).all()) and float(scale[5]) > 0 and bool((codes[5] == 0).all())

    def negation(f, bits):
        (c1, s1), (c2, s2) = parts(f, w, bits), parts(f, -w, bits)
        return bool(torch.allclose(c1.float() * s1, -(c2.float() * s2), atol=1e-6))

    properties = [(f"{label} ({bits} bits)", lambda f, t=test, b=bits: t(f, b))
                  for bits in (8, 4) for label, test in (
                      ("every code within ±(2^(bits-1) - 1), the signed range with no wrap", in_range),
                      ("each row's largest magnitude gets the largest code: the full range is used", full_range),
                      ("every weight within half a step of codes · scale, all finite", half_step),
                      ("an all-zero row gives zero codes and a positive, finite scale (0 / 0 is NaN, and NaN cast to an "
                       "integer is undefined)", zero_row),
                      ("negating w negates what the codes stand for (a row's largest value may be negative)",
                       negation))]
    return _run("quantize_rows", fn, properties,
                hint="the property above says what the codes must satisfy: find the line of your function that "
                     "breaks it, fix that one, and run the checker again")
