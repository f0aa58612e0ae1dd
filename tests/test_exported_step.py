"""The step exported with AOTInductor (`Transformer.export_step`): eager's greedy tokens, a package per weights
loaded from disk by the next model with the same weights, a fresh one for changed weights, none for a copy."""
import copy

import pytest
import torch

from labkit.model import ModelConfig, Transformer
from labkit.model import compiled as compiled_mod

pytestmark = pytest.mark.skipif(compiled_mod.compiler_problem() is not None, reason="no C++ compiler")
PROMPT = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]  # over 16 tokens: the prompt runs eagerly


def _model(seed: int = 0) -> Transformer:
    cfg = ModelConfig(vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                      rope_layout="interleaved", max_seq_len=128)
    torch.manual_seed(seed)
    return Transformer(cfg).column_major_().eval()


def _greedy(model, n: int) -> tuple[list[int], torch.Tensor]:
    cache = model.new_cache(batch_size=1, max_len=64)
    out, rows = [], []
    with torch.no_grad():
        logits = model(torch.tensor(PROMPT), cache, last_only=True)
        for _ in range(n):
            rows.append(logits[0, -1])
            out.append(int(logits[0, -1].argmax()))
            logits = model.step(torch.tensor([[out[-1]]]), cache)
    return out, torch.stack(rows)


@pytest.fixture(scope="module")
def exported():
    model = _model().export_step(progress=False)
    return model, _greedy(model, 24)


def test_tokens_and_logits_equal_eager(exported):
    model, (tokens, logits) = exported
    want, want_logits = _greedy(_model(), 24)
    assert tokens == want
    assert torch.allclose(logits, want_logits, rtol=1e-4, atol=1e-4 * want_logits.abs().max().item())
    stats = model.compiled.stats()
    assert stats["compiled_calls"] >= 23 and stats["programs"] == 1  # every step after the first ran the program


def test_the_same_weights_load_the_package_a_change_builds_another(exported):
    model, (tokens, _) = exported
    again = _model().export_step(progress=False)
    assert again.compiled.digest == model.compiled.digest
    assert _greedy(again, 24)[0] == tokens
    assert again.compiled.graphs == 0 and len(again.compiled.load_s) == 1  # loaded from disk, not built
    other = _model(seed=1).export_step(progress=False)
    assert other.compiled.digest != model.compiled.digest
    assert other.compiled.package_path((1, True, False, torch.float32, torch.int64)) != \
        model.compiled.package_path((1, True, False, torch.float32, torch.int64))


def test_a_copy_or_a_changed_model_does_not_run_the_old_program(exported):
    model, _ = exported
    assert copy.deepcopy(model).compiled is None
    changed = _model().export_step(progress=False)
    changed.compiled._fns[("a loaded program",)] = object()
    changed.layers[0].mlp.w_down = torch.nn.Linear(128, 64, bias=False)
    with torch.no_grad():
        changed.compiled.eager_reason(torch.tensor([[1]]), changed.new_cache(batch_size=1, max_len=8), n_layers=1)
    assert changed.compiled.stats()["programs"] == 0
    assert changed.compiled.digest != model.compiled.digest  # the new weights get their own package


def test_load_with_compile_exports(monkeypatch):
    import labkit

    called = []
    monkeypatch.setattr(Transformer, "export_step", lambda self, progress=True: called.append(progress) or self)
    model, _ = labkit.load("shakespeare", compile=True)
    assert called == [True] and model.compiled is None  # export_step was called (here replaced: nothing built)


def test_the_digest_reads_every_weight_and_buffer():
    from labkit.model.exported import weights_digest

    m = torch.nn.Module()
    m.register_buffer("scalar", torch.tensor(1.5))
    m.register_buffer("table", torch.ones(3, dtype=torch.complex64))
    before = weights_digest(m)
    m.scalar.fill_(2.0)
    assert weights_digest(m) != before
    m.scalar.fill_(1.5)
    assert weights_digest(m) == before
