"""Exercises of chapter 06: absmax int8 by hand, the bytes of a GGUF block."""
from __future__ import annotations

import torch

from labkit.exercises._core import check

__all__ = ["check_absmax_int8", "check_block_bytes"]


def _absmax(x):
    scale = x.abs().max() / 127
    return torch.round(x / scale).to(torch.int8), scale


def check_absmax_int8(fn) -> bool:
    """Check `fn(x) -> (codes, scale)`: symmetric absmax int8 of a 1-D float tensor, scale = max|x| / 127."""
    g = torch.Generator().manual_seed(6)
    cases = [(torch.tensor([0.5, -1.0, 0.25, 0.0]),), (torch.randn(32, generator=g),),
             (torch.tensor([3.0, -3.0, 1.5]),), (100 * torch.randn(7, generator=g),), (torch.tensor([-0.001, 0.002]),)]

    def compare(expected, got):
        from labkit.exercises._core import same

        return (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], torch.Tensor)
                and got[0].dtype == torch.int8 and same(expected[0], got[0]) and same(expected[1], torch.as_tensor(got[1])))

    return check("absmax_int8", fn, _absmax, cases, compare=compare,
                 hint="scale = x.abs().max() / 127; codes = torch.round(x / scale).to(torch.int8); return (codes, scale)")


def _block_bytes(block_size, code_bits, n_fp16):
    return block_size * code_bits / 8 + 2 * n_fp16


def check_block_bytes(fn) -> bool:
    """Check `fn(block_size, code_bits, n_fp16) -> bytes` of one GGUF block: the codes plus its fp16 numbers.

    Q8_0: 32 weights, 8-bit codes, one fp16 scale d. Q4_0: 4-bit codes, one d. Q4_1: 4-bit codes,
    a scale d and a minimum m.
    """
    cases = [(32, 8, 1), (32, 4, 1), (32, 4, 2), (256, 6, 1), (64, 2, 2), (16, 3, 1)]
    return check("block_bytes", fn, _block_bytes, cases,
                 hint="a block stores block_size codes of code_bits bits (block_size * code_bits / 8 bytes) "
                      "and n_fp16 numbers of 2 bytes each")
