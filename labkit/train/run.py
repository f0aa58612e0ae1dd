"""Train one of the lab's models from scratch and write its checkpoint: `labkit train --model NAME`.

    >>> record = train_model("shakespeare-draft", quick=True, out_dir=tmp)    # doctest: +SKIP

The checkpoint is `<out_dir>/<name>.safetensors` (float16 weights, config and record in
the header, see `labkit.model.checkpoint`) with the same record, loss curves included,
in `<name>.json` beside it. The record's validation loss is measured on the weights as
stored, so loading the file gives exactly the recorded number.
"""
from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

from labkit.data import corpus, paths
from labkit.data.files import sha256
from labkit.metrics import bits_per_byte
from labkit.model.checkpoint import load_model, save_model
from labkit.model.transformer import Transformer
from labkit.tokenizer.named import SHAKESPEARE_BPE, get_tokenizer
from labkit.train.batches import encode_split, eval_windows
from labkit.train.loop import evaluate, init_weights, train
from labkit.train.recipes import recipe

__all__ = ["train_model", "checkpoint_path", "val_metrics"]


def checkpoint_path(name: str, out_dir: str | Path | None = None) -> Path:
    return Path(out_dir or paths.DATA_DIR) / f"{name}.safetensors"


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("labkit")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def val_metrics(model, tok, val_ids: torch.Tensor, seq_len: int, n_windows: int) -> dict:
    """Validation loss (nats per token) and bits per byte on the fixed held-out windows."""
    x, y = eval_windows(val_ids, seq_len, n_windows)
    nats = evaluate(model, x, y)
    n_bytes = sum(len(tok.token_bytes(int(i))) for i in y.reshape(-1))
    return {"val_loss": nats, "val_bits_per_byte": bits_per_byte(nats, tok, y), "val_tokens": y.numel(), "val_bytes": n_bytes}


def train_model(name: str, quick: bool = False, out_dir: str | Path | None = None, seed: int | None = None,
                distill: float | None = None, steps: int | None = None, progress: bool = True) -> dict:
    """Train `name` ('shakespeare', 'shakespeare-csa' or 'shakespeare-draft') and save it under `out_dir` (default data/).

    The draft is distilled from the target checkpoint in the same `out_dir`, which must
    exist (train the target first). `distill=0` trains the draft without distillation.
    """
    r = recipe(name, quick)
    changes = {k: v for k, v in {"seed": seed, "distill": distill, "steps": steps}.items() if v is not None}
    settings = r.settings.replace(**changes)
    tok = get_tokenizer("shakespeare")
    if tok.vocab_size != r.config.vocab_size:
        raise ValueError(f"the tokenizer has {tok.vocab_size} ids but {r.name} is built for {r.config.vocab_size}")
    train_text, val_text = corpus.load_text("train"), corpus.load_text("val")
    train_ids, val_ids = encode_split(tok, train_text), encode_split(tok, val_text)
    teacher = None
    if r.teacher is not None and settings.distill > 0:
        teacher_file = checkpoint_path(r.teacher, out_dir)
        if not teacher_file.exists():
            raise FileNotFoundError(f"{r.name} is distilled from {r.teacher}, whose checkpoint {teacher_file} is missing: "
                                    f"run `labkit train --model {r.teacher.replace('-quick', '')}"
                                    f"{' --quick' if quick else ''}` first")
        teacher, _ = load_model(teacher_file)
    torch.manual_seed(settings.seed)
    model = Transformer(r.config)
    init_weights(model, seed=settings.seed)
    record = train(model, settings, train_ids, val_ids, teacher=teacher, progress=progress)
    path = checkpoint_path(r.name, out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(model, path)
    stored, _ = load_model(path)  # measure what was stored (float16 weights), so loading reproduces it
    record.update(val_metrics(stored, tok, val_ids, settings.seq_len, settings.eval_windows))
    record.update({
        "model": r.name, "n_params": r.config.n_params(), "teacher": r.teacher if teacher is not None else None,
        "data": {"train_sha256": sha256(paths.data_path(corpus.SPLITS["train"])),
                 "val_sha256": sha256(paths.data_path(corpus.SPLITS["val"])),
                 "tokenizer_sha256": sha256(paths.data_path(SHAKESPEARE_BPE)),
                 "train_tokens": int(train_ids.numel()), "val_tokens": int(val_ids.numel())},
        "seed": settings.seed, "steps": settings.steps, "labkit_version": _version(),
        "torch_version": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
    })
    save_model(model, path, record=record)
    path.with_suffix(".json").write_text(json.dumps({"config": vars(r.config), "record": record}, indent=1) + "\n")
    return record
