"""The lab's tokenizers by name: SmolLM2's and Gemma 3's (from their GGUF files) and the Shakespeare BPE (in `data/`)."""
from __future__ import annotations

from pathlib import Path

from labkit.data import paths
from labkit.tokenizer.bpe import BPETokenizer
from labkit.tokenizer.gguf import from_gguf
from labkit.tokenizer.spm import SentencePieceTokenizer

__all__ = ["get_tokenizer", "SHAKESPEARE_BPE", "NAMES"]

SHAKESPEARE_BPE = "shakespeare-bpe-4k.json"  # in data/: `labkit train-tokenizer` writes it
NAMES = ("smollm2", "gemma3", "shakespeare")


def get_tokenizer(name: str) -> BPETokenizer | SentencePieceTokenizer:
    """A tokenizer by name: 'smollm2' or 'gemma3' (from the model's GGUF file; Gemma 3's is SentencePiece-style),
    'shakespeare' (data/), or a JSON file's path."""
    if name == "smollm2":
        return from_gguf(paths.smollm2_gguf_path())
    if name == "gemma3":
        return from_gguf(paths.gemma3_gguf_path())
    if name == "shakespeare":
        return BPETokenizer.load(paths.data_path(SHAKESPEARE_BPE))
    if not isinstance(name, (str, Path)) or not Path(name).suffix:
        raise ValueError(f"tokenizer must be one of {', '.join(repr(n) for n in NAMES)} or a path to a .json file, "
                         f"got {name!r}")
    return BPETokenizer.load(name)
