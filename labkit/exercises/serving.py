"""Exercises of the serving chapter: paged KV blocks, the critical decode batch, the price of a million tokens."""
from __future__ import annotations

import math

from labkit.exercises._core import check

__all__ = ["check_kv_blocks", "check_critical_batch", "check_cost_per_million"]


def _reference_kv_blocks(lengths: list[int], block_size: int) -> int:
    # each request owns its blocks (no prefix sharing); a partly filled last block is still a whole block
    return sum(math.ceil(n / block_size) for n in lengths)


def check_kv_blocks(fn) -> bool:
    """Check `fn(lengths, block_size) -> blocks` a paged KV cache needs for requests of these token lengths."""
    cases = [
        ([16, 32, 48], 16),          # exact multiples: no partial block
        ([1, 1, 1], 16),             # three 1-token requests still take a block each
        ([17, 100, 5], 16),          # 2 + 7 + 1
        ([4097, 2048, 300], 256),    # one token past a block boundary costs a whole block
        ([1000], 1),                 # block size 1: one block per token
        ([], 16),                    # no requests, no blocks
    ]
    return check("kv_blocks", fn, _reference_kv_blocks, cases,
                 hint="each request needs ceil(length / block_size) blocks of its own (math.ceil, not //); "
                      "add them up per request, not over the pooled tokens")


def _reference_critical_batch(peak_flops: float, bandwidth: float, weight_bytes: float, n_params: float,
                              kv_bytes_per_seq: float) -> float:
    # compute 2 N B / F  =  memory (W + B kv) / BW   ->   B = W / (2 N BW / F - kv)
    denominator = 2 * n_params * bandwidth / peak_flops - kv_bytes_per_seq
    return weight_bytes / denominator if denominator > 0 else math.inf


def check_critical_batch(fn) -> bool:
    """Check `fn(peak_flops, bandwidth, weight_bytes, n_params, kv_bytes_per_seq) -> batch` (math.inf if never)."""
    h100 = (989e12, 3.35e12)                      # fp16 dense FLOP/s, HBM3 bytes/s
    l2_7b = (13.48e9, 6.74e9)                     # Llama-2-7B in fp16: weight bytes, parameters
    kv_mha = 524288                               # its KV bytes per token (32 layers x 32 heads x 128, K and V, fp16)
    mistral = (14.48e9, 7.24e9)                   # a 7B with GQA (8 KV heads): 131072 KV bytes per token
    cases = [
        (*h100, *l2_7b, 0.0),                     # no KV: the ridge in tokens (F x 2 bytes / (2 BW))
        (*h100, *l2_7b, 32 * kv_mha),             # short context: KV pushes the batch up
        (*h100, 3.79e9, 6.74e9, 32 * kv_mha),     # INT4 weights (4.5 bits): fewer bytes, smaller batch
        (*h100, *mistral, 128 * 131072),          # GQA at 128 tokens
        (*h100, *l2_7b, 2048 * kv_mha),           # 1 GiB of KV per sequence: never compute-bound
    ]
    return check("critical_batch", fn, _reference_critical_batch, cases,
                 hint="set 2 N B / F equal to (W + B kv) / BW and solve for B; when each sequence's KV bytes "
                      "take as long to read as its FLOPs take to compute (2 N BW / F <= kv), return math.inf")


def _reference_cost_per_million(tokens_per_s: float, price_per_hour: float) -> float:
    # tokens an hour = tokens_per_s * 3600; dollars per token = price / that; times a million
    return price_per_hour / (tokens_per_s * 3600) * 1e6


def check_cost_per_million(fn) -> bool:
    """Check `fn(tokens_per_s, price_per_hour) -> dollars per million tokens`."""
    cases = [(1000, 3.6), (2379, 8 * 2.99), (50, 0.5), (15195, 8 * 2.99), (1e5, 0.0)]
    return check("cost_per_million", fn, _reference_cost_per_million, cases,
                 hint="an hour produces tokens_per_s * 3600 tokens for price_per_hour dollars; scale to 1e6 tokens")
