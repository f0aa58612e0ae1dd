"""Drafting heads on file: `save_head` writes any head kind to safetensors, `load_head` reads it back.

    head, record = load_head("data/smollm2-zerocopy.safetensors", smol)   # the class comes from the file

The header holds the kind (`mtp`, `zero-copy`, `medusa`), the backbone's config and the training record;
the tensors are float16 weights and the `vocab_ids` the head drafts over. A file from before kinds
existed is an `mtp` head. `HEAD_FILES` names the heads `labkit train --model smollm2-heads` (and
`smollm2-mtp`) write to `data/`.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["save_head", "load_head", "head_from_file", "HEAD_FILES", "head_kind", "register_head", "HEAD_KINDS"]

HEAD_KINDS: dict[str, type] = {}  # kind -> head class, filled by `register_head` where each class is defined

HEAD_FILES = {"mtp": "smollm2-mtp.safetensors", "zero-copy": "smollm2-zerocopy.safetensors",
              "medusa": "smollm2-medusa.safetensors"}
_RECIPE = {"mtp": "smollm2-mtp", "zero-copy": "smollm2-heads", "medusa": "smollm2-heads"}


def register_head(kind: str):
    """Class decorator: files of `kind` hold heads of this class (its `file_meta()`, if any, goes in the header
    and back into its constructor as keyword arguments)."""
    def add(cls):
        HEAD_KINDS[kind] = cls
        return cls
    return add


def head_kind(head) -> str:
    for kind, cls in HEAD_KINDS.items():
        if type(head) is cls:
            return kind
    raise ValueError(f"head must be one of {[c.__name__ for c in HEAD_KINDS.values()]}, got {type(head).__name__}")


def save_head(head, path, record: dict | None = None) -> Path:
    """Write the head (float16 weights, its vocabulary, kind, config and record in the header) to safetensors."""
    from safetensors.torch import save_file

    path = Path(path)
    kind = head_kind(head)
    tensors = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in head.state_dict().items()}
    extra = head.file_meta() if hasattr(head, "file_meta") else {}
    meta = {"kind": kind, "config": json.dumps(vars(head.config) | {"n_layers": 1}), "record": json.dumps(record or {}),
            "options": json.dumps(extra)}
    save_file(tensors, str(path), metadata=meta)
    return path


def load_head(path, backbone) -> tuple:
    """Read a head saved by `save_head` for `backbone`: (head in the backbone's dtype, its training record).

    ValueError if the file is not a head or does not fit the backbone's shapes."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # safetensors' own error for a file that is not one
        raise ValueError(f"{path} is not a safetensors file holding a drafting head ({type(exc).__name__}: {exc})") from exc
    if "vocab_ids" not in tensors:
        raise ValueError(f"{path} holds no drafting head (no 'vocab_ids' tensor); heads are written by save_head")
    kind = meta.get("kind", "mtp")
    if kind not in HEAD_KINDS:
        raise ValueError(f"{path} holds a head of kind {kind!r}; labkit reads {sorted(HEAD_KINDS)}")
    head = HEAD_KINDS[kind](backbone.config, vocab_ids=tensors["vocab_ids"], **json.loads(meta.get("options", "{}")))
    own = head.state_dict()
    bad = [k for k in own if k not in tensors or own[k].shape != tensors[k].shape]
    if bad:
        raise ValueError(f"{path} does not fit this backbone (d_model {backbone.config.d_model}): mismatched {bad[:3]}")
    head.load_state_dict({k: v.to(own[k].dtype) for k, v in tensors.items()})
    return head.to(backbone.dtype).eval().requires_grad_(False), json.loads(meta.get("record", "{}"))


def head_from_file(target, kind: str, path=None):
    """The head of `kind` for `target` from `path` (default: the lab's trained one in data/), checked for its kind."""
    from labkit.data import paths

    if kind not in HEAD_FILES:
        raise ValueError(f"kind must be one of {sorted(HEAD_FILES)}, got {kind!r}")
    path = paths.data_path(HEAD_FILES[kind]) if path is None else path
    if not Path(path).exists():
        raise FileNotFoundError(f"no {kind} head at {path}: train one with `labkit train --model {_RECIPE[kind]}`")
    head, _ = load_head(path, target)
    if head_kind(head) != kind:
        raise ValueError(f"{path} holds a {head_kind(head)} head, not a {kind} head")
    return head
