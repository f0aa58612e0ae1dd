"""The KV cache of big models at long context, from published shapes: two claims computed with what they assume.

**"A 175B model in FP16 needs about 32 GB of KV at prefill."** GPT-3 175B (Brown et al. 2020,
table 2.1: 96 layers, d_model 12,288, 96 heads of 128, no GQA) stores 2 · 96 · 12,288 values a
token: 4.72 MB in FP16. `tokens_for_bytes` says how many tokens, across a batch, fill a budget: 32 GB
is about 6,782 tokens, 3.3 of its full 2,048-token contexts.

**"DeepSeek-V4's KV cache at a million tokens is about 10 % of the previous generation's"**
(DeepSeek-AI 2026, "DeepSeek-V4: Towards Highly Efficient Million-Token Context Intelligence",
abstract and section 1; the previous generation is DeepSeek-V3.2). Modelled here from the
published shapes; each layout below says where its numbers come from, and what is assumed:

* V3.2 (deepseek-ai/DeepSeek-V3.2-Exp, `inference/config_671B_v3.2.json` and `model.py`; FlashMLA's
  README for the deployed cache layout): 61 layers, each caching per token one MLA latent of 512
  values plus a 64-value RoPE key (Liu et al. 2024, DeepSeek-V2), and one key of 128 values for the
  lightning indexer. Assumed as deployed: the latent in FP8 with four float32 scales, the RoPE part in
  BF16 (656 bytes), the indexer key in FP8 with one float32 scale (132 bytes).
* V4-Pro (the report's section 2.3 and 4.2.1; `config.json` of deepseek-ai/DeepSeek-V4-Pro:
  `compress_ratios`, `sliding_window` = 128, `head_dim` = 512, `index_head_dim` = 128): 61 layers; 30 use
  CSA (4 tokens to one entry, plus an indexer key per entry), 31 use HCA (128 tokens to one entry, no
  indexer); every layer also keeps its last 128 tokens uncompressed. An entry is one shared key/value
  vector of 512 values: 448 in FP8, the 64 RoPE values in BF16, 8 bytes of scales (584 bytes); the
  indexer key in FP4 with its scales (68 bytes), as the report's section 2.3.4 describes.
* V4-Flash: 43 layers, 21 CSA, 20 HCA, 2 with the window only; the same entry sizes.

With those byte layouts the shapes give 10.5 % (Pro) and 7.3 % (Flash) at 1,048,576 tokens, the
report's 10 % and 7 %. The dtypes are part of the claim: with every value in BF16 on both sides the
same shapes give Pro 11.5 % (`ratio_at(..., bf16=True)`), and V4's BF16 cache is 21 % of V3.2's FP8 one. The entries of a request's unfinished blocks
(a few float32 rows per layer) are left out: kilobytes, at a million tokens nothing.

    >>> round(ratio_at("deepseek-v4-pro", "deepseek-v3.2", 2**20), 3), round(ratio_at("deepseek-v4-pro", "deepseek-v3.2", 2**20, bf16=True), 3)
    (0.105, 0.115)
    >>> round(layout_bytes("deepseek-v4-pro", 2**20, bf16=True) / layout_bytes("deepseek-v3.2", 2**20), 2)
    0.21
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks
from labkit.model.config import ModelConfig, kv_bytes

__all__ = ["KVLayout", "LAYOUTS", "layout_bytes", "ratio_at", "tokens_for_bytes", "gpt3_175b"]


@dataclass(frozen=True)
class KVLayout:
    """A model's KV cache by layer kind: per layer kind (count, tokens per entry, entry bytes, index-key bytes)."""

    name: str
    layers: tuple[tuple[int, int, float, float], ...]  # (n_layers, tokens merged per entry, entry bytes, index bytes)
    window: int = 0  # tokens every layer keeps uncompressed (a constant, whatever the context)
    window_entry: float = 0.0  # bytes of one such token
    bf16: tuple[tuple[int, int, float, float], ...] = ()  # the same layers with every value in BF16
    source: str = ""


def _fp8_entry(fp8_values: int, bf16_values: int, scale_bytes: float) -> float:
    return kv_bytes(fp8_values, 8) + kv_bytes(bf16_values, 16) + scale_bytes


V32_ENTRY = _fp8_entry(512, 64, 16)  # 656 B: latent in FP8 + 4 float32 scales, RoPE key in BF16
V32_INDEX = _fp8_entry(128, 0, 4)  # 132 B: FP8 indexer key + one float32 scale
V4_ENTRY = _fp8_entry(448, 64, 8)  # 584 B: FP8 + BF16 RoPE part + 7 ue8m0 scales and a pad byte
V4_INDEX = kv_bytes(128, 4) + 4  # 68 B: FP4 indexer key + its ue8m0 scales
BF16 = dict(v32=kv_bytes(576, 16), v32_index=kv_bytes(128, 16), v4=kv_bytes(512, 16), v4_index=kv_bytes(128, 16))

LAYOUTS: dict[str, KVLayout] = {
    "deepseek-v3.2": KVLayout("deepseek-v3.2", ((61, 1, V32_ENTRY, V32_INDEX),),
                              bf16=((61, 1, BF16["v32"], BF16["v32_index"]),),
                              source="DeepSeek-V3.2-Exp config_671B_v3.2.json and model.py; FlashMLA README (FP8 layout)"),
    "deepseek-v4-pro": KVLayout("deepseek-v4-pro", ((30, 4, V4_ENTRY, V4_INDEX), (31, 128, V4_ENTRY, 0.0)),
                                window=128, window_entry=V4_ENTRY,
                                bf16=((30, 4, BF16["v4"], BF16["v4_index"]), (31, 128, BF16["v4"], 0.0)),
                                source="DeepSeek-V4 report sections 2.3 and 4.2.1; DeepSeek-V4-Pro config.json"),
    "deepseek-v4-flash": KVLayout("deepseek-v4-flash", ((21, 4, V4_ENTRY, V4_INDEX), (20, 128, V4_ENTRY, 0.0),
                                                        (2, 0, 0.0, 0.0)),
                                  window=128, window_entry=V4_ENTRY,
                                  bf16=((21, 4, BF16["v4"], BF16["v4_index"]), (20, 128, BF16["v4"], 0.0), (2, 0, 0.0, 0.0)),
                                  source="DeepSeek-V4 report section 4.2.1"),
}


def layout_bytes(name: str, n_tokens: int, bf16: bool = False) -> float:
    """KV bytes of one sequence of `n_tokens` for layout `name` (`LAYOUTS`); `bf16`: every value in BF16."""
    if name not in LAYOUTS:
        raise ValueError(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}")
    checks.integer("n_tokens", n_tokens, 0)
    lay = LAYOUTS[name]
    total, n_layers = 0.0, 0
    for count, merged, entry, index in (lay.bf16 if bf16 else lay.layers):
        n_layers += count
        if merged:
            total += count * (n_tokens // merged) * (entry + index)
    window_entry = BF16["v4"] if bf16 and lay.window else lay.window_entry
    return total + n_layers * min(lay.window, n_tokens) * window_entry


def ratio_at(name: str, baseline: str, n_tokens: int, bf16: bool = False) -> float:
    """KV bytes of `name` over `baseline` at `n_tokens` (both in their published dtypes, or both in BF16)."""
    checks.positive_int("n_tokens", n_tokens)
    return layout_bytes(name, n_tokens, bf16) / layout_bytes(baseline, n_tokens, bf16)


def gpt3_175b() -> ModelConfig:
    """GPT-3 175B's shape (Brown et al. 2020, table 2.1): 96 layers, d_model 12,288, 96 heads, context 2,048."""
    return ModelConfig(name="gpt-3-175b", vocab_size=50257, d_model=12288, n_layers=96, n_heads=96, ffn_dim=4 * 12288,
                       max_seq_len=2048)


def tokens_for_bytes(config: ModelConfig, budget_bytes: float, bits: float = 16) -> float:
    """How many cached tokens (summed over a batch) fill `budget_bytes` at `bits` a value."""
    if not budget_bytes > 0:
        raise ValueError(f"budget_bytes must be > 0, got {budget_bytes!r}")
    return budget_bytes / config.kv_bytes_per_token(bits / 8)
