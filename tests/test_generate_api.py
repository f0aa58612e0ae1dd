"""What a new user passes to labkit.generate: stop, cache=None, token ids, a saved state's file."""
import pytest
import torch

import labkit
from labkit.tokenizer import BPETokenizer
from tests.kvcache_shared import tiny

TEXT = "the cat sat on the mat and the dog sat on the log " * 4


@pytest.fixture(scope="module")
def lab():
    tok = BPETokenizer.train(TEXT, 270)
    return tiny(vocab_size=tok.vocab_size, max_seq_len=128), tok


def test_stop_must_be_strings(lab):
    model, tok = lab
    with pytest.raises(TypeError, match=r"stop must be a str, a list of str or None, got int 123"):
        labkit.generate(model, tok, "the cat", max_new_tokens=4, stop=123)
    with pytest.raises(TypeError, match=r"stop strings must be str, got int 7"):
        labkit.generate(model, tok, "the cat", max_new_tokens=4, stop=["ok", 7])


def test_no_cache_recomputes_and_gives_the_same_tokens(lab):
    model, tok = lab
    cached = labkit.generate(model, tok, "the cat sat", max_new_tokens=12, chat=False)
    calls = []
    hook = model.register_forward_hook(lambda m, args, kwargs_out: calls.append(args[0].shape[1]))
    try:
        plain = labkit.generate(model, tok, "the cat sat", max_new_tokens=12, chat=False, cache=None)
    finally:
        hook.remove()
    assert plain.token_ids == cached.token_ids and plain.text == cached.text
    n = len(plain.prompt_ids)
    assert calls == [n + i for i in range(len(plain.token_ids))]  # every step runs the whole sequence again
    sampled = dict(temperature=1.0, top_k=20, seed=3, max_new_tokens=10, chat=False)
    assert (labkit.generate(model, tok, "the dog", cache=None, **sampled).token_ids
            == labkit.generate(model, tok, "the dog", **sampled).token_ids)


def test_prefill_and_decode_without_a_cache(lab):
    model, _ = lab
    ids = [5, 9, 30, 2]
    a = labkit.prefill(model, ids, cache=None)
    b = labkit.prefill(model, ids)
    assert a.cache is None and a.position == 4 and torch.allclose(a.logits, b.logits, atol=1e-5)
    assert labkit.decode(model, a, 6) == labkit.decode(model, b, 6) and a.position == b.position == 10
    with pytest.raises(ValueError, match="no KV cache to save"):
        a.save("never-written.safetensors")


def test_token_ids_are_a_prompt(lab):
    model, tok = lab
    ids = tok.encode("the cat sat")
    by_ids = labkit.generate(model, tok, ids, max_new_tokens=6)
    by_text = labkit.generate(model, tok, "the cat sat", max_new_tokens=6, chat=False)
    assert by_ids.prompt_ids == ids and by_ids.token_ids == by_text.token_ids
    assert labkit.generate(model, tok, torch.tensor(ids), max_new_tokens=6).token_ids == by_ids.token_ids
    with pytest.raises(ValueError, match="token id 9999 is outside the vocabulary"):
        labkit.generate(model, tok, [1, 9999], max_new_tokens=2)
    with pytest.raises(TypeError, match="non-empty list of token ids"):
        labkit.generate(model, tok, [], max_new_tokens=2)
    with pytest.raises(TypeError, match="cache must be a cache kind name, a KV cache or None"):
        labkit.generate(model, tok, ids, max_new_tokens=2, cache=42)


@pytest.mark.parametrize("content", [b"", b"not a safetensors file at all", b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}"])
def test_loading_what_is_not_a_saved_state_says_so(lab, tmp_path, content):
    model, _ = lab
    path = tmp_path / "state.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"{path.name} is not a saved labkit PrefillState"):
        labkit.PrefillState.load(path, model)
    with pytest.raises(FileNotFoundError, match="no saved labkit PrefillState at"):
        labkit.PrefillState.load(tmp_path / "missing.safetensors", model)
