"""The caches on the real model: SmolLM2-135M in float32."""
import pytest
import torch

import labkit
from tests.smollm2_shared import smollm2

QUESTION = "Explain in two sentences why the sky is blue, and mention Rayleigh scattering by name."


@pytest.fixture(scope="module")
def model_and_prompt():
    model, tok = smollm2()
    return model, tok.encode_chat([{"role": "user", "content": QUESTION}])


@torch.inference_mode()
def test_contiguous_and_paged_caches_equal_the_uncached_model_at_every_position(model_and_prompt):
    model, prompt = model_and_prompt
    x = torch.tensor([prompt])
    full = model(x)
    logits = {}
    for kind, opts in (("contiguous", {}), ("paged", {"block_size": 16})):
        cache = model.new_cache(kind, max_len=len(prompt), **opts)
        pieces = [model(x[:, :40], cache=cache)] + [model(x[:, t:t + 1], cache=cache) for t in range(40, len(prompt))]
        logits[kind] = torch.cat(pieces, dim=1)
    torch.testing.assert_close(logits["contiguous"], full, atol=3e-4, rtol=0)  # logits of size ~20
    assert torch.equal(logits["paged"], logits["contiguous"])


@torch.inference_mode()
def test_int8_and_int4_caches_keep_the_greedy_reply(model_and_prompt):
    """With residual=32 and a 48-token prompt, 32 keys and 16+ values per head are held as codes."""
    model, prompt = model_and_prompt
    reference = labkit.decode(model, labkit.prefill(model, prompt), 12)
    for bits in (8, 4):
        cache = model.new_cache("quantized", max_len=len(prompt) + 12, bits=bits, group_size=32, residual=32)
        state = labkit.prefill(model, prompt, cache=cache)
        assert labkit.decode(model, state, 12) == reference, bits
        assert cache.counts["qk"] >= 32 and cache.counts["qv"] >= 16
        assert cache.bytes_used() < 0.7 * model.config.kv_bytes_per_token(4) * cache.seq_len


@torch.inference_mode()
def test_sampled_reply_resumes_identically_from_a_file(model_and_prompt, tmp_path):
    model, prompt = model_and_prompt
    sampling = dict(temperature=0.8, top_p=0.9)
    state = labkit.prefill(model, prompt, cache=model.new_cache("sliding", window=64, sinks=4), seed=5)
    state.save(tmp_path / "smollm2.safetensors")
    uninterrupted = labkit.decode(model, state, 20, **sampling)  # crosses the window: evictions after the save
    resumed = labkit.PrefillState.load(tmp_path / "smollm2.safetensors", model)
    assert labkit.decode(model, resumed, 20, **sampling) == uninterrupted
