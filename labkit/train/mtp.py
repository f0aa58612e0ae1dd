"""Train an MTP head on frozen SmolLM2 by self-distillation: `labkit train --model smollm2-mtp`.

1. **Data**: SmolLM2 answers a fixed set of prompts (open questions, and passages to summarise
   or repeat) greedily, through the serving engine (`labkit.serving`, many replies per pass).
2. **Features**: one frozen backbone pass per conversation records the last block's hidden
   state h_t at every position and the backbone's own greedy next token a_t.
3. **Vocabulary**: the head answers over the K most frequent teacher tokens only.
4. **Training**: the head sees (h_t, token_{t+1}) and learns to predict a_{t+1}, the token the
   backbone will emit after token_{t+1} (cross-entropy; the backbone's weights never change).
   The held-out conversations give the head's top-1 agreement with the backbone; the weights with the
   best agreement are kept (the corpus is small: longer training memorises it).

The prompts that `labkit bench --only speculative` and chapter 07 measure with are not among the training
prompts (no "moon" or "sun", no `Account` or `Basket` class, no lighthouse or baker passage). The head is saved as
`data/smollm2-mtp.safetensors` (float16, ~8 MB).
"""
from __future__ import annotations

import json
import math

import torch
import torch.nn.functional as F

from labkit.measure.clock import now as clock_now
from labkit.speculative.headfile import save_head
from labkit.speculative.mtp import MTPHead

__all__ = ["chat_prompts", "generate_conversations", "self_distillation_data", "features", "frequent_vocab", "train_head",
           "train_mtp", "fit_head"]

TOPICS = ["lakes", "rain", "bread", "rivers", "the ocean", "volcanoes", "bees", "trees", "coffee", "tea", "music",
          "the piano", "chess", "football", "bicycles", "trains", "airplanes", "the internet", "email", "computers",
          "batteries", "solar power", "wind", "snow", "deserts", "mountains", "cats", "dogs", "horses", "birds",
          "honey", "cheese", "rice", "apples", "the heart", "sleep", "exercise", "water", "salt", "glass", "paper",
          "books", "libraries", "maps", "clocks", "calendars", "money", "banks", "markets", "cities", "gardens",
          "recycling", "the weather", "stars", "planets", "gravity", "light", "sound", "colours", "numbers"]
TEMPLATES = ["Tell me about {t} in three sentences.", "What is {t}? Answer briefly.", "Give me three facts about {t}.",
             "Explain {t} to a child.", "Why do people care about {t}?"]
GROUNDED = ["Summarise this passage in two sentences:\n\n{p}", "Repeat this passage exactly:\n\n{p}",
            "Rewrite this passage in plain modern English:\n\n{p}", "Summarise this passage in two sentences, "
            "reusing its words:\n\n{p}"]
CODE_TASKS = ["Rename the variable {v} to {w} in this code and return the whole code:\n\n{c}",
              "Add a docstring to this function and return the whole code:\n\n{c}",
              "Explain what this code does:\n\n{c}"]
CODE_SHAPES = ["def {f}(xs):\n    {v} = 0\n    for x in xs:\n        {v} = {v} + x\n    return {v}\n",
               "def {f}(items):\n    {v} = []\n    for item in items:\n        if item > 0:\n            {v}.append(item)\n    return {v}\n",
               "def {f}(n):\n    {v} = 1\n    for i in range(2, n + 1):\n        {v} = {v} * i\n    return {v}\n",
               "def {f}(text):\n    {v} = {{}}\n    for word in text.split():\n        {v}[word] = {v}.get(word, 0) + 1\n    return {v}\n"]
NAMES = [("add_up", "t", "subtotal"), ("positives", "out", "kept"), ("factorial", "acc", "product"),
         ("word_counts", "counts", "tally"), ("score", "result", "value"), ("collect", "found", "matches")]


def chat_prompts(passages: list[str], quick: bool = False) -> list[str]:
    """The fixed prompts: every topic in every template, and every passage in every grounded task."""
    topics, passages = (TOPICS[:2], passages[:1]) if quick else (TOPICS, passages)
    shapes = CODE_SHAPES[:1] if quick else CODE_SHAPES
    code = [shape.format(f=f, v=v) for shape in shapes for f, v, _ in (NAMES[:1] if quick else NAMES)]
    tasks = [t.format(c=c, v=v, w=w) for c, (f, v, w) in zip(code, NAMES * len(CODE_SHAPES)) for t in CODE_TASKS]
    return ([t.format(t=topic) for topic in topics for t in TEMPLATES] + [g.format(p=p) for p in passages for g in GROUNDED]
            + tasks)


@torch.inference_mode()
def generate_conversations(model, tok, prompts: list[str], max_new_tokens: int = 96, max_batch: int = 16,
                           progress: bool = True) -> list[list[int]]:
    """Each prompt in the chat template + SmolLM2's greedy reply (to EOS or max_new_tokens), as token ids."""
    from labkit.serving.studies.specload import serve_once

    reqs = serve_once(model, tok, prompts, max_new_tokens, max_batch=max_batch, min_token_budget=1024,
                      batch_invariant=False, prefix_cache=True, progress=progress)
    return [r.prompt + r.output for r in reqs]


@torch.inference_mode()
def features(model, conversations: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per conversation: (ids [T], the last block's hidden states [T, d], the backbone's greedy next tokens [T])."""
    captured = {}
    hook = model.layers[-1].register_forward_hook(lambda m, a, out: captured.__setitem__("h", out[0] if out.dim() == 3 else out))
    try:
        out = []
        for ids in conversations:
            x = torch.tensor([ids])
            logits = model(x)[0]
            out.append((x[0], captured["h"].float().clone(), logits.argmax(-1)))
    finally:
        hook.remove()
    return out


def frequent_vocab(feats, k: int) -> tuple[torch.Tensor, float]:
    """The k most frequent teacher tokens (sorted ids) and the share of teacher tokens they cover."""
    teacher = torch.cat([a for _, _, a in feats])
    counts = torch.bincount(teacher)
    top = counts.argsort(descending=True)[:k]
    return top.sort().values, float(counts[top].sum() / teacher.numel())


def _examples(feats, vocab_ids: torch.Tensor, vocab_size: int):
    """Stream of head inputs and targets: h_t, token_{t+1} -> index of a_{t+1} in vocab_ids (-100 if outside)."""
    index = torch.full((vocab_size,), -100, dtype=torch.long)
    index[vocab_ids] = torch.arange(len(vocab_ids))
    hs, nxt, tgt = [], [], []
    for ids, h, a in feats:
        if len(ids) < 3:
            continue
        hs.append(h[:-2])
        nxt.append(ids[1:-1])
        tgt.append(index[a[1:-1]])
    return torch.cat(hs), torch.cat(nxt), torch.cat(tgt)


def fit_head(params, steps, lr, seed, step_loss, check, eval_every, desc, progress):
    """AdamW with a cosine schedule and gradient clipping over `steps` calls of `step_loss(generator)`; every
    `eval_every` steps `check()` gives (score, state): the state with the best score is returned as `best`.
    Returns (losses, checks, best, seconds)."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    losses, checks, best, t0 = [], [], None, clock_now()
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, desc=desc, unit="step")
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        loss = step_loss(gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            score, state = check()
            checks.append((step + 1, score))
            if score >= max(a for _, a in checks):
                best = state
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    if bar is not None:
        bar.close()
    return losses, checks, best, clock_now() - t0


def train_head(backbone, head: MTPHead, train_feats, val_feats, *, steps: int = 400, batch: int = 8, seq_len: int = 128,
               lr: float = 1e-3, seed: int = 0, noise: float = 0.1, eval_every: int = 100, progress: bool = True) -> dict:
    """AdamW with a cosine schedule on windows of the training stream; keeps the weights with the best held-out
    agreement (checked every `eval_every` steps). Returns losses, agreements and the best agreement."""
    torch.manual_seed(seed)
    h, nxt, tgt = _examples(train_feats, head.vocab_ids, backbone.config.vocab_size)
    if len(tgt) <= seq_len:
        raise ValueError(f"the training stream holds {len(tgt)} examples, fewer than seq_len={seq_len}")
    params = [p for p in head.parameters() if p.requires_grad]
    rows = backbone.output_weight().detach().index_select(0, head.vocab_ids)

    def step_loss(gen):
        starts = torch.randint(0, len(tgt) - seq_len, (batch,), generator=gen)
        idx = starts[:, None] + torch.arange(seq_len)
        x = h[idx]
        if noise:  # EAGLE's trick: a little uniform noise on the features, as the head's own guesses will carry
            x = x + (torch.rand(x.shape, generator=gen) - 0.5) * (2 * noise * x.std())
        logits = F.linear(backbone.norm(head(backbone, x, nxt[idx])), rows)  # [B, T, K]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[idx].reshape(-1), ignore_index=-100)

    def check():
        return agreement(backbone, head, val_feats), {k: v.detach().clone() for k, v in head.state_dict().items()}

    losses, checks, best, wall = fit_head(params, steps, lr, seed, step_loss, check, eval_every, "training the MTP head", progress)
    head.load_state_dict(best)
    return {"losses": losses, "train_s": wall, "agreement_checks": checks,
            "val_agreement": max(a for _, a in checks), "train_examples": int(len(tgt))}


@torch.no_grad()
def agreement(backbone, head: MTPHead, feats) -> float:
    """Share of positions where the head's first guess equals the backbone's next-next token (one chat at a time)."""
    hits = total = 0
    for ids, h, a in feats:
        if len(ids) < 3:
            continue
        out = head(backbone, h[None, :-2], ids[None, 1:-1])
        guess = head.vocab_ids[head.logits(backbone, out)[0].argmax(-1)]
        hits += int((guess == a[1:-1]).sum())
        total += len(ids) - 2
    return hits / max(total, 1)


def self_distillation_data(quick: bool = False, progress: bool = True):
    """Frozen SmolLM2 and its greedy replies to the fixed prompts: (backbone, prompts, conversations, seconds).

    The replies are kept in `.build/train/` under a hash of the prompts, the reply length and the model file, so the
    recipes that share them (`smollm2-mtp`, `smollm2-heads`) generate them once; `seconds` is the
    generation's own time either way."""
    import hashlib

    from labkit.data import corpus, paths
    from labkit.model.gguf import load_gguf
    from labkit.tokenizer.gguf import from_gguf

    backbone, tok = load_gguf(paths.smollm2_gguf_path()), from_gguf(paths.smollm2_gguf_path())
    backbone.eval().requires_grad_(False)
    text = corpus.load_text("train")
    passages = [text[i:i + 400].split("\n", 1)[-1].rsplit("\n", 1)[0] for i in range(0, 40_000, 2_500)]
    prompts = chat_prompts(passages, quick)
    max_new = 16 if quick else 96
    gguf = paths.smollm2_gguf_path()
    key = hashlib.sha256(json.dumps([prompts, max_new, gguf.name, gguf.stat().st_size]).encode()).hexdigest()[:16]
    stored = paths.ROOT / ".build" / "train" / f"smollm2-conversations-{key}.json"
    if stored.exists():
        saved = json.loads(stored.read_text())
        return backbone, prompts, saved["conversations"], saved["generate_s"]
    t0 = clock_now()
    convs = generate_conversations(backbone, tok, prompts, max_new_tokens=max_new, progress=progress)
    gen_s = clock_now() - t0
    stored.parent.mkdir(parents=True, exist_ok=True)
    stored.write_text(json.dumps({"conversations": convs, "generate_s": gen_s}))
    return backbone, prompts, convs, gen_s


def train_mtp(quick: bool = False, out_dir=None, vocab: int = 4096, progress: bool = True) -> dict:
    """The whole recipe on SmolLM2 (see the module docstring); writes `<out_dir>/smollm2-mtp.safetensors`."""
    from pathlib import Path

    from labkit.data import paths

    backbone, prompts, convs, gen_s = self_distillation_data(quick, progress)
    feats = features(backbone, convs)
    val, train = feats[::10], [f for i, f in enumerate(feats) if i % 10]  # every tenth conversation held out
    vocab_ids, coverage = frequent_vocab(train, vocab)
    head = MTPHead(backbone.config, vocab_ids=vocab_ids)
    with torch.no_grad():  # start as "the backbone's hidden state, unchanged": fuse = [I 0], residual branches off
        d = backbone.config.d_model
        head.fuse.weight.zero_()
        head.fuse.weight[:, :d] = torch.eye(d)
        head.block.attn.wo.weight.mul_(0.1)
        head.block.mlp.w_down.weight.mul_(0.1)
    settings = dict(steps=20, batch=2, seq_len=32, eval_every=10) if quick else dict(steps=600, batch=8, seq_len=128)
    record = train_head(backbone, head, train, val, progress=progress, **settings)
    record.update({"prompts": len(prompts), "conversations_tokens": sum(len(c) for c in convs), "generate_s": gen_s,
                   "vocab": len(vocab_ids), "vocab_coverage": coverage, "settings": settings, "head_params": head.n_params(),
                   "val_conversations": len(val)})
    path = Path(out_dir or paths.DATA_DIR) / ("smollm2-mtp-quick.safetensors" if quick else "smollm2-mtp.safetensors")
    save_head(head, path, record={k: v for k, v in record.items() if k != "losses"} | {"final_loss": record["losses"][-1]})
    full = {"head": path.stem, "backbone": "smollm2-135m (frozen)", "record": record, "torch_version": torch.__version__,
            "threads": torch.get_num_threads()}
    path.with_suffix(".json").write_text(json.dumps(full, indent=1) + "\n")  # the record with the loss curve
    record["path"] = str(path)
    return record
