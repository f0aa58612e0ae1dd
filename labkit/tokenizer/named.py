"""The lab's tokenizers by name: SmolLM2's (from its GGUF file) and the Shakespeare BPE (in `data/`)."""
from __future__ import annotations

from pathlib import Path

from labkit.data import paths
from labkit.tokenizer.bpe import BPETokenizer
from labkit.tokenizer.gguf import from_gguf

__all__ = ["get_tokenizer", "SHAKESPEARE_BPE"]

SHAKESPEARE_BPE = "shakespeare-bpe-4k.json"  # in data/: `labkit train-tokenizer` writes it


def get_tokenizer(name: str) -> BPETokenizer:
    """A tokenizer by name: 'smollm2' (from its GGUF file), 'shakespeare' (data/), or a JSON file's path."""
    if name == "smollm2":
        return from_gguf(paths.smollm2_gguf_path())
    if name == "shakespeare":
        return BPETokenizer.load(paths.data_path(SHAKESPEARE_BPE))
    if not isinstance(name, (str, Path)) or not Path(name).suffix:
        raise ValueError(f"tokenizer must be 'smollm2', 'shakespeare' or a path to a .json file, got {name!r}")
    return BPETokenizer.load(name)
