"""A small pretraining loop for labkit's `Transformer`: AdamW, warm-up then cosine, clipping, distillation.

The recipe is the one nanoGPT and most small-LM papers use:

- weights N(0, 0.02), the two projections that write into the residual stream (`wo`,
  `w_down`) scaled by 1/√(2·n_layers) so the residual does not grow with depth (GPT-2);
- AdamW (β = 0.9, 0.95), weight decay on matrices only (not on norms);
- the learning rate rises linearly for `warmup` steps, then follows a cosine down to `min_lr`;
- gradients clipped to a global norm of `grad_clip`;
- every `eval_every` steps, the loss on fixed held-out windows.

Distillation (Hinton et al. 2015) trains a draft to imitate its target: the loss is
(1 − a)·CE(student, next tokens) + a·τ²·KL(p_teacher^τ ‖ p_student^τ) on the same batch, with
a = `distill` and τ = `temperature`. Matching the target's whole distribution, not just
the next token, is what raises the draft's acceptance rate in speculative decoding.

A model whose layers carry a loss of their own (`Transformer.auxiliary_loss`: the indexer of
compressed attention, `labkit.model.compressed`) adds it; the curve logs it as `index_kl`.

    >>> record = train(model, settings, train_ids, val_ids)          # doctest: +SKIP
    >>> record["val"][-1]  # {'step': ..., 'val_loss': ...}          # doctest: +SKIP
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from labkit.measure.clock import now as clock_now
from labkit.train.batches import Batches, eval_windows
from labkit.train.recipes import TrainSettings

__all__ = ["init_weights", "lr_at", "evaluate", "loss_fn", "train"]


def init_weights(model, seed: int = 0, std: float = 0.02) -> None:
    """GPT-2's initialisation, seeded: N(0, std) for matrices, residual projections scaled by 1/√(2L)."""
    g = torch.Generator().manual_seed(seed)
    scaled = std / math.sqrt(2 * model.config.n_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                p.fill_(1.0)  # RMSNorm gains
            else:
                s = scaled if name.endswith(("attn.wo.weight", "mlp.w_down.weight")) else std
                p.copy_(torch.randn(p.shape, generator=g) * s)


def lr_at(step: int, s: TrainSettings) -> float:
    """Learning rate at `step` (0-based): linear warm-up, then cosine from lr to min_lr at the last step."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    span = max(1, s.steps - 1 - s.warmup)
    progress = min(1.0, (step - s.warmup) / span)
    return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1 + math.cos(math.pi * progress))


def loss_fn(logits: torch.Tensor, targets: torch.Tensor, teacher_logits: torch.Tensor | None = None,
            distill: float = 0.0, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss to minimise, plain cross-entropy) for logits [B, T, V] and targets [B, T]."""
    V = logits.shape[-1]
    ce = F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1))
    if teacher_logits is None or distill == 0:
        return ce, ce
    t = temperature
    log_student = F.log_softmax(logits.reshape(-1, V).float() / t, dim=-1)
    log_teacher = F.log_softmax(teacher_logits.reshape(-1, V).float() / t, dim=-1)
    kl = F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean") * t * t
    return (1 - distill) * ce + distill * kl, ce


@torch.no_grad()
def evaluate(model, inputs: torch.Tensor, targets: torch.Tensor, batch: int = 8) -> float:
    """Mean next-token cross-entropy (nats per token) over the windows."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, inputs.shape[0], batch):
        logits = model(inputs[i:i + batch])
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets[i:i + batch].reshape(-1),
                                       reduction="sum"))
        count += targets[i:i + batch].numel()
    model.train(was_training)
    return total / count


def _optimizer(model, s: TrainSettings) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=s.lr, betas=s.betas, foreach=True)


def train(model, settings: TrainSettings, train_ids: torch.Tensor, val_ids: torch.Tensor, teacher=None,
          progress: bool = True, log_every: int = 10) -> dict:
    """Train `model` in place; return the record: loss curve, validation curve, tokens/s, wall time."""
    s = settings
    if teacher is not None and teacher.config.vocab_size != model.config.vocab_size:
        raise ValueError(f"the teacher's vocabulary ({teacher.config.vocab_size}) differs from the student's "
                         f"({model.config.vocab_size}): distillation needs the same token ids")
    if s.distill > 0 and teacher is None:
        raise ValueError(f"distill={s.distill} needs a teacher model")
    torch.manual_seed(s.seed)
    batches = Batches(train_ids, s.batch_size, s.seq_len, seed=s.seed)
    val_x, val_y = eval_windows(val_ids, s.seq_len, s.eval_windows)
    opt = _optimizer(model, s)
    model.train()
    curve, val = [], []
    bar = _bar(s.steps, progress)
    t_start = clock_now()
    tokens = 0
    for step in range(s.steps):
        lr = lr_at(step, s)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = batches.next()
        teacher_logits = None
        if teacher is not None and s.distill > 0:
            with torch.no_grad():
                teacher_logits = teacher(x)
        loss, ce = loss_fn(model(x), y, teacher_logits, s.distill, s.temperature)
        aux = model.auxiliary_loss()  # a compressed-attention model's indexer loss (trains the indexer alone)
        if aux is not None:
            loss = loss + aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip))
        opt.step()
        tokens += x.numel()
        elapsed = clock_now() - t_start
        if step % log_every == 0 or step == s.steps - 1:
            curve.append({"step": step, "lr": lr, "loss": float(loss.detach()), "ce": float(ce.detach()), "grad_norm": grad_norm,
                          "tokens_per_s": tokens / elapsed, **({"index_kl": float(aux.detach())} if aux is not None else {})})
        if (step + 1) % s.eval_every == 0 or step == s.steps - 1:
            val.append({"step": step, "val_loss": evaluate(model, val_x, val_y)})
        if bar is not None:
            bar.set_postfix(loss=f"{float(ce.detach()):.3f}", val=f"{val[-1]['val_loss']:.3f}" if val else "-",
                            tok_s=f"{tokens / elapsed:,.0f}")
            bar.update(1)
    if bar is not None:
        bar.close()
    model.eval()
    return {"settings": {k: v for k, v in vars(s).items()}, "curve": curve, "val": val, "tokens": tokens,
            "wall_s": clock_now() - t_start, "final_train_loss": curve[-1]["ce"], "final_val_loss": val[-1]["val_loss"]}


def _bar(total: int, progress: bool):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="training", unit="step")
