"""The zero-copy head (reads the target's own last-layer KV) and the parallel Medusa heads: exact drafts, a
zero-copy draft equal to one from a fresh pass over the text, training that matches drafting, files that load back."""
from __future__ import annotations

import pytest
import torch

import labkit
from labkit.speculative import (MedusaDrafter, MedusaHeads, MTPHead, ZeroCopyDrafter, ZeroCopyHead, generate, load_head,
                                save_head)
from labkit.speculative.headfile import head_from_file
from labkit.train.heads import _zero_copy_batch, _index, features_kv, medusa_agreement, train_medusa, train_zero_copy


@pytest.fixture(scope="module")
def bard():
    model, tok = labkit.load("shakespeare")
    return model.requires_grad_(False), tok


def zero_copy(model, seed=0, vocab_ids=None):
    torch.manual_seed(seed)
    head = ZeroCopyHead(model.config, vocab_ids=vocab_ids)
    with torch.no_grad():  # random weights, scaled so that the attention is not uniform
        head.wqkv.weight.mul_(4)
    return head.eval().requires_grad_(False)


def medusa(model, n=3, seed=0):
    torch.manual_seed(seed)
    heads = MedusaHeads(model.config, n_heads=n)
    with torch.no_grad():
        heads.weight.normal_(0, 0.05)
    return heads.eval().requires_grad_(False)


@pytest.mark.parametrize("gamma", [1, 3, "auto"])
@pytest.mark.parametrize("kind", ["zero-copy", "medusa"])
def test_greedy_output_with_either_head_is_the_targets_own(bard, gamma, kind):
    model, tok = bard
    drafter = ZeroCopyDrafter(model, zero_copy(model)) if kind == "zero-copy" else MedusaDrafter(model, medusa(model))
    try:
        out = generate(model, drafter, tok, "ROMEO:\nBut soft", gamma=gamma, max_new_tokens=24, compare=True)
    finally:
        drafter.close()
    assert out.plain["same_tokens"] and len(out.token_ids) == 24 and out.draft_steps > 0


def reference_draft(model, head, history, gamma):
    """What the zero-copy head drafts after `history`, from a fresh full pass over it (no cache carried over)."""
    ids, h, _, keys, values = features_kv(model, [history[:-1]])[0]
    n = len(history) - 1
    out, token, tokens = h[-1:][None], history[-1], []
    for i in range(gamma):
        out = head(model, out, torch.tensor([[token]]), keys[None], values[None], torch.tensor([n + i]))
        token = int(head.vocab_ids[head.logits(model, out)[0, -1].argmax()])
        tokens.append(token)
    return tokens


def test_a_zero_copy_draft_equals_one_from_a_fresh_pass_over_the_verified_text(bard):
    model, tok = bard
    head = zero_copy(model, seed=2)
    drafter = ZeroCopyDrafter(model, head)
    rounds = []
    propose = drafter.propose
    drafter.propose = lambda history, g, *a: rounds.append((list(history), g, propose(history, g, *a)[0])) or (rounds[-1][2], None)
    try:
        generate(model, drafter, tok, "KING:\nWhat news", gamma=3, max_new_tokens=24)
    finally:
        drafter.close()
    assert len(rounds) >= 4
    for history, g, tokens in rounds:
        assert tokens == reference_draft(model, head, history, g)
    assert len({tuple(t) for _, _, t in rounds}) > 1  # the drafts are not all alike: a real check


def test_zero_copy_training_sees_what_drafting_sees(bard):
    """The teacher-forced batch (a causal mask over the backbone's keys) equals one drafting step at each position."""
    model, tok = bard
    head = zero_copy(model, seed=3)
    feats = features_kv(model, [tok.encode("ROMEO:\nBut soft, what light through yonder window breaks?")])
    h, nxt, keys, values, tgt, visible = _zero_copy_batch(feats, _index(head.vocab_ids, model.config.vocab_size))
    batch = head(model, h, nxt, keys, values, torch.arange(1, h.shape[1] + 1), visible)
    for t in range(h.shape[1]):
        one = head(model, h[:, t:t + 1], nxt[:, t:t + 1], keys[:, :, :t + 1], values[:, :, :t + 1], torch.tensor([t + 1]))
        torch.testing.assert_close(batch[:, t], one[:, 0], atol=1e-5, rtol=1e-5)
    wrong = head(model, h, nxt, keys, values, torch.arange(1, h.shape[1] + 1))  # no mask: sees the future
    assert not torch.allclose(wrong[:, :-1], batch[:, :-1], atol=1e-3)


def test_the_zero_copy_head_needs_the_targets_keys_in_place(bard):
    model, _ = bard
    drafter = ZeroCopyDrafter(model, zero_copy(model))
    try:
        with pytest.raises(ValueError, match="needs a contiguous cache"):
            drafter.attach(model.new_cache("paged", max_len=64))
    finally:
        drafter.close()


def test_medusa_drafts_one_token_per_head_at_most(bard):
    model, tok = bard
    drafter = MedusaDrafter(model, medusa(model, n=3))
    try:
        cache = model.new_cache(max_len=64)
        drafter.attach(cache)
        ids = tok.encode("ROMEO:\nBut soft")
        model(torch.tensor([ids]), cache=cache, last_only=True)
        tokens, q = drafter.propose(ids + [5], 6)
        assert q is None and len(tokens) == 3 and drafter.steps == 1
        assert drafter.propose(ids + [5], 2)[0] == tokens[:2]  # each head guesses alone: fewer heads, same guesses
    finally:
        drafter.close()


@pytest.mark.parametrize("bits", [8, 4])
def test_both_heads_draft_exactly_for_a_quantized_target_with_bf16_activations(bard, tmp_path, bits):
    from labkit.quant import has_kernel, quantize_model

    if not has_kernel(bits):
        pytest.skip("no packed kernel in this torch build")
    model, tok = bard
    target = quantize_model(model, bits=bits, group_size=32, act_dtype=torch.bfloat16)
    for cls, head in ((ZeroCopyDrafter, zero_copy(model)), (MedusaDrafter, medusa(model))):
        drafter = cls.from_file(target, save_head(head, tmp_path / f"{cls.__name__}.safetensors"))
        try:
            assert {p.dtype for p in drafter.head.parameters()} == {target.dtype}  # the head follows its target
            out = generate(target, drafter, tok, "ROMEO:\nBut soft", gamma=3, max_new_tokens=16, compare=True)
        finally:
            drafter.close()
        assert out.plain["same_tokens"], cls.__name__


def test_heads_load_back_as_their_own_kind_and_refuse_the_wrong_one(bard, tmp_path):
    model, _ = bard
    for head in (zero_copy(model, vocab_ids=torch.arange(0, 4096, 3)), medusa(model, n=2)):
        path = save_head(head, tmp_path / f"{type(head).__name__}.safetensors", record={"note": "x"})
        loaded, record = load_head(path, model)
        assert type(loaded) is type(head) and record == {"note": "x"} and torch.equal(loaded.vocab_ids, head.vocab_ids)
        for a, b in zip(head.state_dict().values(), loaded.state_dict().values()):
            torch.testing.assert_close(a.half().float() if a.is_floating_point() else a, b.float() if b.is_floating_point() else b)
    assert loaded.n_heads == 2
    with pytest.raises(ValueError, match="holds a medusa head, not a zero-copy head"):
        head_from_file(model, "zero-copy", path)
    with pytest.raises(ValueError, match="kind must be one of"):
        head_from_file(model, "eagle", path)
    with pytest.raises(ValueError, match="n_heads must be an integer >= 1"):
        MedusaHeads(model.config, n_heads=0)
    mtp = save_head(MTPHead(model.config), tmp_path / "mtp.safetensors")
    assert isinstance(load_head(mtp, model)[0], MTPHead)


def test_training_raises_both_heads_agreement(bard):
    model, tok = bard
    text = labkit.data.corpus.load_text("train")[:4800]
    feats = features_kv(model, [tok.encode(text[i:i + 600]) for i in range(0, 4800, 600)])
    vocab = torch.arange(model.config.vocab_size)
    zc = ZeroCopyHead(model.config, vocab_ids=vocab)
    with torch.no_grad():
        zc.fuse.weight.zero_()
        zc.fuse.weight[:, :model.config.d_model] = torch.eye(model.config.d_model)
    from labkit.train.heads import zero_copy_agreement
    before = zero_copy_agreement(model, zc, feats[:2])
    record = train_zero_copy(model, zc, feats[2:], feats[:2], steps=40, batch=2, lr=2e-3, eval_every=20, progress=False)
    assert record["val_agreement"] > before and sum(record["losses"][-5:]) < sum(record["losses"][:5])
    heads = MedusaHeads(model.config, n_heads=2, vocab_ids=vocab)
    before = medusa_agreement(model, heads, feats[:2])
    record = train_medusa(model, heads, feats[2:], feats[:2], steps=60, batch=128, lr=2e-3, eval_every=30, progress=False)
    assert min(a - b for a, b in zip(record["val_agreement_by_head"], before)) > 0
    assert sum(record["losses"][-5:]) < 0.9 * sum(record["losses"][:5])


def test_labkit_train_smollm2_heads_quick_writes_heads_that_draft_exactly(tmp_path):
    import subprocess
    import sys

    from tests.conftest import python_env

    run = subprocess.run([sys.executable, "-m", "labkit", "train", "--model", "smollm2-heads", "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, env=python_env(), timeout=300)
    assert run.returncode == 0, run.stderr
    assert "zerocopy head" in run.stdout and "medusa head" in run.stdout and "by head" in run.stdout
    smol, tok = labkit.load("smollm2-135m")
    for cls, name in ((ZeroCopyDrafter, "smollm2-zerocopy-quick"), (MedusaDrafter, "smollm2-medusa-quick")):
        drafter = cls.from_file(smol, tmp_path / f"{name}.safetensors")
        try:
            out = generate(smol, drafter, tok, "What is rain?", gamma=2, max_new_tokens=12, compare=True)
        finally:
            drafter.close()
        assert out.plain["same_tokens"], name


def test_the_head_recipes_generate_their_conversations_once(tmp_path, monkeypatch):
    from labkit.data import paths
    from labkit.train import mtp

    calls = []
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    monkeypatch.setattr(mtp, "generate_conversations",
                        lambda backbone, tok, prompts, max_new_tokens, progress: calls.append(1) or [[1, 2, 3]] * len(prompts))
    first = mtp.self_distillation_data(quick=True, progress=False)
    again = mtp.self_distillation_data(quick=True, progress=False)
    assert len(calls) == 1 and first[2] == again[2] and first[3] == again[3]
    assert len(list((tmp_path / ".build" / "train").glob("smollm2-conversations-*.json"))) == 1
