"""Exercises of the deep dive on formats and kernels (06a): an E2M1 rounding, the bits a K-quant layout costs, and
one block's integer dot product with the d·Σq trick.

Each checker compares the learner's function with labkit's own implementation (`labkit.quant.mx`, `ggml`'s
block sizes) on cases built to separate the plausible wrong answers: ties rounded the other way, saturation
forgotten, a super-block's float16 scales left out, the minimum's offset applied per weight instead of per block.
"""
from __future__ import annotations

import torch

from labkit.exercises._core import Verdict, check, run_steps

__all__ = ["check_e2m1_round", "check_kquant_bits", "check_block_dot"]


def _reference_e2m1(v: torch.Tensor) -> torch.Tensor:
    from labkit.quant import mx

    return torch.from_numpy(mx.e2m1_decode(mx.e2m1_encode(v.numpy()))).float()


def check_e2m1_round(fn) -> Verdict:
    """Check `fn(v) -> tensor`: each value of the 1-D float32 tensor `v` (already divided by its block's scale)
    rounded to the nearest E2M1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives); magnitudes above 6
    saturate to ±6; a tie goes to the smaller magnitude, as llama.cpp's MXFP4 rounds."""
    g = torch.Generator().manual_seed(66)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    cases = [(torch.rand(64, generator=g) * 16 - 8,), (ties,), (-ties,), (torch.tensor([6.0, 6.5, 7.0, 100.0, -9.0]),),
             (torch.tensor([0.0, 1e-6, -1e-6, 0.2499, 0.2501, 2.49, 2.51, 4.99, 5.01]),)]
    return check("e2m1_round", fn, _reference_e2m1, cases,
                 compare=lambda want, got: isinstance(got, torch.Tensor) and got.shape == want.shape
                 and bool(torch.equal(got.float(), want)),
                 hint="the E2M1 grid is not evenly spaced: find the midpoints between neighbours, and send a value "
                      "that sits exactly on one to the smaller magnitude; anything above 6 is 6")


def _reference_kquant_bits(code_bits: int, sub_block: int, scale_bits: int, has_min: bool) -> float:
    per_sub = scale_bits * (2 if has_min else 1)  # a scale, and a minimum of as many bits where the format has one
    per_super = 16 * (2 if has_min else 1)  # float16 d, and float16 dmin
    return code_bits + per_sub / sub_block + per_super / 256


def check_kquant_bits(fn) -> Verdict:
    """Check `fn(code_bits, sub_block, scale_bits, has_min) -> bits per weight` of a K-quant layout: super-blocks
    of 256 weights; each weight a `code_bits` code; each sub-block of `sub_block` weights a `scale_bits` scale
    (and, where `has_min`, a minimum of as many bits); each super-block one float16 `d` (and a float16 `dmin`
    where `has_min`). Checked on the layouts ggml ships (Q2_K ... Q6_K, whose sizes `labkit.quant.ggml` knows)
    and on layouts nobody ships."""
    from labkit.quant import ggml

    shipped = {"Q4_K": (4, 32, 6, True), "Q5_K": (5, 32, 6, True), "Q6_K": (6, 16, 8, False)}
    for name, layout in shipped.items():  # the reference agrees with the shipped sizes, or the checker is wrong
        if abs(_reference_kquant_bits(*layout) - ggml.bits_per_weight(name)) > 1e-9:
            raise AssertionError(f"the reference disagrees with ggml on {name}")
    cases = [*shipped.values(), (2, 16, 4, True), (3, 16, 6, False), (4, 64, 8, False), (8, 32, 4, True),
             (1, 8, 2, False)]
    return check("kquant_bits", fn, _reference_kquant_bits, cases,
                 hint="add up one super-block: 256 codes, 256 / sub_block scales (and minimums), and its float16 "
                      "numbers; then divide by 256")


def _block(seed: int, big: bool = False):
    g = torch.Generator().manual_seed(seed)
    qw = torch.full((32,), 15, dtype=torch.uint8) if big else torch.randint(0, 16, (32,), generator=g, dtype=torch.uint8)
    qa = torch.full((32,), 127, dtype=torch.int8) if big else torch.randint(-127, 128, (32,), generator=g,
                                                                             dtype=torch.int8)
    dw, mw, da = (float(v) for v in torch.rand(3, generator=g) * torch.tensor([0.02, -0.1, 0.03]) + 1e-3)
    return qw, dw, mw, qa, da


def check_block_dot(fn) -> Verdict:
    """Check `fn(qw, dw, mw, qa, da) -> (isum, value)`: one Q4_1 weight block (codes `qw`, uint8 0..15, weights
    dw·qw + mw) times one Q8_1 activation block (codes `qa`, int8, activations da·qa): `isum` the exact integer
    Σ qw·qa (a Python int), `value` = dw·da·isum + mw·da·Σqa, the float work per block only (within 1e-5 of the
    float product)."""
    def step(seed, big=False):
        def run(f):
            qw, dw, mw, qa, da = _block(seed, big)
            isum, value = f(qw.clone(), dw, mw, qa.clone(), da)
            exact = int((qw.long() * qa.long()).sum())
            if not isinstance(isum, int) or isum != exact:
                return f"block {seed}: isum {isum!r} is not the exact integer Σ qw·qa = {exact}"
            want = float(((dw * qw.double() + mw) * (da * qa.double())).sum())
            if abs(float(value) - want) > 1e-5 * max(1.0, abs(want)):
                return f"block {seed}: value {float(value):.6g}, the float product of the same block is {want:.6g}"
            return None
        return run

    steps = [step(s) for s in range(6)] + [step(99, big=True)]
    return run_steps("block_dot", fn, steps,
                     hint="widen the codes before multiplying (15 · 127 · 32 does not fit in 8 or 16 bits), and "
                          "apply the weights' minimum once per block through Σqa, not once per weight")
