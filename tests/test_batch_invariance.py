"""Batch invariance: with `Transformer.batch_invariant`, a k-token pass's logits are k one-token steps', bit for bit.

Speculative decoding verifies k drafted tokens in one pass; plain decoding runs k steps. Greedy
speculative output is plain greedy output only if the two give every position the same bits,
whatever k (a near-tie argmax flips on the last bit). Checked on tiny models in every weight
format the lab runs (float32 in both layouts, bfloat16, int8 and int4 on the packed kernels,
the dequantized float paths, block formats), for k = 2..8, after prompts short and long; the
controls show that the paths the switch avoids do differ, so the checks can fail.
"""
from __future__ import annotations

import copy

import pytest
import torch

from labkit.kvcache.base import attention, causal_mask
from labkit.model import kernels
from labkit.quant import quantize_model
from labkit.quant.linear import QuantLinear, has_kernel
from tests.kvcache_shared import tiny

# SmolLM2's width and attention (9 query heads on 3 KV heads of 64) in two layers, where the default path's
# attention and the old one-token norm round differently; inputs a multiple of the int4 group, outputs of 8
CFG = dict(vocab_size=64, d_model=576, n_layers=2, n_heads=9, n_kv_heads=3, ffn_dim=256, max_seq_len=1024)
FORMATS = ["float32", "float32 row-major", "bfloat16", "int8", "int4", "int4 float32-act", "int3 reference", "Q4_1",
           "Q8_0 int8-act"]
PROMPTS = (5, 40, 600)  # 600 keys: past the attention kernel's 512-key blocks


def build(fmt: str):
    model = tiny(0, **CFG)
    bits = {"int8": 8, "int4": 4, "int4 float32-act": 4}.get(fmt)
    if bits and not has_kernel(bits):
        pytest.skip(f"this torch build has no packed int{bits} CPU kernel")
    if fmt == "float32":
        return model.column_major_()  # the layout labkit.load gives float32 weights
    if fmt == "float32 row-major":
        return model
    if fmt == "bfloat16":
        return model.to(torch.bfloat16)
    if fmt == "int3 reference":
        return quantize_model(model, bits=3)  # no kernel holds 3 bits: x @ dequantize(W)ᵀ in float32
    if fmt == "Q4_1":
        return quantize_model(model, fmt="Q4_1")  # dequantized once, multiplied in float32
    if fmt == "Q8_0 int8-act":
        return quantize_model(model, fmt="Q8_0", activations="int8", sums="reference")  # integer sums, no switch
    act = torch.float32 if "float32-act" in fmt else torch.bfloat16
    out = quantize_model(model, bits=bits, act_dtype=act)
    assert out.quantization["kernel"] == "packed"
    return out


@torch.inference_mode()
def passes(model, prompt: int, ks=range(2, 9), kind: str = "contiguous"):
    """For each k: (logits of one k-token pass, logits of k one-token steps), from copies of one prefilled cache."""
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, prompt + max(ks)), generator=torch.Generator().manual_seed(prompt))
    cache = model.new_cache(kind, max_len=prompt + 16)
    model(ids[:, :prompt], cache=cache)
    for k in ks:
        one, steps = copy.deepcopy(cache), copy.deepcopy(cache)
        together = model.step(ids[:, prompt:prompt + k], cache=one)[0]
        alone = torch.cat([model.step(ids[:, prompt + i:prompt + i + 1], cache=steps)[0] for i in range(k)])
        yield k, together, alone


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_k_token_pass_equals_k_one_token_steps_bit_for_bit(fmt):
    model = build(fmt)
    model.batch_invariant = True
    for prompt in PROMPTS:
        for k, together, alone in passes(model, prompt):
            assert torch.equal(together, alone), (f"{fmt}, prompt {prompt}, k={k}: max |Δ| "
                                                  f"{(together.float() - alone.float()).abs().max():.3g}")


def test_smollm2_int4_and_float32():
    """The issue's case: SmolLM2 on the int4 kernel with bfloat16 activations, and in float32."""
    from tests.smollm2_shared import smollm2

    base, _ = smollm2()
    for model in (quantize_model(base, bits=4), base):
        with kernels.batch_invariant(model):  # `base` is shared with other tests: the switch is put back
            for k, together, alone in passes(model, 40, (2, 5, 8)):
                assert torch.equal(together, alone), f"k={k}"


@pytest.mark.parametrize("kind", ["paged", "sliding"])
def test_other_cache_kinds_that_attend_over_a_causal_prefix(kind):
    model = build("int4")
    model.batch_invariant = True
    for k, together, alone in passes(model, 40, (2, 5, 8), kind):
        assert torch.equal(together, alone), f"{kind}, k={k}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_switch_leaves_one_token_steps_as_they_were(fmt):
    """A one-token step is the same call with the switch or without, and a prompt's pass is read as before, so
    speculative decoding with the switch reproduces plain decoding without it: same prompt logits, same steps."""
    model = build(fmt)
    for prompt in (6, 40):
        runs = []
        for on in (False, True):
            model.batch_invariant = on
            runs.append(torch.cat([alone for _, _, alone in passes(model, prompt, (4,))]))
        assert torch.equal(*runs)
        model.batch_invariant = False
        ids = torch.arange(prompt)[None] % CFG["vocab_size"]
        with torch.inference_mode(), kernels.batch_invariant(model):
            invariant = model(ids, cache=model.new_cache(max_len=48))
        with torch.inference_mode():
            assert torch.equal(invariant, model(ids, cache=model.new_cache(max_len=48)))


def masked_attention_differs(dtype=torch.bfloat16) -> bool:
    """Whether one masked attention call over 8 queries rounds unlike each query alone on this machine."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 4, 16, generator=g).to(dtype)
    keys, values = (torch.randn(1, 2, 48, 16, generator=g).to(dtype) for _ in range(2))
    alone = torch.cat([attention(q[:, i:i + 1], keys[:, :, :41 + i], values[:, :, :41 + i]) for i in range(8)])
    return not torch.equal(attention(q, keys, values, causal_mask(8, 48)), alone)


def avoided_paths_differ() -> bool:
    """Whether this torch gives one row alone other bits than the same row among others, on the paths the switch
    avoids: a float32 row through `torch.mm`, one masked attention call over 8 queries."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 64, generator=g), torch.randn(64, 192, generator=g)
    mm = any(not torch.equal(torch.mm(x[:1], w), torch.mm(x[:m], w)[:1]) for m in range(2, 9))
    return mm or masked_attention_differs()


def test_without_the_switch_the_passes_differ():
    """The control: where the default path rounds one row alone unlike the same row among others, a k-token
    pass without the switch differs from k steps, and the equality checked above sees it (so it can fail)."""
    if not avoided_paths_differ():
        pytest.skip("this torch gives one row the same bits alone and among others: nothing to contrast")
    models = {fmt: build(fmt) for fmt in ("float32", "bfloat16", "int4")}
    differs = [(fmt, p, k) for fmt, model in models.items() for p in (5, 40)
               for k, together, alone in passes(model, p) if not torch.equal(together, alone)]
    assert differs


def test_rows_mm_rows_do_not_depend_on_the_row_count():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 64, generator=g)
    for w in (torch.randn(192, 64, generator=g), torch.randn(192, 64, generator=g).t().contiguous().t(),
              torch.randn(192, 64, generator=g).to(torch.bfloat16)):
        xs, wt = x.to(w.dtype), w.t()
        alone = torch.cat([kernels.rows_mm(xs[i:i + 1], wt) for i in range(16)])
        assert all(torch.equal(kernels.rows_mm(xs[:m], wt), alone[:m]) for m in range(2, 17)), (w.dtype, w.stride())
        torch.testing.assert_close(alone, xs @ wt)


def test_rows_mm_agrees_with_the_lean_one_token_call():
    """A row of `rows_mm` has the bits of `torch.mm` on that row alone: the call a one-token step makes."""
    g = torch.Generator().manual_seed(3)
    x, wt = torch.randn(7, 96, generator=g), torch.randn(96, 40, generator=g)
    y = kernels.rows_mm(x, wt)
    assert all(torch.equal(y[i:i + 1], torch.mm(x[i:i + 1].clone(), wt)) for i in range(7))


def reorders(a: torch.Tensor, w: torch.Tensor = torch.randn(48, 80, generator=torch.Generator().manual_seed(4))):
    """A product that, like a kernel re-blocking by the row count, adds in another order for several rows."""
    if a.shape[0] == 1:
        return a @ w
    return (a[:, :24] @ w[:24] + a[:, 24:] @ w[24:])


def test_a_product_whose_rows_depend_on_the_row_count_is_called_once_per_row():
    from labkit.quant import rows

    x = torch.randn(9, 48, generator=torch.Generator().manual_seed(5))
    alone = torch.cat([reorders(x[i:i + 1]) for i in range(9)])
    assert not rows.rows_agree(reorders, 48, torch.float32)  # the check sees it
    with rows.force_plan("batched"):  # the control: one call for the pass, as a library would be trusted
        assert not torch.equal(rows.row_invariant(reorders, x, ("reorders",)), alone)
    assert torch.equal(rows.row_invariant(reorders, x, ("reorders",)), alone)  # checked, then one call per row
    key = next(k for k in rows.plan_cache() if k[0] == ("reorders",))
    assert rows.plan_cache()[key] is False and key[-1] == torch.get_num_threads()
    with pytest.raises(ValueError, match="plan must be None, 'batched' or 'rows'"):
        rows.force_plan("sometimes")


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int4", "Q4_1"])
def test_one_call_per_row_is_exact_whatever_the_kernels(fmt):
    """The fallback alone (every product one call per row, as on a CPU whose kernels all re-block) is exact too."""
    from labkit.quant import rows

    model = build(fmt)
    model.batch_invariant = True
    with rows.force_plan("rows"):
        for k, together, alone in passes(model, 40, (3, 6)):
            assert torch.equal(together, alone), (fmt, k)


def test_rms_norm_rows_do_not_depend_on_the_row_count():
    norm = kernels.RMSNorm(576, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_(1, 0.1, generator=torch.Generator().manual_seed(1))
    x = torch.randn(9, 576, generator=torch.Generator().manual_seed(2)) * 3
    with torch.inference_mode():
        alone = torch.cat([norm(x[i:i + 1]) for i in range(9)])
        assert all(torch.equal(norm(x[:m]), alone[:m]) for m in range(2, 10))
        torch.testing.assert_close(alone, torch.nn.functional.rms_norm(x, (576,), norm.weight, 1e-5))


@pytest.mark.parametrize("act", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_layers_rows_with_the_switch(bits, act):
    if not has_kernel(bits):
        pytest.skip(f"this torch build has no packed int{bits} CPU kernel")
    g = torch.Generator().manual_seed(bits)
    w, x = torch.randn(192, 128, generator=g), torch.randn(16, 128, generator=g)
    for layer in (QuantLinear.from_float(w, bits=bits, act_dtype=act), QuantLinear.from_float(w, bits=bits, reference=True)):
        layer.invariant = True
        with torch.inference_mode():
            alone = torch.cat([layer(x[i:i + 1]) for i in range(16)])
            assert all(torch.equal(layer(x[:m]), alone[:m]) for m in range(2, 17)), layer
            torch.testing.assert_close(alone, x @ layer.weight.t(), atol=0.1, rtol=0.05)  # still the product


def test_the_switch_is_a_model_setting():
    model = build("int4")
    with pytest.raises(TypeError, match="batch_invariant must be True or False"):
        model.batch_invariant = 1
    switches = [m for m in model.modules() if hasattr(m, "invariant")]
    assert {type(m).__name__ for m in switches} == {"Attention", "QuantLinear"}
    with kernels.batch_invariant(model):
        assert model.batch_invariant and all(m.invariant for m in switches)
    assert not model.batch_invariant and not any(m.invariant for m in switches)


def test_speculative_generate_verifies_with_the_switch_on_and_restores_it():
    """speculative.generate runs its target passes batch-invariant by default (so its greedy output cannot depend
    on γ: the passes' logits are the steps', tested above) and leaves the model's switch as it found it."""
    from labkit.speculative import PromptLookup, generate
    from labkit.tokenizer import BPETokenizer

    tok = BPETokenizer.train("the cat sat on the mat and the dog sat on the log. " * 6, 280)
    model = tiny(0, vocab_size=280)
    seen = []

    class Watching(PromptLookup):
        def propose(self, history, gamma, params, generator):
            seen.append(model.batch_invariant)
            return super().propose(history, gamma, params, generator)

    generate(model, Watching(), tok, "the cat sat on the mat", gamma=3, max_new_tokens=8)
    assert seen and all(seen) and model.batch_invariant is False
    seen.clear()
    generate(model, Watching(), tok, "the cat sat on the mat", gamma=3, max_new_tokens=8, batch_invariant=False)
    assert seen and not any(seen)
    with pytest.raises(ValueError, match="batch_invariant must be True or False"):
        generate(model, PromptLookup(), tok, "the cat", batch_invariant="yes")
