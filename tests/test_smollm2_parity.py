"""SmolLM2 on labkit's transformer against Hugging Face transformers reading the same GGUF file.

transformers is the independent reference: its own GGUF reader, its own dequantizer,
its own Llama (half-split RoPE after un-permuting Q/K). float32 logits must agree to
1e-3 at every position and greedy continuations of 32 tokens must be identical.
"""
import functools

import pytest
import torch

import labkit
from tests.smollm2_shared import smollm2

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
gguf = pytest.importorskip("gguf")

PROMPTS = [
    ("chat", "What is the capital of France? Answer in one sentence."),
    ("chat", "Write a Python function that reverses a string."),
    ("raw", "The three primary colours are"),
    ("raw", "Once upon a time, in a small village by the sea, there lived"),
]


@pytest.fixture(scope="session")
def hf_model():
    """The transformers model, loaded once. Two pure functions of the file are memoised while it loads
    (the GGUF header parse and the tensor-name table, which transformers otherwise redoes hundreds of times)."""
    path = labkit.data.paths.smollm2_gguf_path()
    readers = {}

    def reader(p, *args, **kwargs):
        key = (str(p), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = real_reader(p, *args, **kwargs)
        return readers[key]

    real_reader = gguf.GGUFReader
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", reader)
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                  dtype=torch.float32)
    return model.eval()


def _ids(tok, kind, text):
    return torch.tensor([tok.encode_chat([{"role": "user", "content": text}]) if kind == "chat" else tok.encode(text)])


@pytest.mark.parametrize("kind, text", PROMPTS)
def test_logits_match_at_every_position(hf_model, kind, text):
    model, tok = smollm2()
    x = _ids(tok, kind, text)
    with torch.inference_mode():
        ours = model(x)
        ref = hf_model(x).logits
    assert ours.shape == ref.shape == (1, x.shape[1], 49152)
    assert (ours - ref).abs().max().item() <= 1e-3


@pytest.mark.parametrize("kind, text", PROMPTS[::2])
def test_greedy_continuations_are_identical(hf_model, kind, text):
    model, tok = smollm2()
    x = _ids(tok, kind, text)
    ours = labkit.decode(model, labkit.prefill(model, x), 32)  # cached path, no early stop
    with torch.inference_mode():
        gen = hf_model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=32, min_new_tokens=32,
                                do_sample=False, eos_token_id=None, pad_token_id=0)
    theirs = gen[0, x.shape[1]:].tolist()
    assert ours == theirs, (tok.decode(ours), tok.decode(theirs))
