"""Gemma 3 as a config of the lab's own transformer: each family choice checked against a forward written out
by hand, the file's model against llama.cpp's outputs on the same file (a committed fixture), and the sizes."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from labkit.model.config import ModelConfig
from labkit.model.transformer import Transformer

FIXTURE = Path(__file__).parent / "fixtures" / "gemma3_llama_cpp.json"  # llama.cpp's AVX-512 build
AVX2_FIXTURE = Path(__file__).parent / "fixtures" / "gemma3_llama_cpp_avx2.json"  # its AVX2-only build, same version
LONG_FIXTURE = Path(__file__).parent / "fixtures" / "gemma3_llama_cpp_long.json"  # a prompt past the 512 window
GEMMA_270M = dict(vocab_size=262144, d_model=640, n_layers=18, n_heads=4, n_kv_heads=1, head_dim=256, ffn_dim=2048,
                  rope_base=1e6, norm_eps=1e-6, max_seq_len=32768, tie_embeddings=True, norm_placement="sandwich",
                  qk_norm=True, activation="gelu_tanh", embed_scale=math.sqrt(640), rope_local_base=1e4,
                  layer_windows=tuple(0 if (i + 1) % 6 == 0 else 512 for i in range(18)))


def tiny_gemma(**changes) -> Transformer:
    cfg = ModelConfig(**{**dict(vocab_size=50, d_model=24, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8,
                                ffn_dim=40, rope_base=1e4, rope_local_base=100.0, norm_eps=1e-6, max_seq_len=64,
                                tie_embeddings=True, norm_placement="sandwich", qk_norm=True, activation="gelu_tanh",
                                embed_scale=math.sqrt(24), layer_windows=(16, 16, 0)), **changes})
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # norm weights away from 1, so a norm that is skipped shows
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.2) + (1.0 if p.dim() == 1 else 0.0))
    return model


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_half(x, pos, base):  # x [T, H, D], the "half" layout: (x_i, x_{i+D/2}) rotate together
    D = x.shape[-1]
    freq = base ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2 / D)
    ang = (pos[:, None].double() * freq[None]).float()[:, None]  # [T, 1, D/2]
    a, b = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()], -1)


def by_hand(model: Transformer, ids: list[int]) -> torch.Tensor:
    """Gemma 3's forward written out from its definition, one token row per position: logits [T, V]."""
    cfg, sd = model.config, model.state_dict()
    T, H, Hkv, D = len(ids), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    x = sd["tok_embeddings.weight"][ids] * cfg.embed_scale
    pos = torch.arange(T)
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        h = rms(x, sd[p + "attn_norm.weight"], cfg.norm_eps)
        q, k, v = (h @ sd[p + "attn.wqkv.weight"].T).split([H * D, Hkv * D, Hkv * D], -1)
        q = rms(q.view(T, H, D), sd[p + "attn.q_norm.weight"], cfg.norm_eps)
        k = rms(k.view(T, Hkv, D), sd[p + "attn.k_norm.weight"], cfg.norm_eps)
        base = cfg.rope_local_base if cfg.layer_windows[i] else cfg.rope_base
        q, k = rope_half(q, pos, base), rope_half(k, pos, base)
        k, v = k.repeat_interleave(H // Hkv, 1), v.view(T, Hkv, D).repeat_interleave(H // Hkv, 1)
        scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D)
        hidden = torch.ones(T, T).triu(1).bool()  # the future; and, in a local layer, keys W or more behind
        if cfg.layer_windows[i]:
            hidden |= pos[:, None] - pos[None, :] >= cfg.layer_windows[i]
        scores = scores.masked_fill(hidden, float("-inf"))
        a = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, H * D) @ sd[p + "attn.wo.weight"].T
        x = x + rms(a, sd[p + "post_attn_norm.weight"], cfg.norm_eps)
        gate, up = (rms(x, sd[p + "ffn_norm.weight"], cfg.norm_eps) @ sd[p + "mlp.w_gate_up.weight"].T).chunk(2, -1)
        m = (F.gelu(gate, approximate="tanh") * up) @ sd[p + "mlp.w_down.weight"].T
        x = x + rms(m, sd[p + "post_ffn_norm.weight"], cfg.norm_eps)
    return rms(x, sd["norm.weight"], cfg.norm_eps) @ sd["tok_embeddings.weight"].T


@torch.no_grad()
def test_the_gemma_block_is_its_definition_with_and_without_a_cache():
    model = tiny_gemma()
    ids = [3, 17, 42, 5, 8, 21, 33, 1, 9, 14]
    want = by_hand(model, ids)
    assert torch.allclose(model(torch.tensor([ids]))[0], want, atol=1e-4, rtol=1e-4)
    cache = model.new_cache(max_len=16)
    got = [model(torch.tensor([ids[:6]]), cache=cache)[0]] + [model(torch.tensor([[t]]), cache=cache)[0] for t in ids[6:]]
    assert torch.allclose(torch.cat(got), want, atol=1e-4, rtol=1e-4)


@torch.no_grad()
@pytest.mark.parametrize("change", [dict(qk_norm=False), dict(norm_placement="pre"), dict(activation="silu"),
                                    dict(embed_scale=1.0), dict(rope_local_base=None)])
def test_each_family_choice_changes_the_output(change):
    """Every field is read: turning one back to Llama's default moves the logits (the hand forward keeps it)."""
    ids = torch.tensor([[3, 17, 42, 5, 8]])
    base, other = tiny_gemma(), tiny_gemma(**change)
    other.load_state_dict(base.state_dict(), strict=False)
    assert not torch.allclose(base(ids), other(ids), atol=1e-3)


@torch.no_grad()
def test_the_local_layers_slide_past_their_window_as_defined():
    """40 tokens through layers with a window of 16: without a cache, prompt then steps, and passes that cross the
    window, all equal the definition (each local query sees its last 16 keys, itself included)."""
    model = tiny_gemma()
    ids = [int(t) for t in torch.randint(0, 50, (40,), generator=torch.Generator().manual_seed(1))]
    want = by_hand(model, ids)
    assert torch.allclose(model(torch.tensor([ids]))[0], want, atol=1e-4, rtol=1e-4)
    for prompt, step in ((20, 1), (10, 5), (12, 7)):
        cache = model.new_cache(max_len=48)
        got = [model(torch.tensor([ids[:prompt]]), cache=cache)[0]]
        got += [model(torch.tensor([ids[i:i + step]]), cache=cache)[0] for i in range(prompt, 40, step)]
        assert torch.allclose(torch.cat(got)[:40], want, atol=1e-4, rtol=1e-4), (prompt, step)
    with_global = by_hand(tiny_gemma(layer_windows=(0, 0, 0)), ids)
    assert not torch.allclose(with_global[-1], want[-1], atol=1e-3)  # the window changes what the last token sees


def test_what_labkit_cannot_window_is_refused_not_ignored():
    model = tiny_gemma()
    cache = model.new_cache("sliding", max_len=32, window=20)
    with pytest.raises(ValueError, match="sequence of 17 tokens passes the sliding window of 16 tokens.*not on cache kind"):
        model(torch.zeros(1, 17, dtype=torch.long), cache=cache)
    model.batch_invariant = True
    with pytest.raises(ValueError, match="batch-invariant mode is not implemented beyond the window"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="compile_step is not implemented for sliding layers"):
        model.compile_step(progress=False)


def test_gemmas_block_without_windows_compiles_from_the_same_forward():
    """Sandwich norms, QK-norm, GeGLU and the embedding scale are the model's own forward: the program traces them."""
    from labkit.model import compiled

    if compiled.compiler_problem():
        pytest.skip(compiled.compiler_problem())
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]])
    outs = []
    for model in (tiny_gemma(layer_windows=()), tiny_gemma(layer_windows=()).compile_step(progress=False)):
        cache = model.new_cache(max_len=32)
        with torch.no_grad():
            model(ids, cache)
            outs.append(torch.cat([model(torch.tensor([[t]]), cache) for t in (7, 2, 8)], 1))
    assert model.compiled.stats()["compiled_calls"] == 3
    assert torch.allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4 * outs[0].abs().max().item())


def test_config_fields_are_checked_and_llama_stays_llama():
    with pytest.raises(ValueError, match="norm_placement must be one of \\('pre', 'sandwich'\\), got 'post'"):
        ModelConfig(norm_placement="post")
    with pytest.raises(ValueError, match="activation must be one of"):
        ModelConfig(activation="relu")
    with pytest.raises(ValueError, match="layer_windows must be empty or give one window per layer \\(2\\), got 1"):
        ModelConfig(n_layers=2, layer_windows=(8,))
    with pytest.raises(ValueError, match="embed_scale must be a positive number, got 0"):
        ModelConfig(embed_scale=0)
    smol = ModelConfig.from_name("smollm2-135m")
    assert "norm_placement" not in repr(smol) and smol.sliding_window == 0
    assert smol.param_counts()["norms"] == (2 * 30 + 1) * 576


def test_gemma3_sizes_the_embedding_two_thirds_and_the_kv_of_five_local_layers_to_one():
    cfg = ModelConfig(**GEMMA_270M)
    counts = cfg.param_counts()
    assert cfg.n_params() == 268_098_176  # Gemma 3 270M: 268 M parameters
    assert 0.62 < counts["embedding"] / cfg.n_params() < 0.63
    n = 32_768  # at the full context, 15 sliding layers hold 512 tokens each, 3 global layers hold all
    assert cfg.kv_bytes_at(n) / (cfg.kv_bytes_per_token() * n) == pytest.approx((15 * 512 + 3 * n) / (18 * n))
    assert cfg.kv_bytes_at(100) == cfg.kv_bytes_per_token() * 100  # within the window: no saving yet


@pytest.fixture(scope="module")
def gemma():
    import labkit

    try:
        model, tok = labkit.load("gemma3-270m")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return model, tok, json.loads(FIXTURE.read_text())


MARGIN = 0.25  # logits: where llama.cpp's own top two are closer than this, either order is a tie
LOGIT_ATOL = 1.5  # llama.cpp multiplies with int8 activations and a float16 GELU table; labkit in float32


@pytest.mark.parametrize("fixture", [FIXTURE, AVX2_FIXTURE], ids=["avx512", "avx2"])
@torch.no_grad()
def test_logits_beside_llama_cpp_on_its_own_greedy_tokens(gemma, fixture):
    """Teacher-forced on llama.cpp's 32 greedy tokens per prompt (each build's own): the same top token wherever
    llama.cpp's margin is no tie, and its top logit within LOGIT_ATOL."""
    model, tok, _ = gemma
    ref = json.loads(fixture.read_text())
    for row in ref["greedy"]:
        assert tok.encode(row["prompt"]) == row["prompt_ids"]
        ids = row["prompt_ids"] + row["greedy"][:-1]
        logits = model(torch.tensor([ids]))[0, len(row["prompt_ids"]) - 1:]
        for step, top in enumerate(row["top5"]):
            (best, best_logit), (_, second) = top[0], top[1]
            assert abs(float(logits[step, best]) - best_logit) < LOGIT_ATOL, (row["prompt"], step)
            if best_logit - second >= MARGIN:
                assert int(logits[step].argmax()) == best, (row["prompt"], step)


@torch.no_grad()
def test_past_the_window_beside_llama_cpp(gemma):
    """853 tokens of held-out Shakespeare, past the local layers' 512, teacher-forced on llama.cpp's 16 greedy
    tokens: the same top token wherever llama.cpp's margin is no tie, top logits within LOGIT_ATOL, without a cache
    and through the contiguous cache. (With every layer global, 9 of those 13 top tokens differ: the window is seen.)"""
    model, _, _ = gemma
    row = json.loads(LONG_FIXTURE.read_text())["greedy"][0]
    n = len(row["prompt_ids"])
    assert n > model.config.sliding_window
    ids = torch.tensor([row["prompt_ids"] + row["greedy"][:-1]])
    whole = model(ids)[0, n - 1:]
    cache = model.new_cache(max_len=ids.shape[1])
    cached = torch.cat([model(ids[:, :n], cache=cache, last_only=True)[0]]
                       + [model(ids[:, i:i + 1], cache=cache)[0] for i in range(n, ids.shape[1])])
    assert torch.allclose(cached, whole, atol=1e-3, rtol=1e-3)
    for step, top in enumerate(row["top5"]):
        (best, best_logit), (_, second) = top[0], top[1]
        assert abs(float(whole[step, best]) - best_logit) < LOGIT_ATOL, step
        if best_logit - second >= MARGIN:
            assert int(whole[step].argmax()) == best, step


@pytest.mark.parametrize("fixture", [FIXTURE, AVX2_FIXTURE], ids=["avx512", "avx2"])
@torch.no_grad()
def test_greedy_continuations_part_only_at_llama_cpps_ties(gemma, fixture):
    """Free-running greedy decoding of 32 tokens: equal to llama.cpp's, or parting from it first at a step where
    llama.cpp's top two logits are within MARGIN (where the two arithmetics may pick either). llama.cpp's two
    builds part from each other so too (3 of the 8 prompts): its kernels round activations to int8 each their
    own way, and labkit's float32 forward is the exact one (`test_the_file_beside_transformers_reading_it`)."""
    model, _, _ = gemma
    ref = json.loads(fixture.read_text())
    for row in ref["greedy"]:
        cache = model.new_cache(max_len=len(row["prompt_ids"]) + 32)
        logits = model(torch.tensor([row["prompt_ids"]]), cache=cache, last_only=True)[0, -1]
        out = []
        for _ in range(len(row["greedy"])):
            out.append(int(logits.argmax()))
            if out[-1] != row["greedy"][len(out) - 1]:
                top = row["top5"][len(out) - 1]
                assert top[0][1] - top[1][1] < MARGIN, (row["prompt"], len(out) - 1)
                break
            logits = model(torch.tensor([[out[-1]]]), cache=cache)[0, -1]


@torch.no_grad()
def test_the_file_beside_transformers_reading_it(gemma):
    """transformers reads the same file with its own GGUF reader and dequantizer into its own Gemma 3: the
    float32 logits agree to 1e-3 at every position of a prompt and past the local layers' window."""
    import functools

    transformers = pytest.importorskip("transformers")
    gguf = pytest.importorskip("gguf")
    model, tok, _ = gemma
    path = Path(model.source_file)
    real, readers = gguf.GGUFReader, {}

    def reader(p, *args, **kwargs):  # transformers parses the header again for every tensor otherwise
        key = (str(p), args, tuple(sorted(kwargs.items())))
        return readers[key] if key in readers else readers.setdefault(key, real(p, *args, **kwargs))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", reader)
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                               dtype=torch.float32).eval()
    short = tok.encode("The history of the printing press begins in the fifteenth century, when")
    long = json.loads(LONG_FIXTURE.read_text())["greedy"][0]["prompt_ids"][:600]  # past the 512 window
    for ids in (short, long):
        ours, theirs = model(torch.tensor([ids]))[0], hf(torch.tensor([ids])).logits[0]
        assert (ours - theirs).abs().max() < 1e-3
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_a_llama_configs_identity_and_saved_states_are_what_they_were():
    """The family fields at Llama's default are left out of the identity that fingerprints saved states and
    checkpoints, so a state or checkpoint saved before the fields existed still loads."""
    import dataclasses

    from labkit.model.config import FAMILY_FIELDS

    smol = ModelConfig.from_name("smollm2-135m")
    before = {k: v for k, v in dataclasses.asdict(smol).items() if k not in FAMILY_FIELDS}
    assert smol.identity() == before
    assert set(FAMILY_FIELDS) <= set(ModelConfig(**GEMMA_270M).identity())
    assert ModelConfig(**smol.identity()) == smol


def test_generate_streaming_and_the_token_view_run_on_gemma(gemma):
    """The paths that assumed the BPE tokenizer's calls (`stream_decoder`, `allowed_special`) crashed on Gemma: now
    generation runs, a stream gives the same text, the token view draws, and Chat points at a call that works."""
    import labkit
    from labkit.generation.chat import Chat
    from labkit.viz.tokenization import token_boundaries_html

    model, tok, _ = gemma
    out = labkit.generate(model, tok, "The capital of France is", max_new_tokens=4, chat=False, temperature=0.0)
    assert len(out.token_ids) == 4 and out.text == tok.decode(out.token_ids)
    pieces = list(labkit.stream(model, tok, "The capital of France is", max_new_tokens=4, chat=False, temperature=0.0))
    assert "".join(pieces) == out.text
    assert "The" in str(token_boundaries_html(tok, "The capital of France is"))
    with pytest.raises(ValueError, match="chat=False"):
        Chat(model, tok)


def test_the_cli_quality_speculation_and_the_server_run_on_gemma(gemma, capsys, monkeypatch):
    """The other paths a learner takes with a model, on Gemma 3: `labkit generate --no-chat` prints the reply,
    `metrics.quality` scores a window, prompt lookup's greedy tokens are plain greedy decoding's, and `labkit serve`
    answers a completion with the same tokens (the file is a base model: completions, not chat)."""
    import labkit
    from labkit.cli import main
    from labkit.metrics import quality
    from labkit.speculative import PromptLookup, generate as spec_generate

    model, tok, _ = gemma
    prompt = "One, two, three, four, five, six, seven, eight, nine, ten. One, two, three,"
    plain = labkit.generate(model, tok, prompt, max_new_tokens=6, chat=False, temperature=0.0)
    monkeypatch.setattr(labkit, "load", lambda name, dtype=torch.float32: (model, tok))
    assert main(["generate", "--model", "gemma3-270m", "--no-chat", "--max-new-tokens", "6", "--temperature", "0",
                 prompt]) == 0
    assert capsys.readouterr().out.startswith(plain.text)
    ids = tok.encode("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer")
    q = quality(model, ids, window=len(ids), stride=len(ids))
    assert 1 < q["ppl"] < 1e4
    spec = spec_generate(model, PromptLookup(), tok, prompt, gamma=3, max_new_tokens=6, chat=False, temperature=0.0)
    assert spec.token_ids == plain.token_ids
    openai = pytest.importorskip("openai")
    from labkit.serving.http.server import Server

    with Server(model, tok, "gemma3-270m", max_batch=2, token_budget=64, num_blocks=64) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
        reply = client.completions.create(model="gemma3-270m", prompt=prompt, max_tokens=6, temperature=0)
    assert reply.choices[0].text == plain.text
