"""Train the zero-copy head and the parallel (Medusa) heads on frozen SmolLM2: `labkit train --model smollm2-heads`.

The data are the MTP head's (`labkit.train.mtp`): SmolLM2's greedy replies to the same fixed prompts, one
frozen backbone pass per conversation, the K most frequent teacher tokens, every tenth conversation
held out. This recipe also keeps the backbone's last-layer keys and values of every conversation,
which the zero-copy head attends over.

- **Zero-copy head** (`ZeroCopyHead`): at position t it sees h_t, token_{t+1}, the backbone's keys and
  values at positions 0..t and its own, and learns the backbone's greedy token after token_{t+1}
  (batches of whole conversations, a causal mask over the backbone's keys).
- **Medusa heads** (`MedusaHeads`): head i sees h_t alone and learns the backbone's greedy token at
  t + 1 + i (random positions of the training stream).

Both keep the weights with the best held-out top-1 agreement (for Medusa: the mean over its heads).
Written to `data/smollm2-zerocopy.safetensors` and `data/smollm2-medusa.safetensors` (float16).
"""
from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F

from labkit.speculative.headfile import save_head
from labkit.speculative.heads import MedusaHeads, ZeroCopyHead
from labkit.train.mtp import fit_head

__all__ = ["features_kv", "train_zero_copy", "zero_copy_agreement", "train_medusa", "medusa_agreement", "train_heads"]


@torch.inference_mode()
def features_kv(model, conversations: list[list[int]]) -> list[tuple]:
    """Per conversation: (ids [T], hidden [T, d], greedy next tokens [T], last-layer keys, values [Hkv, T, D])."""
    captured = {}
    hook = model.layers[-1].register_forward_hook(lambda m, a, out: captured.__setitem__("h", out[0] if out.dim() == 3 else out))
    layer = model.config.n_layers - 1
    try:
        out = []
        for ids in conversations:
            cache = model.new_cache(max_len=len(ids))
            logits = model(torch.tensor([ids]), cache=cache)[0]
            out.append((torch.tensor(ids), captured["h"].float().clone(), logits.argmax(-1),
                        cache.keys[layer, 0, :, :len(ids)].float().clone(), cache.values[layer, 0, :, :len(ids)].float().clone()))
    finally:
        hook.remove()
    return out


def _index(vocab_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    index = torch.full((vocab_size,), -100, dtype=torch.long)
    index[vocab_ids] = torch.arange(len(vocab_ids))
    return index


def _zero_copy_batch(feats, index):
    """Padded batch: hidden [B, T, d], next ids [B, T], keys/values [B, Hkv, T+1, D], targets [B, T] (-100: none)."""
    T = max(len(f[0]) for f in feats) - 2
    B, d = len(feats), feats[0][1].shape[1]
    Hkv, _, D = feats[0][3].shape
    h, nxt, tgt = torch.zeros(B, T, d), torch.zeros(B, T, dtype=torch.long), torch.full((B, T), -100, dtype=torch.long)
    keys, values = torch.zeros(B, Hkv, T, D), torch.zeros(B, Hkv, T, D)
    for b, (ids, hid, a, k, v) in enumerate(feats):
        n = len(ids) - 2  # positions t = 0 .. n − 1: h_t, token_{t+1} -> a_{t+1}
        h[b, :n], nxt[b, :n], tgt[b, :n] = hid[:n], ids[1:n + 1], index[a[1:n + 1]]
        keys[b, :, :n], values[b, :, :n] = k[:, :n], v[:, :n]
    visible = torch.ones(T, T, dtype=torch.bool).tril()  # query t sees the backbone's keys 0 .. t
    return h, nxt, keys, values, tgt, visible


def _zero_copy_logits(backbone, head, batch, rows, noise=0.0, gen=None):
    h, nxt, keys, values, tgt, visible = batch
    if noise:
        h = h + (torch.rand(h.shape, generator=gen) - 0.5) * (2 * noise * h.std())
    out = head(backbone, h, nxt, keys, values, torch.arange(1, h.shape[1] + 1), visible)
    return F.linear(backbone.norm(out), rows), tgt


def train_zero_copy(backbone, head: ZeroCopyHead, train, val, *, steps: int = 400, batch: int = 8, lr: float = 1e-3,
                    seed: int = 0, noise: float = 0.1, eval_every: int = 100, progress: bool = True) -> dict:
    """Teacher-forced training on whole conversations; returns losses, agreement checks and the best agreement."""
    torch.manual_seed(seed)
    train = [f for f in train if len(f[0]) >= 3]
    if not train:
        raise ValueError("no training conversation holds 3 tokens or more")
    index = _index(head.vocab_ids, backbone.config.vocab_size)
    rows = backbone.output_weight().detach().index_select(0, head.vocab_ids)
    params = [p for p in head.parameters() if p.requires_grad]

    def step_loss(gen):
        pick = torch.randint(0, len(train), (batch,), generator=gen).tolist()
        logits, tgt = _zero_copy_logits(backbone, head, _zero_copy_batch([train[i] for i in pick], index), rows, noise, gen)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)

    def check():
        return zero_copy_agreement(backbone, head, val), {k: v.detach().clone() for k, v in head.state_dict().items()}

    losses, checks, best, wall = fit_head(params, steps, lr, seed, step_loss, check, eval_every, "training the zero-copy head", progress)
    head.load_state_dict(best)
    return {"losses": losses, "train_s": wall, "agreement_checks": checks, "val_agreement": max(a for _, a in checks)}


@torch.no_grad()
def zero_copy_agreement(backbone, head: ZeroCopyHead, feats) -> float:
    """Share of positions where the head's first guess is the backbone's next-next token."""
    index = _index(head.vocab_ids, backbone.config.vocab_size)
    rows = backbone.output_weight().detach().index_select(0, head.vocab_ids)
    hits = total = 0
    for f in feats:
        if len(f[0]) < 3:
            continue
        logits, tgt = _zero_copy_logits(backbone, head, _zero_copy_batch([f], index), rows)
        hits += int((logits.argmax(-1) == tgt).sum())
        total += tgt.numel()  # a target outside the vocabulary is a miss
    return hits / max(total, 1)


def _medusa_stream(feats, n_heads: int, index):
    """h_t and, per head i, the index of a_{t+1+i} in the vocabulary (-100: past the end or outside)."""
    hs, tgts = [], []
    for ids, h, a, *_ in feats:
        T = len(ids)
        t = torch.full((T, n_heads), -100, dtype=torch.long)
        for i in range(n_heads):
            if T > i + 1:
                t[:T - 1 - i, i] = index[a[1 + i:]]
        hs.append(h)
        tgts.append(t)
    return torch.cat(hs), torch.cat(tgts)


def train_medusa(backbone, heads: MedusaHeads, train, val, *, steps: int = 400, batch: int = 512, lr: float = 1e-3,
                 seed: int = 0, eval_every: int = 100, progress: bool = True) -> dict:
    """Cross-entropy of every head on random positions; returns losses, checks and per-head held-out agreement."""
    torch.manual_seed(seed)
    index = _index(heads.vocab_ids, backbone.config.vocab_size)
    h, tgt = _medusa_stream(train, heads.n_heads, index)
    rows = backbone.output_weight().detach().index_select(0, heads.vocab_ids)
    params = [p for p in heads.parameters() if p.requires_grad]

    def step_loss(gen):
        pick = torch.randint(0, len(h), (batch,), generator=gen)
        logits = F.linear(backbone.norm(heads(h[pick])), rows)  # [batch, n_heads, K]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[pick].reshape(-1), ignore_index=-100)

    def check():
        per = medusa_agreement(backbone, heads, val)
        return sum(per) / len(per), {k: v.detach().clone() for k, v in heads.state_dict().items()}

    losses, checks, best, wall = fit_head(params, steps, lr, seed, step_loss, check, eval_every, "training the Medusa heads", progress)
    heads.load_state_dict(best)
    return {"losses": losses, "train_s": wall, "agreement_checks": checks, "val_agreement": max(a for _, a in checks),
            "val_agreement_by_head": medusa_agreement(backbone, heads, val)}


@torch.no_grad()
def medusa_agreement(backbone, heads: MedusaHeads, feats) -> list[float]:
    """Per head i: share of positions (that have a token i + 1 past the next) where its guess is the backbone's."""
    index = _index(heads.vocab_ids, backbone.config.vocab_size)
    h, tgt = _medusa_stream(feats, heads.n_heads, index)
    guess = heads.logits(backbone, heads(h)).argmax(-1)  # [N, n_heads]
    valid = tgt != -100
    return [float(((guess[:, i] == tgt[:, i]) & valid[:, i]).sum() / valid[:, i].sum().clamp(min=1))
            for i in range(heads.n_heads)]


def train_heads(quick: bool = False, out_dir=None, vocab: int = 4096, n_medusa: int = 4, progress: bool = True) -> dict:
    """The whole recipe on SmolLM2 (see the module docstring); writes both heads to `out_dir` (default data/)."""
    from pathlib import Path

    from labkit.data import paths
    from labkit.train.mtp import frequent_vocab, self_distillation_data

    backbone, prompts, convs, gen_s = self_distillation_data(quick, progress)
    feats = features_kv(backbone, convs)
    val, train = feats[::10], [f for i, f in enumerate(feats) if i % 10]
    vocab_ids, coverage = frequent_vocab([f[:3] for f in train], vocab)
    zc = ZeroCopyHead(backbone.config, vocab_ids=vocab_ids)
    with torch.no_grad():  # start as "the backbone's hidden state, unchanged": fuse = [I 0], residual branches small
        d = backbone.config.d_model
        zc.fuse.weight.zero_()
        zc.fuse.weight[:, :d] = torch.eye(d)
        zc.wo.weight.mul_(0.1)
        zc.mlp.w_down.weight.mul_(0.1)
    medusa = MedusaHeads(backbone.config, n_heads=n_medusa, vocab_ids=vocab_ids)
    quick_settings = dict(steps=20, eval_every=10)
    zc_settings = quick_settings | dict(batch=2) if quick else dict(steps=500, batch=8)
    md_settings = quick_settings | dict(batch=64) if quick else dict(steps=500, batch=512)
    shared = {"prompts": len(prompts), "conversations_tokens": sum(len(c) for c in convs), "generate_s": gen_s,
              "vocab": len(vocab_ids), "vocab_coverage": coverage, "val_conversations": len(val)}
    out = Path(out_dir or paths.DATA_DIR)
    suffix = "-quick" if quick else ""
    records = {}
    for kind, head, trainer, settings in (("zerocopy", zc, train_zero_copy, zc_settings),
                                          ("medusa", medusa, train_medusa, md_settings)):
        record = trainer(backbone, head, train, val, progress=progress, **settings)
        record.update(shared | {"settings": settings, "head_params": head.n_params()})
        path = out / f"smollm2-{kind}{suffix}.safetensors"
        save_head(head, path, record={k: v for k, v in record.items() if k != "losses"} | {"final_loss": record["losses"][-1]})
        path.with_suffix(".json").write_text(json.dumps({"head": path.stem, "backbone": "smollm2-135m (frozen)", "record": record,
                                                         "torch_version": torch.__version__,
                                                         "threads": torch.get_num_threads()}, indent=1) + "\n")
        records[kind] = record | {"path": str(path)}
    return records
