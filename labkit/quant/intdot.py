"""Integer activations and integer dot products: how llama.cpp multiplies a quantized matrix.

A weight-only format (labkit's packed kernels) turns each weight back into a float inside the
product. llama.cpp does the opposite: it quantizes each product's input row to 8 bits per block
of 32 as well, and multiplies integers. For one block b of a weight row n and an input row m:

    Q8_0 × Q8_0   w = dw·qw          a = da·qa            Σ w·a = dw·da·Σ qw·qa
    Q4_1 × Q8_1   w = dw·qw + mw     a = da·qa, s = da·Σqa   Σ w·a = dw·da·Σ qw·qa + mw·s

Σ qw·qa is a sum of 32 products of small integers: exact in int32, one `vpdpbusd` / `vdotq`
instruction family on a CPU. The Q4_1 minimum would need Σ qa in the inner loop; Q8_1 stores
s = da·Σqa once per block of the input, so the offset costs one multiply-add per block (the
"d·Σq trick"). The float work left is a few multiplies per block, not per weight.

    >>> x = torch.tensor([[0.5, -1.0] * 16])
    >>> q, d, s = quantize_activations(x, with_sum=True)
    >>> q[0, :2].tolist(), round(float(d[0, 0]), 6), float(s[0, 0])     # d = 1/127, Σq = 16·(64 − 127)
    ([64, -127], 0.007874, -7.9375)

Three ways to get the integer sums, equal to the last bit: `block_sums` (plain torch, int32
products; the reference), `float_block_sums` (one batched float32 product: every partial sum
of a block is an integer below 2^24, which float32 holds exactly, in any order of addition) and
`int_mm_block_sums` (one `torch._int_mm` call: each input row is spread into one row per block,
zeros elsewhere, so the weight is read once and every output is one block's sum; K/32 times the
arithmetic, which only a CPU with int8 dot products affords).
"""
from __future__ import annotations

import torch

__all__ = ["BLOCK", "quantize_activations", "block_sums", "float_block_sums", "int_mm_block_sums", "combine", "has_int_mm",
           "ACT_SUMS", "int_mm_exact", "resolve_sums"]

BLOCK = 32
ACT_SUMS = ("auto", "reference", "float", "int_mm")  # auto: "float", exact and fast on every CPU
_EXACT: dict = {}  # (ATen capability, oneDNN cap) -> whether torch._int_mm gave exact sums here


def has_int_mm() -> bool:
    """Whether this torch has `torch._int_mm` (int8 × int8 → int32) on the CPU."""
    if not hasattr(torch, "_int_mm"):
        return False
    try:
        torch._int_mm(torch.ones(1, 8, dtype=torch.int8), torch.ones(8, 8, dtype=torch.int8))
    except RuntimeError:
        return False
    return True


def int_mm_exact(mm=None) -> bool:
    """Whether `torch._int_mm` gives exact int32 sums on this machine (checked once, on extreme and random codes).

    It should: int8 × int8 products summed in int32 cannot overflow for K ≤ 2^17. But a CPU without
    int8 dot-product instructions (VNNI) has oneDNN multiply pairs with `vpmaddubsw`, which adds two
    u8 × s8 products into a *saturating* int16: seen with the kernels capped at AVX2 (ONEDNN_MAX_CPU_ISA=AVX2),
    where sums came out wrong by thousands. `mm` replaces `torch._int_mm` (for tests).
    """
    import os

    key = (torch.backends.cpu.get_cpu_capability(), os.environ.get("ONEDNN_MAX_CPU_ISA"), mm)
    if key not in _EXACT:
        if mm is None and not has_int_mm():
            _EXACT[key] = False
            return False
        g = torch.Generator().manual_seed(0)
        a = torch.randint(-127, 128, (4, 256), generator=g, dtype=torch.int8)
        a[0], a[1, ::2], a[1, 1::2] = -127, 127, -127  # the codes that saturate a pairwise int16 sum
        w = torch.randint(-127, 128, (256, 48), generator=g, dtype=torch.int8)
        w[:, 0], w[:, 1] = 127, -127
        got = (mm or torch._int_mm)(a, w)
        _EXACT[key] = torch.equal(got, a.to(torch.int32) @ w.to(torch.int32))
    return _EXACT[key]


def resolve_sums(sums: str) -> str:
    """"auto" -> "float" (exact on every CPU; "int_mm" spreads each row into K/32 rows, up to 60x slower at 256 rows
    on a CPU without VNNI, and is taken only when asked for); others as given."""
    return "float" if sums == "auto" else sums


def _round_away(x: torch.Tensor) -> torch.Tensor:
    """C `roundf` (halves away from zero), as ggml's reference quantizers round (`quantize_row_q8_1_ref`; its x86
    SIMD quantizer rounds ties to even); exact for the float below 0.5."""
    a = x.abs()
    whole = torch.floor(a)
    return torch.sign(x) * (whole + torch.floor(2 * (a - whole)))


def quantize_activations(x: torch.Tensor, with_sum: bool = False, block: int = BLOCK):
    """Q8_0 (or Q8_1 with `with_sum`) codes of input rows x [M, K]: (q int8 [M, K], d [M, K/32], s or None).

    d = max|x| / 127 per block, rounded to fp16 as the block stores it; q = round(x · (1/d)) with the
    float32 d (ggml's `quantize_row_q8_0_ref`); s = d·Σq (Q8_1), also kept at fp16 precision. The fp16 limits are
    llama.cpp's: s overflows once d·Σq passes 65,504, d once max|x| passes ~8.3e6; below ~1e-4 d is subnormal.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point torch.Tensor, got {type(x).__name__} {getattr(x, 'dtype', '')}")
    if x.dim() != 2 or x.shape[1] % block:
        raise ValueError(f"x must be rows [M, K] with K a multiple of {block}, got shape {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError("x contains NaN or inf; 8-bit activation codes need finite inputs")
    m, k = x.shape
    blocks = x.float().reshape(m, k // block, block)
    d = blocks.abs().amax(-1) / 127  # [M, nb]
    inv = torch.where(d > 0, 1 / torch.where(d > 0, d, torch.ones_like(d)), torch.zeros_like(d))
    q = _round_away(blocks * inv.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    d16 = d.half().float()
    s = (d * q.sum(-1, dtype=torch.int32).float()).half().float() if with_sum else None
    return q.reshape(m, k), d16, s


def block_sums(qa: torch.Tensor, qw: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Σ qw·qa within each block, exactly: qa [M, K], qw [N, K] integer codes -> int32 [M, N, K/32].

    The reference: one int32 matrix product per block (integer arithmetic, no rounding anywhere;
    32 products of |q| ≤ 127 stay far below 2^31).
    """
    m, k = qa.shape
    a = qa.to(torch.int32).reshape(m, k // block, block)
    w = qw.to(torch.int32).reshape(qw.shape[0], k // block, block)
    return torch.stack([a[:, b] @ w[:, b].t() for b in range(k // block)], dim=-1)


FLOAT_EXACT_BLOCK = 2**24 // (127 * 127)  # the largest block whose every partial sum float32 holds exactly


def float_block_sums(qa: torch.Tensor, qw: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """`block_sums` as one batched float32 product: qa [M, K], qw [N, K] integer codes -> int32 [M, N, K/32].

    Exact, not approximately: each product |qa·qw| ≤ 127·127 and each partial sum of a block is an integer of
    magnitude ≤ block·127·127 < 2^24, so float32 represents every intermediate exactly, whatever order (or fused
    multiply-add) the matrix library adds in.
    """
    if block > FLOAT_EXACT_BLOCK:
        raise ValueError(f"block must be at most {FLOAT_EXACT_BLOCK} for exact float32 sums, got {block}")
    m, k = qa.shape
    nb = k // block
    a = qa.float().reshape(m, nb, block).transpose(0, 1)  # [nb, M, block]
    w = qw.float().reshape(qw.shape[0], nb, block).permute(1, 2, 0)  # [nb, block, N]
    return torch.bmm(a, w).permute(1, 2, 0).to(torch.int32)  # [M, N, nb]


def int_mm_block_sums(qa: torch.Tensor, qw_t: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """`block_sums` in one `torch._int_mm`: qa [M, K] int8, qw_t [K, N] int8 (the weight's codes transposed).

    Row m of the input becomes K/32 rows, row (m, b) holding block b of row m and zeros elsewhere,
    so the product's row (m, b) is block b's integer sum for every output. The weight is read once;
    the arithmetic grows K/32 times, which a memory-bound product at M = 1 can afford.
    """
    m, k = qa.shape
    nb = k // block
    spread = qa.new_zeros(m, nb, nb, block)
    i = torch.arange(nb)
    spread[:, i, i] = qa.reshape(m, nb, block)
    sums = torch._int_mm(spread.reshape(m * nb, k), qw_t)  # [M·nb, N] int32
    return sums.reshape(m, nb, -1).transpose(1, 2)  # [M, N, nb]


def combine(sums: torch.Tensor, da: torch.Tensor, dw: torch.Tensor, sa: torch.Tensor | None = None,
            mw: torch.Tensor | None = None) -> torch.Tensor:
    """The float output from the integer block sums [M, N, nb]: Σ_b dw·da·sum (+ Σ_b mw·s for Q4_1 × Q8_1).

    da, sa [M, nb]; dw, mw [N, nb]. Both sum paths give identical int32 sums, so identical outputs.
    """
    y = (sums.float() * (da.unsqueeze(1) * dw.unsqueeze(0))).sum(-1)  # [M, N]
    if mw is not None:
        if sa is None:
            raise ValueError("a Q4_1 weight needs the activations' block sums sa (Q8_1: quantize_activations(with_sum=True))")
        y = y + sa @ mw.t()
    return y
