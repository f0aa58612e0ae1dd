"""Chapter 02's figures, widgets and exercise checkers, and the docstring examples of the model modules."""
import doctest
import importlib

import pytest
import torch

import labkit
from labkit.exercises.transformer import _reference_gqa, _reference_rope
from labkit.model import ModelConfig
from labkit.viz.transformer import attention_heatmap, rope_figure, rope_scores


@pytest.mark.parametrize("module", ["labkit.model.config", "labkit.model.rope", "labkit.quant.ggml", "labkit.model.transformer",
                                    "labkit.kvcache", "labkit.kvcache.base", "labkit.kvcache.contiguous",
                                    "labkit.viz.transformer"])
def test_docstring_examples(module):
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, extraglobs={"torch": torch, "np": __import__("numpy")}, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_rope_scores_depend_only_on_the_offset():
    offsets = [-5, 0, 3, 40]
    torch.testing.assert_close(torch.tensor(rope_scores(0, offsets)), torch.tensor(rope_scores(1234, offsets)),
                               atol=1e-9, rtol=0)
    assert len(set(round(s, 6) for s in rope_scores(0, offsets))) == 4


def test_rope_figure_follows_the_sliders():
    fig = rope_figure(position=7, freq_index=0, head_dim=64, base=100000.0)
    trail = fig.data[1]
    assert len(trail.x) == 8  # positions 0..7
    assert trail.x[-1] == pytest.approx(torch.cos(torch.tensor(7.0)).item())  # pair 0 turns 1 rad per position
    slow = rope_figure(position=7, freq_index=31).data[1]
    assert slow.x[-1] > 0.999  # the last pair barely moves
    near, far = fig.data[4].y, fig.data[5].y
    assert near == pytest.approx(far, abs=1e-9)
    with pytest.raises(ValueError, match=r"freq_index must be an integer in \[0, 31\], got 32"):
        rope_figure(1, 32)


def test_attention_heatmap_and_widgets():
    probs = torch.softmax(torch.randn(3, 4, 4), -1)
    fig = attention_heatmap(probs, ["a", "b", "a", "c"], head=2)
    assert fig.data[0].y == ("0:a", "1:b", "2:a", "3:c")
    torch.testing.assert_close(torch.tensor(fig.data[0].z), probs[2])
    with pytest.raises(ValueError, match="got 3 token labels for 4 positions"):
        attention_heatmap(probs, ["a", "b", "c"])
    w = labkit.widgets.attention(probs, list("abcd"))
    w.children[0].value = 1
    torch.testing.assert_close(torch.tensor(w.children[1].data[0].z), probs[1])
    r = labkit.widgets.rope()
    r.children[0].children[0].value = 3
    assert len(r.children[1].data[1].x) == 4
    assert labkit.viz.param_breakdown_figure(ModelConfig.from_name("smollm2-135m")).layout.title.text.startswith(
        "smollm2-135m: 134.5 M")


def _gqa(q, k, v, *, tile=torch.repeat_interleave, scale=lambda d: d ** 0.5, diagonal=0):
    g = q.shape[0] // k.shape[0]
    k, v = tile(k, g, 0), tile(v, g, 0)
    T = q.shape[1]
    seen = torch.ones(T, T, dtype=torch.bool).tril(diagonal)
    return (q @ k.transpose(-1, -2) / scale(q.shape[-1])).masked_fill(~seen, float("-inf")).softmax(-1) @ v


def _tile_whole(x, g, dim):  # head h reads KV head h % n_kv: repeat, not repeat_interleave
    return x.repeat(g, 1, 1)


# chapter 02's debug exercise: each of its three bugs alone
GQA_BUGS = {"repeat, not repeat_interleave": dict(tile=_tile_whole),
            "scores over d, not its root": dict(scale=lambda d: d),
            "a query sees the next key": dict(diagonal=1)}


def test_checkers_pass_the_reference_and_catch_the_classic_mistakes(capsys):
    assert labkit.exercises.check_gqa_attention(_reference_gqa)
    assert labkit.exercises.check_gqa_attention(_gqa)
    for bug in GQA_BUGS.values():
        assert not labkit.exercises.check_gqa_attention(lambda q, k, v, bug=bug: _gqa(q, k, v, **bug))
    from labkit.exercises.transformer import _reference_param_count

    assert labkit.exercises.check_param_count(_reference_param_count)
    assert not labkit.exercises.check_param_count(  # the tied head counted twice
        lambda c: _reference_param_count(c) + (c.vocab_size * c.d_model if c.tie_embeddings else 0))
    out = capsys.readouterr().out
    assert out.count("[PASS]") == 3 and out.count("[FAIL]") == 4


def test_the_half_rope_and_window_checkers_catch_the_layout_and_the_off_by_one(capsys):
    from labkit.exercises.transformer import _reference_rope_half, _reference_window

    assert labkit.exercises.check_rope_half(_reference_rope_half)
    assert not labkit.exercises.check_rope_half(_reference_rope)           # the interleaved pairs
    assert not labkit.exercises.check_rope_half(                           # angles from i / d, not 2i / d
        lambda x, p, b: _reference_rope_half(x, p, b ** 0.5))
    assert labkit.exercises.check_window_attention(_reference_window)
    assert not labkit.exercises.check_window_attention(lambda q, k, v, w: _reference_window(q, k, v, w + 1))  # one more
    assert not labkit.exercises.check_window_attention(lambda q, k, v, w: _reference_gqa(q, k, v))  # causal only
    out = capsys.readouterr().out
    assert out.count("[PASS]") == 2 and out.count("[FAIL]") == 4


@pytest.mark.parametrize("name", ["smollm2-135m", "llama-2-7b", "llama-3-8b", "llama-3.2-1b"])
def test_the_param_count_exercise_gets_fields_only(name):
    from labkit.exercises.transformer import _fields, _reference_param_count

    assert _reference_param_count(_fields(name)) == ModelConfig.from_name(name).n_params()
    assert not hasattr(_fields(name), "n_params")  # the exercise cannot call the answer
    # the exercise's own solution, written from the fields, agrees with the config's count
    c = _fields(name)
    attention = 2 * c.d_model * c.n_heads * c.head_dim + 2 * c.d_model * c.n_kv_heads * c.head_dim
    head = 0 if c.tie_embeddings else c.vocab_size * c.d_model
    assert (c.vocab_size * c.d_model + c.n_layers * (attention + 3 * c.d_model * c.ffn_dim + 2 * c.d_model)
            + c.d_model + head) == ModelConfig.from_name(name).n_params()
