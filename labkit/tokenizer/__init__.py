"""Text: a byte-level BPE tokenizer (encode, decode, train), its pre-tokenizers, GGUF vocabularies, chat templates.

`bpe.py` is the tokenizer itself; `train.py` learns merges, `encode.py` applies them,
`pretokenize.py` splits text first, `gguf.py` reads a model file's vocabulary, `io.py`
saves and loads, `named.py` finds the lab's tokenizers by name.
"""
from labkit.tokenizer.bpe import BPETokenizer, StreamDecoder
from labkit.tokenizer.gguf import from_gguf
from labkit.tokenizer.named import SHAKESPEARE_BPE, get_tokenizer

__all__ = ["BPETokenizer", "StreamDecoder", "from_gguf", "get_tokenizer", "SHAKESPEARE_BPE"]
