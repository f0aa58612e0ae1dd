"""The JSON header that labkit writes into its safetensors files (saved states, model checkpoints).

safetensors stores a string-to-string metadata map next to the tensors; labkit keeps one
entry, "labkit", holding a JSON object whose "format" names what the file is. Reading it
back checks each step and says, naming the file, what a file that is not the expected
kind is instead.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["read_header"]


def read_header(path: str | Path, fmt: str, what: str) -> dict:
    """The "labkit" JSON header of `path`, checked to have format `fmt` (`what` names the kind, for errors)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {what} at {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as exc:  # safetensors raises its own SafetensorError for a bad header
        raise ValueError(f"{path} is not a {what} (not a safetensors file: {exc})") from None
    if "labkit" not in meta:
        raise ValueError(f"{path} is not a {what} (no 'labkit' header)")
    try:
        header = json.loads(meta["labkit"])
    except json.JSONDecodeError:
        raise ValueError(f"{path} is not a {what} (its 'labkit' header is not JSON)") from None
    found = header.get("format") if isinstance(header, dict) else header
    if found != fmt:
        raise ValueError(f"{path}: unknown format {found!r}, expected {fmt!r} (a {what})")
    return header
