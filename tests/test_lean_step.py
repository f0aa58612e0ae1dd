"""The lean decode step: its operator calls (so they cannot creep back), no read-back but the token,
the cache capabilities declared in one place, and the one token chooser."""
import math

import pytest
import torch

from labkit import kvcache
from labkit.generation.profile import _quiet_stderr
from labkit.generation.stages import decode, prefill
from labkit.model import ModelConfig, Transformer
from labkit.sampling import SamplingParams, process_logits, sample_next

SMOLLM2_LAYERS = 30


def _model(n_layers: int, layout: str = "interleaved") -> Transformer:
    # SmolLM2's shape in small: grouped-query attention, the GGUF (interleaved) RoPE layout, column-major weights
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=n_layers, n_heads=4, n_kv_heads=2, ffn_dim=64, rope_layout=layout)
    torch.manual_seed(0)
    return Transformer(cfg).column_major_().eval()


def _step_events(model) -> dict[str, int]:
    state = prefill(model, [1, 2, 3, 4, 5], max_len=32)
    decode(model, state, 2)  # warm: RoPE tables, kept views
    with _quiet_stderr(), torch.profiler.profile() as prof:
        decode(model, state, 1)
    return {e.key: e.count for e in prof.key_averages() if e.key.startswith("aten::")}


def test_a_decode_step_stays_within_its_operator_budget():
    """Counted as `torch.profiler` counts them, nested calls included: per layer and outside the layers."""
    two, four = (sum(_step_events(_model(n)).values()) for n in (2, 4))
    per_layer, fixed = (four - two) / 2, two - (four - two)
    assert per_layer <= 96, f"{per_layer} operator calls a layer"  # 181 before the lean path
    assert fixed <= 60, f"{fixed} operator calls outside the layers"
    assert SMOLLM2_LAYERS * per_layer + fixed <= 3000  # SmolLM2's step (5,501 before)


def test_a_decode_step_reads_back_only_the_token_it_chose():
    events = _step_events(_model(2))
    assert events.get("aten::_local_scalar_dense", 0) <= 2  # the greedy choice: its value (NaN check) and its id
    for syncing in ("aten::isnan", "aten::any", "aten::min", "aten::max.default", "aten::nonzero"):
        assert syncing not in events, syncing


def test_step_is_forward_without_the_id_check():
    model = _model(2)
    ids = torch.tensor([[3, 9, 1]])
    a, b = model.new_cache(max_len=8), model.new_cache(max_len=8)
    with torch.inference_mode():
        torch.testing.assert_close(model.step(ids, cache=a), model(ids, cache=b), rtol=0, atol=0)
        torch.testing.assert_close(model.step(ids[:, :1], cache=a), model(ids[:, :1], cache=b), rtol=0, atol=0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.tensor([[64]]))
    short = Transformer(model.config.replace(max_seq_len=8)).eval()
    cache = short.new_cache(max_len=16)  # a cache larger than the context window: the window is what is checked
    short.step(torch.zeros(1, 6, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="sequence of 9 tokens is longer than the context window of 8 tokens"):
        short.step(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    assert cache.seq_len == 6  # the failed pass left nothing behind
    with pytest.raises(ValueError, match="n_layers must be an integer in \\[1, 2\\], got 3"):
        model.step(ids, n_layers=3)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_inference_and_training_paths_give_the_same_logits(layout):
    """The lean calls (torch.mm on a kept Wᵀ, the norm's tensor constants) against the plain ones autograd takes."""
    model = _model(2, layout)
    ids = torch.tensor([[5, 7, 11, 13], [2, 3, 4, 6]])
    with torch.inference_mode():
        lean = model(ids)
    plain = model(ids).detach()  # gradients on: F.linear, F.rms_norm, nn.Embedding
    torch.testing.assert_close(lean, plain, rtol=1e-5, atol=1e-5)


def test_every_kind_declares_its_capabilities():
    kvcache.kinds()
    K = kvcache.base.KINDS
    assert K["contiguous"].supports("truncate") and K["contiguous"].supports("reorder") and K["contiguous"].supports("state_tensors")
    assert K["paged"].supports("reuse_prefix") and not K["contiguous"].supports("reuse_prefix")
    assert K["sliding"].supports("plan_chunks") and not K["sliding"].rotate_new_keys
    with pytest.raises(ValueError, match="capability must be one of"):
        K["contiguous"].supports("fly")
    cfg = _model(1).config
    sliding = kvcache.new_cache("sliding", cfg, window=8)
    with pytest.raises(NotImplementedError, match="the sliding cache cannot drop tokens"):
        sliding.truncate(0)
    paged = kvcache.new_cache("paged", cfg, max_len=8)
    assert paged.plan_chunks(5) == [5] and kvcache.new_cache("contiguous", cfg, max_len=8).reuse_prefix([1, 2]) == 0


def test_sample_next_greedy_is_the_first_maximum_and_refuses_nan():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(50, generator=g).round(decimals=1)  # ties happen
        want = int(torch.argmax(process_logits(logits, [], SamplingParams())))
        assert sample_next(logits) == want == int(torch.nonzero(logits == logits.max())[0])
    bad = torch.zeros(5)
    for value, what in ((math.nan, "NaN"), (math.inf, r"\+inf")):
        bad[2] = value
        with pytest.raises(ValueError, match=what):
            sample_next(bad)
    with pytest.raises(ValueError, match="every token of a row is -inf"):
        sample_next(torch.full((4,), -math.inf))
    token, probs = sample_next(torch.tensor([0.0, 1.0, 2.0]), [], temperature=1.0, generator=g, return_probs=True)
    assert 0 <= token < 3 and torch.allclose(probs, torch.softmax(torch.tensor([0.0, 1.0, 2.0]), -1))
    assert sample_next(torch.tensor([0.0, 1.0, 2.0]), return_probs=True) == (2, None)


def test_pass_costs_time_every_k_and_leave_the_prompt_cached():
    from labkit.generation import profile

    model = _model(2)
    costs = profile.pass_costs({"a": model, "b": model}, [1, 2, 3], ks=(1, 2, 4), rounds=1, repeat=1)
    assert set(costs) == {"a", "b"} and all(set(c) == {1, 2, 4} and all(t > 0 for t in c.values()) for c in costs.values())
    with pytest.raises(ValueError, match="ks must be positive integers"):
        profile.pass_costs({"a": model}, [1, 2], ks=(0, 1))
    with pytest.raises(ValueError, match="rounds and repeat"):
        profile.pass_costs({"a": model}, [1, 2], rounds=0)


def test_the_plain_calls_give_the_lean_steps_numbers_in_more_operator_calls():
    model = _model(2)
    lean = sum(_step_events(model).values())
    model.lean_step = False
    plain = sum(_step_events(model).values())
    assert not any(m.lean for m in model.modules() if hasattr(m, "lean"))
    ids = torch.tensor([[4, 8, 15, 16]])
    with torch.inference_mode():
        slow = model(ids)
        model.lean_step = True
        torch.testing.assert_close(model(ids), slow, rtol=1e-6, atol=1e-6)
    assert plain > lean + 2 * 40  # F.linear and F.rms_norm: dozens more calls a layer
    with pytest.raises(TypeError, match="lean_step"):
        model.lean_step = "yes"


def test_step_figures_draw_what_they_are_given():
    from labkit import viz

    prof = {"plain": {"matmul_ms": 20.0, "other_ms": 9.0, "outside_ms": 5.0, "ops_per_step": 4400},
            "lean": {"matmul_ms": 20.0, "other_ms": 6.0, "outside_ms": 4.0, "ops_per_step": 2850}}
    fig = viz.step_split_figure(prof)
    assert [t.name for t in fig.data] == ["weight products", "other operators", "between them (Python, dispatch)"]
    assert list(fig.data[1].y) == [9.0, 6.0] and "4400 operator calls" in fig.layout.title.text
    fig = viz.pass_cost_figure({"float32": {1: 1.0, 4: 1.6}, "bfloat16": {1: 1.0, 4: 1.05}})
    assert [t.name for t in fig.data][1:] == ["float32", "bfloat16"] and list(fig.data[1].y) == [1.0, 1.6]
    assert list(fig.data[0].y) == [1.0, 1.0]  # the flat line a weight-streaming pass would follow


def test_an_operator_call_costs_microseconds():
    from labkit.costmodel import measure

    us = measure.operator_call_us(seconds=0.05, calls=200)
    assert 0.01 < us < 1000
    with pytest.raises(ValueError, match="seconds must be > 0"):
        measure.operator_call_us(seconds=0)
