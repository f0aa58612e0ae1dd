"""Training: the lab's own Shakespeare models, from scratch, reproducibly (`labkit train`).

`recipes` says what to train (shapes and settings), `batches` feeds token windows,
`loop` is the training loop (AdamW, cosine schedule, clipping, distillation), `run`
trains a named model and writes its checkpoint and record.
"""
from labkit.train.loop import evaluate, init_weights, loss_fn, lr_at, train
from labkit.train.recipes import RECIPES, Recipe, TrainSettings, recipe
from labkit.train.run import checkpoint_path, train_model, val_metrics

__all__ = ["train_model", "train", "TrainSettings", "Recipe", "RECIPES", "recipe", "evaluate", "init_weights",
           "loss_fn", "lr_at", "checkpoint_path", "val_metrics"]
