"""The windowed cache (`labkit.kvcache.windowed`): a local layer keeps only what its window still sees, and the
logits are those of the contiguous cache, bit for bit, in passes that cross the window."""
import pytest
import torch

from labkit.generation.stages import decode, prefill
from labkit.generation.state import load_state
from tests.test_gemma3 import tiny_gemma

IDS = [(7 * i + 3) % 50 for i in range(48)]


def _run(model, cache, prompt: int, step: int) -> torch.Tensor:
    with torch.no_grad():
        got = [model(torch.tensor([IDS[:prompt]]), cache=cache)[0]]
        got += [model(torch.tensor([IDS[i:i + step]]), cache=cache)[0] for i in range(prompt, len(IDS), step)]
    return torch.cat(got)


@pytest.mark.parametrize("prompt, step", [(10, 1), (12, 5), (16, 4)])
def test_logits_equal_the_contiguous_cache_bit_for_bit(prompt, step):
    model = tiny_gemma()  # layers 0 and 1 local (window 16), layer 2 global
    want = _run(model, model.new_cache(max_len=64), prompt, step)
    cache = model.new_cache("windowed", max_len=64, chunk=5)
    assert torch.equal(_run(model, cache, prompt, step), want)
    assert cache.capacities() == [20, 20, 64]
    assert cache.start[2] == 0 and min(cache.start[:2]) > 0  # the local layers dropped what no query sees


def test_a_local_layers_memory_is_capped_by_its_window():
    model = tiny_gemma()
    full, windowed = model.new_cache(max_len=64), model.new_cache("windowed", max_len=64, chunk=4)
    _run(model, full, 4, 4)
    _run(model, windowed, 4, 4)
    per_token = full.bytes_used() // (3 * len(IDS))  # one layer's keys and values of one token
    held = [len(IDS) - s for s in windowed.start]
    assert held[2] == len(IDS) and all(h <= 16 - 1 + 4 for h in held[:2])
    assert windowed.bytes_used() == sum(held) * per_token
    assert windowed.bytes_allocated() < full.bytes_allocated()


def test_a_long_prompt_is_fed_in_chunks_and_decoding_matches():
    model = tiny_gemma()
    assert model.new_cache("windowed", max_len=64).plan_chunks(40) == [16, 16, 8]  # window-16 layers: 15 + 16 slots
    a = prefill(model, IDS[:40], cache="windowed", max_len=64)
    b = prefill(model, IDS[:40], cache="contiguous", max_len=64)
    assert torch.allclose(a.logits, b.logits, atol=1e-5)  # chunks sum in another order than one pass
    assert decode(model, a, 6) == decode(model, b, 6)


def test_refusals_and_a_saved_state_loads_back(tmp_path):
    model = tiny_gemma()
    with pytest.raises(ValueError, match="chunk must be a positive integer"):
        model.new_cache("windowed", max_len=64, chunk=0)
    state = prefill(model, IDS[:30], cache=model.new_cache("windowed", max_len=64, chunk=4))
    with pytest.raises(ValueError, match="takes at most 4 new tokens per forward pass"):
        state.cache.begin(5)
    with pytest.raises(ValueError, match="a local layer no longer holds the tokens before position"):
        state.cache.truncate(2)
    state.save(tmp_path / "state.safetensors")
    again = load_state(tmp_path / "state.safetensors", model)
    assert again.cache.kind == "windowed" and again.cache.start == state.cache.start
    assert decode(model, again, 5) == decode(model, state, 5)


def test_the_size_formula_is_what_the_cache_allocates():
    from labkit.kvcache.sizing import full_bytes, held_bytes

    model = tiny_gemma()
    for opts in ({"max_len": 64}, {"max_len": 64, "chunk": 4}, {"max_len": 10}):
        cache = model.new_cache("windowed", **opts)
        assert held_bytes(model.config, "windowed", opts, 64) == cache.bytes_allocated()
    all_global = tiny_gemma(layer_windows=())
    assert held_bytes(all_global.config, "windowed", {"max_len": 64}, 64) == full_bytes(all_global.config, 64)
