"""A model in one file: its weights as safetensors (no pickle), its config and a record in the header.

The lab's own models (`data/shakespeare.safetensors`, `data/shakespeare-draft.safetensors`)
are stored this way: float16 weights (half the bytes of float32, and loading them back
into float32 is exact), the `ModelConfig` as JSON, and whatever record the writer passes
(the training run: data checksum, seed, steps, losses). Loading checks everything it can
and names the file and the mismatch: a wrong format, a missing or extra tensor, a shape
that does not match the config.

    >>> save_model(model, "tiny.safetensors", record={"steps": 10})     # doctest: +SKIP
    >>> model, header = load_model("tiny.safetensors")                   # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from labkit.data.headers import read_header as _read_header
from labkit.model.config import ModelConfig
from labkit.model.transformer import Transformer

__all__ = ["save_model", "load_model", "read_header", "FORMAT"]

FORMAT = "labkit.model/1"
STORE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def save_model(model: Transformer, path: str | Path, record: dict | None = None, dtype: str = "float16") -> Path:
    """Write `model` to `path` (one .safetensors file); `record` (JSON-able) goes in the header."""
    from safetensors.torch import save_file

    if dtype not in STORE_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(STORE_DTYPES)}, got {dtype!r}")
    header = {"format": FORMAT, "config": model.config.identity(), "dtype": dtype, "record": record or {}}
    tensors = {k: v.detach().to("cpu", STORE_DTYPES[dtype]).contiguous().clone() for k, v in model.state_dict().items()}
    path = Path(path)
    save_file(tensors, str(path), metadata={"labkit": json.dumps(header, sort_keys=True)})
    return path


def read_header(path: str | Path) -> dict:
    """The JSON header of a model file: format, config, stored dtype, record."""
    return _read_header(path, FORMAT, "labkit model file")


def _config(header: dict, path: Path) -> ModelConfig:
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    raw = header.get("config")
    if not isinstance(raw, dict) or set(raw) - fields:
        unknown = sorted(set(raw) - fields) if isinstance(raw, dict) else raw
        raise ValueError(f"{path}: the config in the header is not a ModelConfig (unknown fields: {unknown})")
    try:
        return ModelConfig(**raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: the config in the header is invalid: {exc}") from None


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> tuple[Transformer, dict]:
    """Read a model written by `save_model`: (model in eval mode, header). ValueError names any mismatch."""
    from safetensors import safe_open

    path = Path(path)
    header = read_header(path)
    model = Transformer(_config(header, path))
    expected = model.state_dict()
    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
        missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
        if missing or extra:
            raise ValueError(f"{path}: the weights do not match the config: missing {missing[:4]}, unexpected {extra[:4]}")
        state = {}
        for name in expected:
            t = f.get_tensor(name)
            if t.shape != expected[name].shape:
                raise ValueError(f"{path}: {name} has shape {tuple(t.shape)}, the config needs {tuple(expected[name].shape)}")
            state[name] = t.to(dtype)
    model.load_state_dict(state)
    model.to(dtype).eval().requires_grad_(False)
    if dtype == torch.float32:
        model.column_major_()  # the fast layout for one-token products (see Transformer.column_major_)
    return model, header
