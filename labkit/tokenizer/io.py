"""Saving and loading a `BPETokenizer` as JSON.

The file is readable: tokens are written in GPT-2's byte alphabet ('Ġthe' is
b' the'), merges as 'Ġ t' strings like Hugging Face's tokenizer.json, and the
pre-tokenizer as its regex. Loading checks the file and raises an error that
names it when something is wrong.

    {"format": "labkit-bpe", "version": 1, "pattern": "...", "tokens": ["!", ..., null],
     "merges": ["Ġ t", ...], "special_tokens": {"<|endoftext|>": 4095}, "eos_token": "<|endoftext|>", ...}
"""
from __future__ import annotations

import json
from pathlib import Path

from labkit.tokenizer.pretokenize import bytes_to_token, token_to_bytes

__all__ = ["save", "load", "to_dict", "from_dict"]

FORMAT, VERSION = "labkit-bpe", 1


def to_dict(tok) -> dict:
    """The JSON-ready description of a tokenizer."""
    special_ids = set(tok.special_tokens.values())
    tokens = [None if (i in special_ids or b is None) else bytes_to_token(b) for i, b in enumerate(tok._id_to_bytes)]
    merges = None
    if tok.merges is not None:
        merges = [f"{tokens[a]} {tokens[b]}" for a, b in tok.merges]
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": tok.name,
        "pattern": tok.pattern,
        "tokens": tokens,
        "merges": merges,
        "special_tokens": tok.special_tokens,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "chat_template": tok.chat_template,
    }


def from_dict(cls, data: dict):
    """Rebuild a tokenizer from `to_dict` output; raises ValueError saying what is wrong."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT!r} file (its 'format' is {data.get('format') if isinstance(data, dict) else None!r})")
    if data.get("version") != VERSION:
        raise ValueError(f"version {data.get('version')!r} is not supported (only {VERSION})")
    texts = data["tokens"]
    if not isinstance(texts, list) or not all(t is None or isinstance(t, str) for t in texts):
        raise ValueError("'tokens' must be a list of strings or nulls")
    tokens = [None if t is None else token_to_bytes(t) for t in texts]
    ids = {t: i for i, t in enumerate(texts) if t is not None}
    merges = None
    if data.get("merges") is not None:
        merges = []
        for m in data["merges"]:
            a, b = m.split(" ")
            if a not in ids or b not in ids or a + b not in ids:
                raise ValueError(f"merge {m!r} uses or makes a token that is not in 'tokens'")
            if not ids[a + b] > max(ids[a], ids[b]):
                raise ValueError(f"merge {m!r} makes id {ids[a + b]}, not after its parts {ids[a]}, {ids[b]}")
            merges.append((ids[a], ids[b]))
    specials = data.get("special_tokens") or {}
    if not all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in specials.items()):
        raise ValueError("'special_tokens' must map strings to non-negative ids")
    return cls(
        tokens,
        data["pattern"],
        specials,
        merges=merges,
        bos_token=data.get("bos_token"),
        eos_token=data.get("eos_token"),
        chat_template=data.get("chat_template"),
        name=data.get("name", "bpe"),
    )


def save(tok, path) -> None:
    """Write `tok` to `path` as JSON (UTF-8)."""
    Path(path).write_text(json.dumps(to_dict(tok), ensure_ascii=False, indent=0) + "\n", encoding="utf-8")


def load(cls, path):
    """Read a tokenizer file; errors name the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"tokenizer file not found: {path}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a tokenizer file (invalid JSON: {exc})") from None
    try:
        return from_dict(cls, data)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{path}: not a valid tokenizer file ({detail})") from None
