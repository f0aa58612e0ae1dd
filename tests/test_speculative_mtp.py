"""The MTP head on a frozen backbone: exact drafts, a cache that catches up on what the target verified,
a restricted vocabulary, a file that loads back, and training that learns."""
from __future__ import annotations

import pytest
import torch

import labkit
from labkit.speculative import MTPDrafter, MTPHead, generate, load_head, save_head
from labkit.train.mtp import _examples, features, frequent_vocab, train_head


@pytest.fixture(scope="module")
def bard():
    model, tok = labkit.load("shakespeare")
    return model.requires_grad_(False), tok


def random_head(model, vocab_ids=None, seed=0):
    torch.manual_seed(seed)
    return MTPHead(model.config, vocab_ids=vocab_ids).eval().requires_grad_(False)


@pytest.mark.parametrize("gamma", [1, 3, "auto"])
def test_greedy_output_with_the_mtp_drafter_is_the_targets_own(bard, gamma):
    model, tok = bard
    drafter = MTPDrafter(model, random_head(model))
    try:
        out = generate(model, drafter, tok, "ROMEO:\nBut soft", gamma=gamma, max_new_tokens=24, compare=True)
    finally:
        drafter.close()
    assert out.plain["same_tokens"] and len(out.token_ids) == 24


def test_the_head_cache_holds_what_a_full_pass_over_the_verified_text_would(bard):
    model, tok = bard
    head = random_head(model, seed=1)
    drafter = MTPDrafter(model, head)
    try:
        out = generate(model, drafter, tok, "KING:\nWhat news", gamma=3, max_new_tokens=20)
        history = out.prompt_ids + out.token_ids[:-1]  # the last token was emitted after the head's last catch-up
        feats = features(model, [history])[0]
        with torch.no_grad():
            cache = model.new_cache(max_len=64)  # a contiguous cache of the right shape for a one-layer head
            cache = type(cache)(head.config, max_len=64)
            head(model, feats[1][None, :-1], feats[0][None, 1:], cache)
        verified = drafter.cache.seq_len
        n = min(verified, cache.seq_len) - 4  # the head's own chained positions at the end are not verified
        torch.testing.assert_close(drafter.cache.keys[0, :, :, :n], cache.keys[0, :, :, :n], atol=1e-4, rtol=1e-4)
    finally:
        drafter.close()


def test_drafts_come_from_the_restricted_vocabulary_only(bard):
    model, tok = bard
    allowed = torch.arange(100, 4096, 7)
    drafter = MTPDrafter(model, random_head(model, allowed))
    try:
        cache = model.new_cache(max_len=64)
        drafter.attach(cache)
        ids = tok.encode("ROMEO:\nBut soft")
        model(torch.tensor([ids]), cache=cache, last_only=True)
        tokens, q = drafter.propose(ids + [5], 6, None)
    finally:
        drafter.close()
    assert q is None and len(tokens) == 6 and set(tokens) <= set(allowed.tolist())


def test_a_saved_head_loads_back_and_refuses_another_backbone(bard, tmp_path):
    model, _ = bard
    head = random_head(model, torch.arange(0, 4096, 3))
    path = save_head(head, tmp_path / "h.safetensors", record={"note": "test"})
    loaded, record = load_head(path, model)
    assert record == {"note": "test"} and torch.equal(loaded.vocab_ids, head.vocab_ids)
    for (name, a), b in zip(head.state_dict().items(), loaded.state_dict().values()):
        torch.testing.assert_close(a.half().float() if a.is_floating_point() else a, b.float() if b.is_floating_point() else b)
    other = labkit.model.transformer.Transformer(model.config.replace(d_model=128, n_heads=2, n_kv_heads=1, head_dim=64))
    with pytest.raises(ValueError, match="does not fit this backbone"):
        load_head(path, other)


def test_frequent_vocab_keeps_the_most_common_teacher_tokens():
    feats = [(torch.zeros(6, dtype=torch.long), torch.zeros(6, 4), torch.tensor([3, 3, 3, 1, 1, 2]))]
    ids, coverage = frequent_vocab(feats, 2)
    assert ids.tolist() == [1, 3] and coverage == pytest.approx(5 / 6)
    h, nxt, tgt = _examples([(torch.arange(6), torch.randn(6, 4), torch.tensor([3, 3, 3, 1, 1, 2]))], ids, 8)
    assert nxt.tolist() == [1, 2, 3, 4] and tgt.tolist() == [1, 1, 0, 0]  # a_{t+1} as an index into [1, 3]


def test_training_the_head_lowers_its_loss_and_raises_agreement(bard):
    model, tok = bard
    text = labkit.data.corpus.load_text("train")[:6000]
    convs = [tok.encode(text[i:i + 600]) for i in range(0, 6000, 600)]
    feats = features(model, convs)
    head = MTPHead(model.config, vocab_ids=frequent_vocab(feats, 512)[0])
    from labkit.train.mtp import agreement
    before = agreement(model, head, feats[:2])
    record = train_head(model, head, feats[2:], feats[:2], steps=60, batch=4, seq_len=64, lr=2e-3, progress=False)
    losses = record["losses"]
    assert sum(losses[-10:]) / 10 < 0.8 * sum(losses[:10]) / 10
    assert record["val_agreement"] > before


def test_labkit_train_smollm2_mtp_quick_writes_a_head_that_drafts_exactly(tmp_path):
    import subprocess
    import sys

    from tests.conftest import python_env

    run = subprocess.run([sys.executable, "-m", "labkit", "train", "--model", "smollm2-mtp", "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, env=python_env(), timeout=300)
    assert run.returncode == 0, run.stderr
    assert "held-out top-1 agreement" in run.stdout
    smol, tok = labkit.load("smollm2-135m")
    drafter = MTPDrafter.from_file(smol, tmp_path / "smollm2-mtp-quick.safetensors")
    try:
        out = generate(smol, drafter, tok, "What is rain?", gamma=2, max_new_tokens=12, compare=True)
    finally:
        drafter.close()
    assert out.plain["same_tokens"]


@pytest.mark.parametrize("bits", [8, 4])
def test_the_head_drafts_for_a_quantized_target_with_bf16_activations(bard, tmp_path, bits):
    from labkit.quant import has_kernel, quantize_model

    if not has_kernel(bits):
        pytest.skip("no packed kernel in this torch build")
    model, tok = bard
    target = quantize_model(model, bits=bits, group_size=32, act_dtype=torch.bfloat16)
    path = save_head(random_head(model), tmp_path / "h.safetensors")
    drafter = MTPDrafter.from_file(target, path)
    try:
        assert {p.dtype for p in drafter.head.parameters()} == {target.dtype}  # the head follows its target
        out = generate(target, drafter, tok, "ROMEO:\nBut soft", gamma=2, max_new_tokens=12)
    finally:
        drafter.close()
    assert len(out.token_ids) == 12 and out.target_calls >= 1 and out.draft_steps >= 2


def test_a_head_step_is_timed_on_a_filled_cache(bard):
    from labkit.speculative.mtp import head_step_s

    model, _ = bard
    seconds = head_step_s(model, random_head(model), position=16, repeat=3)
    assert isinstance(seconds, float) and seconds > 0  # a median of positive samples (no bound on its size)
    with pytest.raises(ValueError, match="rounds"):
        head_step_s(model, random_head(model), position=16, repeat=0)
