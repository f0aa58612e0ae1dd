"""The two stages and the checkpoint between them: decode needs prefill; resume == never stopping."""
import json
import subprocess
import sys

import pytest
import torch

import labkit
from labkit.generation import state as checkpoint
from labkit.generation import PrefillState
from tests.conftest import ROOT, python_env
from tests.kvcache_shared import ids, tiny

KINDS = {
    "contiguous": {},
    "paged": {"block_size": 8},
    "sliding": {"window": 24, "sinks": 4},  # the prompt alone overflows it: evictions before and after the save
    "quantized": {"bits": 4, "group_size": 8, "residual": 8},
}
SAMPLING = dict(temperature=0.9, top_k=20, repetition_penalty=1.2)


def test_decode_without_a_prefill_state_fails_clearly():
    model = tiny()
    with pytest.raises(TypeError, match="decode needs the PrefillState returned by labkit.prefill"):
        labkit.decode(model, None, 4)
    with pytest.raises(TypeError, match="KV cache that prefill builds"):
        labkit.decode(model, ids(5), 4)  # token ids are not a state: the order cannot be swapped


@pytest.mark.parametrize("kind", KINDS)
def test_resume_from_a_saved_state_equals_an_uninterrupted_run(kind, tmp_path):
    model = tiny()
    prompt = ids(30, seed=2)
    cache = model.new_cache(kind, max_len=64, **KINDS[kind])
    uninterrupted = labkit.decode(model, labkit.prefill(model, prompt, cache=cache, seed=7), 20, **SAMPLING)

    state = labkit.prefill(model, prompt, cache=model.new_cache(kind, max_len=64, **KINDS[kind]), seed=7)
    state.save(tmp_path / "prefill.safetensors")  # right after prefill ...
    first = labkit.decode(model, state, 8, **SAMPLING)
    state.save(tmp_path / "mid.safetensors")  # ... and in the middle of decoding
    del state
    resumed = PrefillState.load(tmp_path / "mid.safetensors", model)
    assert resumed.cache.kind == kind and resumed.position == 38
    assert first + labkit.decode(model, resumed, 12, **SAMPLING) == uninterrupted
    from_prefill = PrefillState.load(tmp_path / "prefill.safetensors", model)
    assert labkit.decode(model, from_prefill, 20, **SAMPLING) == uninterrupted


def test_a_state_from_another_model_is_refused_naming_both(tmp_path):
    model = tiny(seed=0)
    path = labkit.prefill(model, ids(6)).save(tmp_path / "s.safetensors")
    fp = checkpoint.model_fingerprint(model)
    other = tiny(seed=1)  # same shapes, other weights
    with pytest.raises(ValueError, match=f"saved from model 'custom' \\(fingerprint {fp}, float32\\).*"
                                         f"model 'custom' \\(fingerprint {checkpoint.model_fingerprint(other)}"):
        PrefillState.load(path, other)
    bigger = tiny(seed=0, n_layers=3)
    bigger.config = bigger.config.replace(name="bigger")
    with pytest.raises(ValueError, match="saved from model 'custom'.*into model 'bigger'"):
        PrefillState.load(path, bigger)


def test_the_file_is_safetensors_with_a_json_header(tmp_path):
    model = tiny()
    state = labkit.prefill(model, ids(9), cache=model.new_cache("paged", max_len=16, block_size=4), seed=3)
    path = state.save(tmp_path / "s.safetensors")
    header_len = int.from_bytes(path.read_bytes()[:8], "little")  # safetensors: u64 length + JSON, then raw bytes
    header = json.loads(path.read_bytes()[8:8 + header_len])
    assert set(header) - {"__metadata__"} == {"cache.keys", "cache.values", "logits", "history", "rng_state"}
    info = checkpoint.describe(path)
    assert info["cache"]["kind"] == "paged" and info["cache"]["options"]["block_size"] == 4
    assert info["position"] == 9 and info["seed"] == 3 and info["model"]["fingerprint"] == checkpoint.model_fingerprint(model)
    not_ours = tmp_path / "other.safetensors"
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(1)}, str(not_ours))
    with pytest.raises(ValueError, match="other.safetensors is not a saved labkit PrefillState \\(no .labkit. header\\)"):
        checkpoint.describe(not_ours)


def test_periodic_checkpoints_recover_after_a_crash(tmp_path):
    model = tiny()
    prompt = ids(12, seed=4)
    uninterrupted = labkit.decode(model, labkit.prefill(model, prompt, seed=1), 14, **SAMPLING)
    state = labkit.prefill(model, prompt, seed=1)
    path = tmp_path / "ckpt.safetensors"
    done = labkit.generation.decode_with_checkpoints(model, state, 10, path, every=4, **SAMPLING)  # "crash" after 10
    recovered = PrefillState.load(path, model)
    assert recovered.position == 12 + 10
    assert done + labkit.decode(model, recovered, 4, **SAMPLING) == uninterrupted
    with pytest.raises(ValueError, match="every must be a positive integer, got 0"):
        labkit.generation.decode_with_checkpoints(model, state, 4, path, every=0)


_CHILD = """
import sys, torch, labkit
from tests.kvcache_shared import tiny
model = tiny()
state = labkit.PrefillState.load(sys.argv[1], model)
print(labkit.decode(model, state, 10, temperature=0.9, top_k=20, repetition_penalty=1.2))
"""


def test_resume_in_a_new_process_gives_the_same_tokens(tmp_path):
    model = tiny()
    state = labkit.prefill(model, ids(15, seed=6), cache=model.new_cache("quantized", max_len=32, group_size=8, residual=8), seed=11)
    path = state.save(tmp_path / "s.safetensors")
    expected = labkit.decode(model, state, 10, **SAMPLING)
    run = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, cwd=ROOT,
                         env=python_env(), timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(expected)
