"""labkit's own block kernels (Q4_1 × Q8_1, Q8_0 × Q8_0): equal bit for bit to their plain-torch oracle on every
path this CPU runs, rows independent of the pass, and SmolLM2's file run on them."""
import pytest
import torch

from labkit.quant import native

pytestmark = pytest.mark.skipif(not native.available(), reason=f"kernels not built: {native.status()[1]}")

from labkit.quant import q4q8  # noqa: E402  (building happens in native.available above)

SHAPES = [(16, 32, 1), (40, 64, 3), (96, 128, 16), (33, 96, 17), (48, 64, 0)]  # N, K, M: padded rows, M > 16, empty


def _q4(n, k, g):
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    codes[0] = 15  # the largest products
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    m = (-torch.rand(n, k // 32, generator=g) * 0.1).half().float()
    return codes, d, m


def _x(m, k, g):
    x = torch.randn(m, k, generator=g) * 3
    if m > 1:
        x[1, :32] = 0.0  # an all-zero block: step 0
        x[0, :32] = TIES  # exact ties at 0.5 (the block's step is 1): rounded away from zero
    return x


# with the block's largest magnitude 127 the step is exactly 1, so each value is a tie; away from zero and half
# to even disagree on every one (62.5 -> 63 or 62, 0.5 -> 1 or 0, 2.5 -> 3 or 2)
TIES = torch.tensor([127.0, -127.0, 62.5, -62.5, 0.5, -0.5, 2.5, -2.5] * 4)


def test_the_oracles_activations_round_halves_away_from_zero():
    from labkit.quant import intdot

    qa, dx, _ = intdot.quantize_activations(TIES[None])
    assert float(dx.flatten()[0]) == 1.0
    assert qa.flatten()[:8].tolist() == [127, -127, 63, -63, 1, -1, 3, -3]


@pytest.mark.parametrize("n,k,m", SHAPES)
def test_q4_kernel_equals_its_oracle_on_every_path(n, k, m):
    g = torch.Generator().manual_seed(n + k + m)
    codes, d, mins = _q4(n, k, g)
    x = _x(m, k, g)
    want = q4q8.reference(x, codes, d, mins)
    for path in native.cpu_paths():
        assert torch.equal(q4q8.mm(x, q4q8.pack(codes, d, mins), path), want), path
    q40 = q4q8.reference(x, codes, d)  # Q4_0: m = -8 d
    assert torch.equal(q4q8.mm(x, q4q8.pack(codes, d)), q40)


@pytest.mark.parametrize("n,k,m", SHAPES)
def test_q8_kernel_equals_its_oracle_on_every_path(n, k, m):
    g = torch.Generator().manual_seed(n * k + m)
    codes = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    codes[0], codes[-1] = -128, 127  # |w| = 128 needs the unsigned byte; the widest positive codes
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    x = _x(m, k, g)
    want = q4q8.reference_q8(x, codes, d)
    for path in native.cpu_paths():
        assert torch.equal(q4q8.mm(x, q4q8.pack_q8(codes, d), path), want), path


def test_the_oracle_is_the_float_product_up_to_int8_activations():
    g = torch.Generator().manual_seed(1)
    codes, d, m = _q4(64, 256, g)
    x = torch.randn(4, 256, generator=g)
    w = codes.float() * d.repeat_interleave(32, 1) + m.repeat_interleave(32, 1)
    exact = x @ w.t()
    got = q4q8.reference(x, codes, d, m)
    assert (got - exact).norm() / exact.norm() < 0.02  # 8-bit activations: about 1 % of the product
    assert (got - exact).norm() / exact.norm() > 1e-5  # ... and not the float product itself


def test_a_row_gets_the_bits_it_gets_alone():
    g = torch.Generator().manual_seed(2)
    codes, d, m = _q4(48, 128, g)
    x = torch.randn(19, 128, generator=g)
    packed = q4q8.pack(codes, d, m)
    whole = q4q8.mm(x, packed)
    assert all(torch.equal(whole[i:i + 1], q4q8.mm(x[i:i + 1], packed)) for i in range(19))


def test_pack_keeps_every_code_and_step():
    g = torch.Generator().manual_seed(3)
    codes, d, m = _q4(37, 64, g)
    back = q4q8.unpack(q4q8.pack(codes, d, m))
    assert torch.equal(back[0], codes) and torch.equal(back[1], d) and torch.equal(back[2], m)
    layer = q4q8.Q4Q8Linear(codes, d, m)
    assert torch.equal(layer.weight, codes.float() * d.repeat_interleave(32, 1) + m.repeat_interleave(32, 1))
    assert layer.nbytes() == 37 * 2 * 20  # Q4_1: 20 bytes per block of 32
    assert layer(torch.randn(2, 5, 64)).shape == (2, 5, 37)


def test_paths_follow_torchs_capability():
    have = native.cpu_paths()
    assert "portable" in have
    assert native.path_for("DEFAULT") == "portable"
    assert native.path_for("AVX2") == ("avx2" if "avx2" in have else "portable")
    assert native.path_for("AVX512") in have
    assert native.path_for() == native.path_for(torch.backends.cpu.get_cpu_capability())


def test_bad_input_is_refused():
    g = torch.Generator().manual_seed(4)
    codes, d, m = _q4(16, 64, g)
    packed = q4q8.pack(codes, d, m)
    with pytest.raises(ValueError, match="NaN or inf"):
        q4q8.mm(torch.tensor([[float("nan")] * 64]), packed)
    with pytest.raises(ValueError, match="x has 32 features, the weight 64"):
        q4q8.mm(torch.randn(1, 32), packed)
    with pytest.raises(ValueError, match=r"path must be one of \('portable', 'avx2', 'avx512-vnni'\), got 'sse'"):
        q4q8.mm(torch.randn(1, 64), packed, path="sse")
    with pytest.raises(ValueError, match="codes must lie in 0..15, got 0..16"):
        q4q8.pack(codes.clamp(max=14) + torch.nn.functional.pad(torch.ones(1, 1, dtype=torch.uint8), (63, 0, 0, 15)) * 2,
                  d, m)
    with pytest.raises(ValueError, match="float16 values"):
        q4q8.pack(codes, d + 1e-6, m)
    with pytest.raises(ValueError, match="multiple of 32 columns"):
        q4q8.pack(codes[:, :40], d, m)
    with pytest.raises(ValueError, match="4-bit asymmetric codes in groups of 32"):
        from labkit.quant.rtn import quantize
        q4q8.Q4Q8Linear.from_quantized(quantize(torch.randn(16, 64), 4, 64, symmetric=False))


def test_without_a_compiler_the_loader_says_why_and_uses_torchs_kernel(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setattr(native, "_library_file", lambda: tmp_path / "kernels" / "x.so")
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    ok, line = native.status()
    assert not ok and line.startswith("not built:") and "torch's int4 kernel" in line
    from labkit.model.gguf_native import pick_kernel

    assert pick_kernel("auto", torch.float32) == ("torch-int4", line)
    with pytest.raises(native.KernelUnavailable, match="not built"):
        pick_kernel("q4q8", torch.float32)
    with pytest.raises(ValueError, match="kernel must be one of"):
        pick_kernel("fast", torch.float32)


@pytest.fixture(scope="module")
def smol():
    from tests.smollm2_shared import smollm2

    import labkit

    float_model, tok = smollm2()
    return float_model, labkit.load("smollm2-135m", weights="gguf")[0], tok


def test_smollm2_file_on_the_kernels(smol):
    from labkit.quant import model_nbytes
    from labkit.quant.q4q8 import Q4Q8Linear, Q8Q8Linear

    float_model, model, tok = smol
    assert "labkit's int4 × int8 kernel, head q8_0" in model.weights
    kinds = {type(m) for m in model.modules()}
    assert Q4Q8Linear in kinds and Q8Q8Linear in kinds
    from labkit.model.gguf import open_gguf

    stored = sum(t.n_bytes for t in open_gguf(model.source_file).tensors if t.tensor_type.name in ("Q4_1", "Q8_0"))
    assert model_nbytes(model) == stored  # every product reads the file's blocks, nothing more
    question = "What is the capital of France? Answer in one sentence."
    import labkit

    want = labkit.generate(float_model, tok, question, max_new_tokens=12).token_ids
    assert labkit.generate(model, tok, question, max_new_tokens=12).token_ids == want


def test_a_verify_pass_equals_the_steps_it_replaces(smol):
    """Speculation's guarantee on this format: a 4-token pass gives each row the logits of a one-token step."""
    from labkit.model.kernels import batch_invariant

    _, model, tok = smol
    ids = torch.tensor([tok.encode("The capital of France is Paris, and the capital of Italy is")])
    with torch.inference_mode(), batch_invariant(model):
        cache = model.new_cache(max_len=64)
        model.step(ids[:, :-4], cache)
        passed = model.step(ids[:, -4:], cache)
        cache2 = model.new_cache(max_len=64)
        model.step(ids[:, :-4], cache2)
        steps = torch.cat([model.step(ids[:, i:i + 1], cache2) for i in range(ids.shape[1] - 4, ids.shape[1])], 1)
    assert torch.equal(passed, steps)


def test_the_modules_doctest_runs():
    import doctest

    assert doctest.testmod(q4q8).failed == 0
