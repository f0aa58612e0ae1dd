"""What to train: the lab's Shakespeare models, their shapes and their training settings.

Both share `data/shakespeare-bpe-4k.json` (4096 ids). The target is a few-M-parameter
Llama; the draft is a much smaller one distilled from it (see `labkit.train.loop`). The
sizes are chosen for the chapters that use them: a target decode step reads enough
weights to be memory-bound and costs about ten draft steps; the target's 6 query heads
and 2 KV heads both divide by 2, so the serving chapter can split it over two processes.
`shakespeare-csa` is the target with compressed sparse attention (`labkit.model.compressed`),
trained with the target's settings on the same tokens: the KV-cache chapter compares the two.
`--quick` recipes are tiny versions that train in about a minute (the tests use them).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labkit import checks
from labkit.model.config import ModelConfig

__all__ = ["TrainSettings", "Recipe", "RECIPES", "recipe"]


@dataclass(frozen=True)
class TrainSettings:
    """Hyper-parameters of one training run (AdamW, cosine schedule with linear warm-up)."""

    steps: int = 1000
    batch_size: int = 32
    seq_len: int = 256
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 50
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 100
    eval_windows: int = 32  # validation windows of seq_len tokens (the same ones every time)
    distill: float = 0.0  # weight of KL(teacher || student) in the loss; 0 = plain next-token loss
    temperature: float = 1.0  # of the teacher and student distributions in the KL term

    def __post_init__(self):
        for name in ("steps", "batch_size", "seq_len", "warmup", "eval_every", "eval_windows"):
            checks.integer(name, getattr(self, name), 0 if name == "warmup" else 1)
        if not 0 < self.min_lr <= self.lr:
            raise ValueError(f"need 0 < min_lr <= lr, got min_lr={self.min_lr}, lr={self.lr}")
        if not 0 <= self.distill <= 1:
            raise ValueError(f"distill must be in [0, 1], got {self.distill}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0, got {self.grad_clip}")

    def replace(self, **changes) -> "TrainSettings":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Recipe:
    """A model to train: its config, its settings, and the teacher it is distilled from (if any)."""

    name: str
    config: ModelConfig
    settings: TrainSettings
    teacher: str | None = None
    description: str = ""


def _recipes() -> dict[str, Recipe]:
    target = ModelConfig.from_name("shakespeare")
    draft = ModelConfig.from_name("shakespeare-draft")
    target_settings = TrainSettings(steps=800, batch_size=24, seq_len=256, warmup=40, lr=2e-3, min_lr=2e-4)
    quick = dict(steps=60, batch_size=8, seq_len=64, warmup=6, eval_every=20, eval_windows=8, lr=3e-3, min_lr=3e-4)
    return {
        "shakespeare": Recipe("shakespeare", target, target_settings, description="the lab's Shakespeare target"),
        "shakespeare-csa": Recipe("shakespeare-csa", ModelConfig.from_name("shakespeare-csa"), target_settings,
                                  description="the target with compressed sparse attention, same parameters and budget"),
        "shakespeare-draft": Recipe("shakespeare-draft", draft,
                                    TrainSettings(steps=600, batch_size=24, seq_len=256, warmup=30, distill=0.5),
                                    teacher="shakespeare", description="its draft, distilled from the target"),
        "shakespeare-quick": Recipe("shakespeare-quick", target.replace(name="shakespeare-quick", d_model=64, n_layers=2,
                                                                        n_heads=4, n_kv_heads=2, ffn_dim=128),
                                    TrainSettings(**quick), description="a tiny target, for tests"),
        "shakespeare-csa-quick": Recipe("shakespeare-csa-quick", target.replace(
            name="shakespeare-csa-quick", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, csa_block=4,
            csa_topk=4, csa_window=16, csa_index_heads=2, csa_index_dim=8), TrainSettings(**quick),
            description="a tiny compressed-attention target, for tests"),
        "shakespeare-draft-quick": Recipe("shakespeare-draft-quick", draft.replace(name="shakespeare-draft-quick", d_model=32,
                                                                                   n_layers=1, n_heads=2, n_kv_heads=1,
                                                                                   ffn_dim=64),
                                          TrainSettings(**quick, distill=0.5), teacher="shakespeare-quick",
                                          description="a tiny draft, for tests"),
    }


RECIPES = _recipes()


def recipe(name: str, quick: bool = False) -> Recipe:
    """The recipe for `name` ('shakespeare', 'shakespeare-csa' or 'shakespeare-draft'); `quick`: its tiny version."""
    full = [n for n in RECIPES if not n.endswith("-quick")]
    if name not in full:
        raise ValueError(f"unknown model {name!r} to train; known: {', '.join(full)}")
    return RECIPES[f"{name}-quick" if quick else name]
