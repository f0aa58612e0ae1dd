"""Tensor, disaggregated and data parallelism on two real processes give the single-process tokens.

The slicing of `shard` is checked in one process first (partial sums added by hand); the
three runners each spawn two ranks once, on the Shakespeare target, with short prompts.
"""
from __future__ import annotations

import pytest
import torch

from labkit.model import ModelConfig, Transformer
from labkit.serving.studies._dist import load_named
from labkit.serving.studies.parallel import (AllReduceLinear, run_data_parallel, run_disaggregated, run_tensor_parallel,
                                     shard)

needs_dist = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")

PROMPT = [5, 17, 300, 42, 7, 99, 1000, 12]
N_NEW = 4


@pytest.fixture(scope="module")
def model():
    return load_named("shakespeare")


@torch.inference_mode()
def greedy(model, prompt, n_new):
    """The plain loop: prefill into a cache, argmax, then one token at a time."""
    cache = model.new_cache(max_len=len(prompt) + n_new)
    logits = model(torch.tensor([prompt]), cache=cache)[0, -1]
    ids = [int(logits.argmax())]
    while len(ids) < n_new:
        ids.append(int(model(torch.tensor([[ids[-1]]]), cache=cache)[0, -1].argmax()))
    return logits, ids


@torch.inference_mode()
def test_shard_partials_add_up_to_the_full_model(model):
    parts = [shard(model, r, 2, reduce=False) for r in range(2)]
    cfg = parts[0].config
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.head_dim) == (3, 1, 512, model.config.head_dim)
    assert all(isinstance(p.layers[0].attn.wo, AllReduceLinear) for p in parts)
    x = model.tok_embeddings(torch.tensor([PROMPT]))  # [1, T, d_model]
    positions = torch.arange(len(PROMPT))
    for i, block in enumerate(model.layers):  # the residual stream of the full model, block by block
        h = block.attn_norm(x)
        attn = sum(p.layers[i].attn(h, p.rope, positions) for p in parts)
        torch.testing.assert_close(attn, block.attn(h, model.rope, positions))
        x = x + attn
        h = block.ffn_norm(x)
        mlp = sum(p.layers[i].mlp(h) for p in parts)
        torch.testing.assert_close(mlp, block.mlp(h))
        x = x + mlp
    full = model.new_cache(max_len=16).bytes_allocated()
    assert parts[0].new_cache(max_len=16).bytes_allocated() * 2 == full  # each rank keeps half the KV heads


def test_shard_refuses_what_does_not_divide():
    smol_like = Transformer(ModelConfig(vocab_size=16, d_model=36, n_layers=1, n_heads=9, n_kv_heads=3, ffn_dim=8))
    with pytest.raises(ValueError, match="n_heads=9"):
        shard(smol_like, 0, 2)
    odd_ffn = Transformer(ModelConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=7))
    with pytest.raises(ValueError, match="ffn_dim=7"):
        shard(odd_ffn, 0, 2)
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 1\] \(world=2\), got 2"):
        shard(odd_ffn, 2, 2)


@needs_dist
def test_tensor_parallel_gives_the_single_process_logits_and_ids(model):
    out = run_tensor_parallel("shakespeare", PROMPT, N_NEW, world=2)
    logits, ids = greedy(model, PROMPT, N_NEW)
    # float32, summed in another order (partial sums per rank): a few ulps of logits near 10
    torch.testing.assert_close(out["prefill_logits"], logits, atol=1e-5, rtol=1e-5)
    assert out["ids"] == ids
    n_layers = model.config.n_layers
    assert out["allreduce_count"] == 2 * n_layers * N_NEW  # two per block, prefill + N_NEW - 1 steps
    assert len(out["step_s"]) == N_NEW - 1 and out["allreduce_s"] > 0
    assert out["kv_bytes_per_rank"] * 2 == model.config.kv_bytes_per_token(4) * (len(PROMPT) + N_NEW - 1)


@needs_dist
def test_disaggregated_decode_gives_the_single_process_ids(model):
    out = run_disaggregated("shakespeare", PROMPT, N_NEW)
    assert out["ids"] == greedy(model, PROMPT, N_NEW)[1]
    cfg = model.config
    assert out["kv_bytes"] == 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * len(PROMPT) * 4
    assert out["transfer_s"] > 0 and out["bandwidth_bytes_per_s"] > 0 and len(out["decode_s"]) == N_NEW - 1


@needs_dist
def test_data_parallel_keeps_each_prompt_its_tokens(model):
    prompts = [PROMPT, PROMPT[:5], [3, 1, 4, 1, 5, 9]]
    out = run_data_parallel("shakespeare", prompts, 3, world=2)
    assert out["ids"] == [greedy(model, p, 3)[1] for p in prompts]
    assert [r["prompts"] for r in out["replicas"]] == [[0, 2], [1]]
    assert out["tokens"] == 9 and out["tokens_per_s"] > 0


def test_runners_check_their_arguments():
    with pytest.raises(ValueError, match="model_name"):
        run_tensor_parallel("no-such-model", PROMPT, N_NEW)
    with pytest.raises(ValueError, match="n_new"):
        run_disaggregated("shakespeare", PROMPT, 0)
    with pytest.raises(ValueError, match="prompt_ids"):
        run_data_parallel("shakespeare", [PROMPT, []], 2)


@needs_dist
def test_an_error_in_a_rank_reaches_the_parent_with_its_traceback():
    with pytest.raises(RuntimeError, match=r"(?s)rank \d of 2 failed.*token id 99999 is outside the vocabulary"):
        run_tensor_parallel("shakespeare", [1, 99999], 2, world=2)
