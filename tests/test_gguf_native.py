"""SmolLM2 on its own Q4_1 blocks: the codes go to the int4 kernel untouched and compute the float model's logits."""
import numpy as np
import pytest
import torch

import labkit
from labkit.quant import ggml, has_kernel
from tests.smollm2_shared import smollm2

pytestmark = pytest.mark.skipif(not (has_kernel(4) and has_kernel(8)), reason="no packed CPU kernels in this torch")


def test_block_parts_are_the_stored_blocks():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    for qtype in ("Q4_1", "Q8_0"):
        data = ggml.quantize(w, qtype)
        codes, d, m = ggml.block_parts(data, qtype, w.shape)
        back = codes.astype(np.float32) * np.repeat(d, 32, axis=1) + (0 if m is None else np.repeat(m, 32, axis=1))
        assert np.array_equal(back, ggml.dequantize(data, qtype, w.shape))
    with pytest.raises(ValueError, match="block_parts reads Q4_1 or Q8_0 blocks, got Q4_0"):
        ggml.block_parts(ggml.quantize(w, "Q4_0"), "Q4_0", w.shape)


@pytest.fixture(scope="module")
def models():
    from labkit.data import paths
    from labkit.model.gguf_native import load_gguf_native

    float_model, tok = smollm2()
    exact = load_gguf_native(paths.smollm2_gguf_path(), act_dtype=torch.float32, head="float32", kernel="torch-int4")
    fast, _ = labkit.load("smollm2-135m", dtype="bfloat16", weights="gguf")
    return float_model, exact, fast, tok


def test_native_logits_equal_the_float_models(models):
    float_model, exact, _, tok = models
    ids = torch.tensor([tok.encode("The capital of France is Paris, and the capital of Italy is")])
    with torch.inference_mode():
        a, b = float_model(ids), exact(ids)
    assert (a - b).abs().max() <= 2e-3 * a.abs().max()  # the same weights; float32 sums in another order


def test_native_greedy_reply_equals_the_float_reply(models):
    float_model, _, fast, tok = models
    question = "What is the capital of France? Answer in one sentence."
    want = labkit.generate(float_model, tok, question, max_new_tokens=12).token_ids
    assert labkit.generate(fast, tok, question, max_new_tokens=12).token_ids == want


def test_weights_option_is_checked():
    with pytest.raises(ValueError, match=r"weights must be one of \('float', 'gguf'\) for 'smollm2-135m', got 'q2'"):
        labkit.load("smollm2-135m", weights="q2")
    with pytest.raises(ValueError, match=r"weights must be one of \('float',\) for 'shakespeare', got 'gguf'"):
        labkit.load("shakespeare", weights="gguf")
