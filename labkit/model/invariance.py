"""Are this machine's default kernels row-invariant? A self-check per weight format (`labkit doctor` prints it).

The batch-invariant mode (`Transformer.batch_invariant`) is exact on any CPU because it checks
each kernel before trusting it (`labkit.quant.rows`). Whether it *needs* to change anything
depends on the machine: where a format's default product and attention already give a row the
same bits alone and among others, a k-token pass without the mode equals k one-token steps
anyway; where they do not, speculative decoding without the mode can reply differently from
plain decoding. `default_kernels_report()` answers per format, on SmolLM2's shapes (d_model 576,
FFN 1536, 9 query heads on 3 KV heads of 64), for 1 to 16 rows, in about a second.
"""
from __future__ import annotations

import torch

from labkit.kvcache.base import attention, causal_mask
from labkit.quant.linear import QuantLinear, has_kernel
from labkit.quant.rows import INVARIANT_MAX_ROWS, rows_agree

__all__ = ["default_kernels_report", "attention_rows_agree", "FORMATS"]

FORMATS = ("float32", "bfloat16", "int8 (bf16 act)", "int4 (bf16 act)", "int8 (fp32 act)", "int4 (fp32 act)")


def _product(fmt: str, weight: torch.Tensor):
    """(product on [N, in], activation dtype) as a one-token step of `fmt` calls it, or None without a kernel."""
    if fmt == "float32":
        wt = weight.t().contiguous()  # column-major weight: labkit.load's float32 layout
        return (lambda a: torch.mm(a, wt)), torch.float32
    if fmt == "bfloat16":
        wt = weight.to(torch.bfloat16).t()  # row-major: half precision is kept row-major
        return (lambda a: torch.mm(a, wt)), torch.bfloat16
    bits = 8 if fmt.startswith("int8") else 4
    if not has_kernel(bits):
        return None
    act = torch.bfloat16 if "bf16" in fmt else torch.float32
    layer = QuantLinear.from_float(weight, bits=bits, act_dtype=act)
    return layer.kernel, act


def attention_rows_agree(dtype: torch.dtype, keys: int = 40, seed: int = 0) -> bool:
    """Whether one masked attention call over 2..16 queries gives each query the bits it gets attending alone."""
    g = torch.Generator().manual_seed(seed)
    T = INVARIANT_MAX_ROWS
    q = torch.randn(1, T, 9, 64, generator=g).to(dtype)
    k, v = (torch.randn(1, 3, keys + T, 64, generator=g).to(dtype) for _ in range(2))
    alone = torch.cat([attention(q[:, i:i + 1], k[:, :, :keys + i + 1], v[:, :, :keys + i + 1]) for i in range(T)])
    for m in range(2, T + 1):
        together = attention(q[:, :m], k[:, :, :keys + m], v[:, :, :keys + m], causal_mask(m, keys + m))
        if not torch.equal(together, alone[:m]):
            return False
    return True


@torch.inference_mode()
def default_kernels_report(formats=FORMATS) -> list[dict]:
    """Per format: whether its products and its attention are row-invariant here, and what the mode does about it."""
    g = torch.Generator().manual_seed(0)
    shapes = [(1728, 576), (576, 1536)]  # SmolLM2's fused QKV-sized and down-projection-sized products
    weights = {s: torch.randn(*s, generator=g) * 0.05 for s in shapes}
    attn = {dt: attention_rows_agree(dt) for dt in (torch.float32, torch.bfloat16)}
    rows = []
    for fmt in formats:
        agree = []
        for shape, w in weights.items():
            made = _product(fmt, w)
            if made is None:
                break
            product, act = made
            agree.append(rows_agree(product, shape[1], act))
        if len(agree) < len(weights):
            rows.append({"format": fmt, "available": False})
            continue
        act_attn = torch.bfloat16 if fmt == "bfloat16" else torch.float32  # the cache's dtype
        products, attention_ok = all(agree), attn[act_attn]
        rows.append({"format": fmt, "available": True, "products": products, "attention": attention_ok,
                     "invariant": products and attention_ok,
                     "mode": ("one call per pass" if products else "one call per row") + ", each query alone"})
    return rows
