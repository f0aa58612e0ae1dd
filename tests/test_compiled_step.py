"""The compiled decode step (`Transformer.compile_step`): the tokens eager gives, in every format, and a
64-token decode that compiles once; what it leaves to the eager step, and what it refuses."""
import copy

import pytest
import torch

import labkit
from labkit.model import ModelConfig, Transformer
from labkit.model import compiled as compiled_mod
from labkit.quant.apply import quantize_model

pytestmark = pytest.mark.skipif(compiled_mod.compiler_problem() is not None, reason="no C++ compiler")
PROMPT = [[1, 2, 3, 4, 5, 6, 7]]


def _model(dtype=torch.float32, layers: int = 2) -> Transformer:
    # SmolLM2's shape in small: grouped-query attention, the GGUF (interleaved) RoPE layout, column-major weights
    cfg = ModelConfig(vocab_size=96, d_model=64, n_layers=layers, n_heads=4, n_kv_heads=2, ffn_dim=128,
                      rope_layout="interleaved")
    torch.manual_seed(0)
    return Transformer(cfg).to(dtype).column_major_().eval()


def _greedy(model, n: int, max_len: int = 96) -> tuple[list[int], torch.Tensor]:
    cache = model.new_cache(batch_size=1, max_len=max_len)
    out, rows = [], []
    with torch.no_grad():
        logits = model(torch.tensor(PROMPT), cache, last_only=True)
        for _ in range(n):
            rows.append(logits[0, -1].float())
            out.append(int(logits[0, -1].argmax()))
            logits = model.step(torch.tensor([[out[-1]]]), cache)
    assert cache.seq_len == len(PROMPT[0]) + n
    return out, torch.stack(rows)


@pytest.fixture(scope="module")
def f32():
    eager = _greedy(_model(), 64)
    model = _model().compile_step(progress=False)
    return model, eager


def test_float32_tokens_and_logits_equal_eager_and_64_steps_compile_once(f32):
    model, (tokens, logits) = f32
    got, got_logits = _greedy(model, 1)  # the prompt (7 tokens, a short pass) and the first step compile
    graphs = model.compiled.graphs
    assert graphs == 2
    got, got_logits = _greedy(model, 64)
    assert model.compiled.graphs == graphs, "a 64-token decode recompiled"
    assert got == tokens
    scale = logits.abs().max()
    assert ((got_logits - logits).abs().max() / scale) < 1e-4  # fused reductions: rounding, not bits
    stats = model.compiled.stats()
    assert stats["compiled_calls"] == 2 + 65 and stats["eager_calls"] == {}  # prompt + steps, twice


@pytest.mark.parametrize("fmt", ["bfloat16", "int8", "int4"])
def test_every_format_gives_eager_greedy_tokens(fmt):
    model = _model(torch.bfloat16 if fmt == "bfloat16" else torch.float32, layers=1)
    if fmt != "bfloat16":
        model = quantize_model(model, bits=int(fmt[3:]), group_size=32 if fmt == "int4" else None)
    tokens, logits = _greedy(model, 24)
    model.compile_step(progress=False)
    got, got_logits = _greedy(model, 24)
    assert model.compiled.stats()["compiled_calls"] == 25
    assert got == tokens
    assert (got_logits - logits).abs().max() <= 0.02 * logits.abs().max()


def test_a_short_pass_is_compiled_and_matches_eager(f32):
    model, _ = f32
    eager = _model()
    ids = torch.tensor([[9, 8, 7, 6]])
    outs = []
    for m in (eager, model):
        cache = m.new_cache(batch_size=1, max_len=32)
        with torch.no_grad():
            m(torch.tensor(PROMPT), cache)
            outs.append(m(ids, cache))  # a verification pass: 4 tokens, every position's logits
        assert cache.seq_len == len(PROMPT[0]) + 4
    assert outs[0].shape == outs[1].shape == (1, 4, 96)
    assert torch.equal(outs[0].argmax(-1), outs[1].argmax(-1))
    assert torch.allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4 * outs[0].abs().max().item())


def test_what_it_leaves_to_the_eager_step_is_counted(f32):
    model, _ = f32
    before, graphs = model.compiled.stats(), model.compiled.graphs
    eager = _model()
    with torch.no_grad():
        long_ids = torch.arange(20).view(1, 20)
        for m in (eager, model):
            c = m.new_cache(batch_size=1, max_len=32)
            m(long_ids, c)  # a prompt of 20 tokens: eager
            m(long_ids[:, :1], c, n_layers=1)  # early exit: eager
            assert c.seq_len == 21
        assert torch.equal(model(long_ids), eager(long_ids))  # no cache: the eager numbers, bit for bit
        model(long_ids[:, :2], model.new_cache(max_len=8, kind="sliding", window=6, sinks=2))
    reasons = model.compiled.stats()["eager_calls"]
    for why in ("pass over more than 16 tokens", "early exit", "no cache", "cache kind 'sliding'"):
        assert reasons.get(why, 0) > before["eager_calls"].get(why, 0), why
    assert model.compiled.graphs == graphs  # nothing compiled for what runs eagerly


@pytest.mark.parametrize("k", [1, 3])
def test_a_pass_into_the_last_slot_runs_eagerly(f32, k):
    model, _ = f32
    outs = []
    for m in (_model(), model):
        cache = m.new_cache(batch_size=1, max_len=len(PROMPT[0]) + k)
        with torch.no_grad():
            m(torch.tensor(PROMPT), cache)
            outs.append(m(torch.arange(k).view(1, k), cache))
    # the prompt's pass ran compiled (its cache entries to rounding), the last one eagerly
    assert torch.allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4 * outs[0].abs().max().item())
    assert model.compiled.stats()["eager_calls"]["a pass into the cache's last slot"] >= 1


def test_a_failed_pass_leaves_the_cache_as_it_was(f32):
    model, _ = f32
    cache = model.new_cache(batch_size=1, max_len=8)
    with torch.no_grad():
        model(torch.tensor(PROMPT), cache)
        with pytest.raises(ValueError, match="holds at most 8 tokens"):
            model(torch.tensor([[1, 2]]), cache)
    assert cache.seq_len == len(PROMPT[0])


def test_a_failed_compiled_pass_leaves_the_cache_as_it_was(f32):
    """The test above fails in the cache before the program runs; this one fails inside the compiled pass."""
    model, _ = f32
    cache = model.new_cache(batch_size=1, max_len=32)
    saved = dict(model.compiled._fns)

    def failing(*args):
        raise RuntimeError("a failure inside the program")

    with torch.no_grad():
        model(torch.tensor(PROMPT), cache)
        calls = model.compiled.calls
        try:
            model.compiled._fns.update({key: failing for key in saved})
            with pytest.raises(RuntimeError, match="inside the program"):
                model(torch.tensor([[1, 2]]), cache)
        finally:
            model.compiled._fns.update(saved)
        assert cache.seq_len == len(PROMPT[0]) and model.compiled.calls == calls  # the compiled path, aborted
        model(torch.tensor([[1, 2]]), cache)
    assert cache.seq_len == len(PROMPT[0]) + 2 and model.compiled.calls == calls + 1


def test_a_copy_does_not_carry_the_programs(f32):
    """A copy's modules are new objects: programs traced on the original would read the wrong ones (a KeyError for
    a quantized copy of a compiled model, before)."""
    model, _ = f32
    assert copy.deepcopy(model).compiled is None
    q = quantize_model(model, bits=8)
    assert q.compiled is None and model.compiled is not None
    cache = q.new_cache(batch_size=1, max_len=16)
    with torch.no_grad():
        q(torch.tensor(PROMPT), cache)
        assert q.step(torch.tensor([[3]]), cache).shape == (1, 1, 96)


def test_a_changed_model_drops_its_programs():
    """Re-laying out, quantizing in place, or replacing a product module by hand: the next pass compiles afresh."""
    cfg = ModelConfig(vocab_size=96, d_model=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=128)
    torch.manual_seed(0)
    for change in ("column_major_", "quantize in place", "by hand"):
        model = Transformer(cfg).eval().compile_step(progress=False)  # row-major: column_major_ changes it
        model.compiled._fns[("a traced program",)] = object()
        if change == "column_major_":
            model.column_major_()
        elif change == "quantize in place":
            quantize_model(model, bits=8, inplace=True)
        else:
            model.layers[0].attn.wo = torch.nn.Linear(64, 64, bias=False)
            cache = model.new_cache(batch_size=1, max_len=4)
            with torch.no_grad():
                assert model.compiled.eager_reason(torch.tensor([[1]]), cache, n_layers=1) == "early exit"
        assert model.compiled.stats()["programs"] == 0 and model.compiled.resets == 1, change
    model.column_major_()
    model.compiled._fns[("a traced program",)] = object()
    model.column_major_()  # already column-major: nothing changes, the programs stay
    assert model.compiled.stats()["programs"] == 1


def test_an_in_place_weight_edit_shows_in_the_next_compiled_step(f32):
    """The weights are inputs of the program, read at each call (`freezing` folds only the graph's constants)."""
    model, _ = f32
    w = model.layers[0].mlp.w_down.weight
    outs = []
    for factor in (1.0, 0.5, 2.0):  # as it is, halved, restored (exactly: powers of two)
        with torch.no_grad():
            w.mul_(factor)
            cache = model.new_cache(batch_size=1, max_len=64)
            model(torch.tensor(PROMPT), cache)
            calls = model.compiled.stats()["compiled_calls"]
            outs.append(model(torch.tensor([[5]]), cache))
            assert model.compiled.stats()["compiled_calls"] == calls + 1
    assert not torch.allclose(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_refusals():
    csa = ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, ffn_dim=64, csa_block=4, csa_topk=3,
                      csa_window=8, csa_index_heads=2, csa_index_dim=8)
    with pytest.raises(ValueError, match="compressed attention"):
        Transformer(csa).compile_step()
    with pytest.raises(ValueError, match="compile must be True or False"):
        labkit.load("smollm2-135m", compile="yes")


def test_no_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(compiled_mod.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="C\\+\\+ compiler"):
        _model(layers=1).compile_step()
