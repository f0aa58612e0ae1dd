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


@pytest.mark.parametrize("k", [1, 3])
def test_a_pass_into_the_last_slot_runs_the_program(exported, k):
    model, _ = exported
    outs = []
    for m in (_model(), model):
        cache = m.new_cache(batch_size=1, max_len=len(PROMPT[0]) + 2 + k)
        with torch.no_grad():
            m(torch.tensor(PROMPT), cache)
            m(torch.tensor([[5, 6]]), cache)
            calls = m.compiled.stats()["compiled_calls"] if m.compiled else 0
            outs.append(m(torch.arange(k).view(1, k), cache))  # its keys fill the whole buffer
    assert model.compiled.stats()["compiled_calls"] == calls + 1
    assert torch.allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4 * outs[0].abs().max().item())


def _blocks_model() -> Transformer:
    """A tiny model whose every product, the head included, is one of labkit's block kernels (Q4_1 and Q8_0)."""
    from labkit.quant import native

    if not native.available():
        pytest.skip(f"kernels not built: {native.status()[1]}")
    from labkit.quant.q4q8 import Q4Q8Linear, Q8Q8Linear
    from labkit.quant.rtn import quantize

    cfg = ModelConfig(vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                      rope_layout="interleaved", max_seq_len=128, tie_embeddings=False)
    torch.manual_seed(3)
    model = Transformer(cfg).eval()
    for b in model.layers:
        for owner, name in ((b.attn, "wqkv"), (b.attn, "wo"), (b.mlp, "w_gate_up"), (b.mlp, "w_down")):
            q = quantize(getattr(owner, name).weight.detach(), 4, 32, symmetric=False)
            setattr(owner, name, Q4Q8Linear(q.codes, q.scale.half().float(), q.minimum.half().float()))
    q = quantize(model.lm_head.weight.detach(), 8, 32, symmetric=True)
    model.lm_head = Q8Q8Linear(q.codes.to(torch.int8), q.scale.half().float())
    return model


def test_on_block_kernels_one_program_gives_every_row_its_bits_alone():
    """The 'rows' program: a pass of k tokens gives each row the bits k one-token steps give, through one program,
    so the batch-invariant mode (speculation's verification) runs it too, and plain decoding equals verification."""
    from labkit.model.kernels import batch_invariant

    model = _blocks_model().export_step(progress=False)
    assert model.compiled.rows
    tokens, _ = _greedy(model, 6)
    assert tokens == _greedy(_blocks_model(), 6)[0]
    for k in (2, 5, 16):
        with torch.no_grad():
            many, one = model.new_cache(batch_size=1, max_len=64), model.new_cache(batch_size=1, max_len=64)
            model(torch.tensor(PROMPT), many)
            model(torch.tensor(PROMPT), one)
            extra = torch.tensor([[(7 * i + 3) % 96 for i in range(k)]])
            with batch_invariant(model):
                passed = model.step(extra, many)
            steps = torch.cat([model.step(extra[:, i:i + 1], one) for i in range(k)], 1)
        assert torch.equal(passed, steps), k
    with torch.no_grad():  # last_only: the same program, its last row kept
        cache = model.new_cache(batch_size=1, max_len=64)
        model(torch.tensor(PROMPT), cache)
        assert torch.equal(model.step(extra, cache, last_only=True), passed[:, -1:])
    stats = model.compiled.stats()
    assert "batch-invariant mode" not in stats["eager_calls"] and stats["programs"] == 1


def test_other_formats_keep_the_batch_invariant_mode_eager(exported):
    from labkit.model.kernels import batch_invariant

    model, _ = exported
    assert not model.compiled.rows  # float products: torch.mm is not row-invariant by construction
    before = model.compiled.stats()["eager_calls"].get("batch-invariant mode", 0)
    with torch.no_grad(), batch_invariant(model):
        cache = model.new_cache(batch_size=1, max_len=64)
        model(torch.tensor(PROMPT), cache)
        model(torch.tensor([[1, 2]]), cache)
    assert model.compiled.stats()["eager_calls"]["batch-invariant mode"] == before + 2  # the prompt and the pass


def test_the_package_folder_follows_the_environment(monkeypatch, tmp_path):
    from labkit.model.exported import code_digest, package_dir

    monkeypatch.setenv("LABKIT_EXPORT_DIR", str(tmp_path))
    assert package_dir() == tmp_path
    monkeypatch.delenv("LABKIT_EXPORT_DIR")
    assert package_dir().parts[-2:] == (".build", "exported")
    assert len(code_digest()) == 16


def test_the_digest_is_taken_when_the_program_is_built():
    """A weight edited between `export_step()` and the first pass: the package is keyed by the weights it holds."""
    model = _model(seed=4).export_step(progress=False)
    before = model.compiled.digest
    with torch.no_grad():
        model.layers[0].mlp.w_down.weight.mul_(0.5)
    _greedy(model, 3)
    assert model.compiled.digest != before
    from labkit.model.exported import weights_digest

    assert model.compiled.digest == weights_digest(model)


def test_a_build_deletes_the_packages_of_other_code(monkeypatch, tmp_path):
    from labkit.model.exported import code_digest

    monkeypatch.setenv("LABKIT_EXPORT_DIR", str(tmp_path))
    stale = tmp_path / "step-0123456789abcdef-fedcba9876543210-b1-t1-all-float32-x-aten-torch.pt2"
    other = tmp_path / "notes.txt"
    stale.write_bytes(b"old")
    other.write_text("kept")
    model = _model(seed=5).export_step(progress=False)
    _greedy(model, 2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert stale.name not in names and "notes.txt" in names
    assert any(n.split("-")[2] == code_digest() for n in names if n.endswith(".pt2"))
