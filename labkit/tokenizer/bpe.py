"""A byte-level BPE tokenizer: encode, decode, special tokens, streaming, save and load.

References: `openai/tiktoken` (the encoding rule: lowest rank of the concatenated
bytes, `labkit.tokenizer.encode`), `karpathy/minbpe` (the class layout and the
trainer it pairs with, `labkit.tokenizer.train`), GPT-2's byte<->unicode map for
writing tokens as text (`labkit.tokenizer.pretokenize`).

    >>> tok = BPETokenizer.train("the cat sat on the mat", 260, special_tokens=["<|endoftext|>"])
    >>> ids = tok.encode("the mat<|endoftext|>")
    >>> tok.decode(ids)
    'the mat<|endoftext|>'

Token ids are ranks: a token made by a later merge has a larger id. Encoding a
piece merges, again and again, the adjacent pair whose concatenation has the
lowest id; pieces already seen are served from a cache.
"""
from __future__ import annotations

import codecs
from pathlib import Path
from typing import Iterable, Sequence

import regex

from labkit.tokenizer import encode as bpe_encode
from labkit.tokenizer.pretokenize import bytes_to_token, compile_pattern, resolve_pattern

__all__ = ["BPETokenizer", "StreamDecoder"]

_CACHE_LIMIT = 200_000  # pieces kept in the encode cache


class BPETokenizer:
    """Byte-level BPE with a regex pre-tokenizer and special tokens.

    `tokens[i]` holds the bytes of token `i` (None for an id that is a special
    token or unused); ids must grow with merge order (the rank rule).
    `special_tokens` maps text such as '<|im_start|>' to its id.
    """

    def __init__(
        self,
        tokens: Sequence[bytes | None],
        pattern: str = "gpt4",
        special_tokens: dict[str, int] | None = None,
        *,
        merges: Sequence[tuple[int, int]] | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        chat_template: str | None = None,
        name: str = "bpe",
    ):
        self.pattern = resolve_pattern(pattern)
        self._regex = compile_pattern(self.pattern)
        self.special_tokens = dict(special_tokens or {})
        self.merges = [tuple(m) for m in merges] if merges is not None else None
        self.chat_template = chat_template
        self.name = name
        size = max([len(tokens)] + [i + 1 for i in self.special_tokens.values()])
        self._id_to_bytes: list[bytes | None] = list(tokens) + [None] * (size - len(tokens))
        self.ranks: dict[bytes, int] = {}
        for i, t in enumerate(tokens):
            if t is not None:
                self.ranks.setdefault(bytes(t), i)  # a duplicate keeps its first (lowest) rank
        for text, i in self.special_tokens.items():
            if self._id_to_bytes[i] is not None:
                raise ValueError(f"special token {text!r} has id {i}, which is already the token {self._id_to_bytes[i]!r}")
            self._id_to_bytes[i] = text.encode("utf-8")
        for role, text in (("bos_token", bos_token), ("eos_token", eos_token)):
            if text is not None and text not in self.special_tokens:
                raise ValueError(f"{role} {text!r} is not one of the special tokens {sorted(self.special_tokens)}")
        self.bos_token, self.eos_token = bos_token, eos_token
        self._special_ids = frozenset(self.special_tokens.values())
        self._special_regex = {}
        self._cache: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ sizes and ids
    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included (the model's embedding rows)."""
        return len(self._id_to_bytes)

    @property
    def bos_id(self) -> int | None:
        return None if self.bos_token is None else self.special_tokens[self.bos_token]

    @property
    def eos_id(self) -> int | None:
        return None if self.eos_token is None else self.special_tokens[self.eos_token]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token: tok.token_bytes(tok.encode(' the')[0]) -> b' the'."""
        return self.decode_bytes([token_id])

    def id_to_token(self, token_id: int) -> str:
        """A token written in the GPT-2 alphabet ('Ġthe'), or a special token's text."""
        for text, i in self.special_tokens.items():
            if i == token_id:
                return text
        return bytes_to_token(self.token_bytes(token_id))

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    # ------------------------------------------------------------------ encoding
    def encode(self, text: str, allowed_special: str | Iterable[str] = "all") -> list[int]:
        """Text -> token ids.

        `allowed_special` says which special-token texts become their special id:
        'all' (default), 'none' (encode them as ordinary text), 'none_raise'
        (raise ValueError if one occurs), or a set of special-token strings.

            >>> smol.encode("<|im_start|>user", allowed_special="all")     # doctest: +SKIP
            [1, 4093]
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        specials = self._allowed(allowed_special, text)
        if not specials:
            return self.encode_ordinary(text)
        ids: list[int] = []
        pattern = self._special_regex.get(specials)
        if pattern is None:
            alternatives = sorted(specials, key=len, reverse=True)  # the longest match first
            pattern = self._special_regex[specials] = regex.compile("(" + "|".join(regex.escape(s) for s in alternatives) + ")")
        for i, part in enumerate(pattern.split(text)):
            if i % 2:
                ids.append(self.special_tokens[part])
            elif part:
                ids.extend(self.encode_ordinary(part))
        return ids

    def encode_iterable(self, chunks: Iterable[str], allowed_special: str | Iterable[str] = "all"):
        """Encode chunks of one text (e.g. a file's lines) lazily, in bounded memory; yields the ids of `encode`."""
        from labkit.tokenizer.lazy import encode_iterable

        return encode_iterable(self, chunks, allowed_special)

    def _allowed(self, allowed_special, text: str) -> frozenset[str]:
        if allowed_special == "all":
            return frozenset(self.special_tokens)
        if allowed_special in ("none", "none_raise"):
            if allowed_special == "none_raise":
                found = sorted(s for s in self.special_tokens if s in text)
                if found:
                    raise ValueError(
                        f"text contains the special token(s) {found}; pass allowed_special='all' to encode them as "
                        "special tokens or allowed_special='none' to encode them as plain text"
                    )
            return frozenset()
        if isinstance(allowed_special, str):
            raise ValueError(f"allowed_special must be 'all', 'none', 'none_raise' or a set of special tokens, got {allowed_special!r}")
        allowed = frozenset(allowed_special)
        unknown = sorted(allowed - set(self.special_tokens))
        if unknown:
            raise ValueError(f"allowed_special names {unknown}, which are not special tokens of this tokenizer")
        return allowed

    def encode_piece(self, piece: str) -> list[int]:
        """The ids of one pre-tokenizer piece (merged as a whole, never split again), from the cache."""
        piece_ids = self._cache.get(piece)
        if piece_ids is None:
            piece_ids = self._encode_piece(piece)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[piece] = piece_ids
        return piece_ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Text -> ids, treating special-token text as ordinary text."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids: list[int] = []
        cache = self._cache
        for piece in self._regex.findall(text):  # `encode_piece`, inlined: this loop is the encoder's hot path
            piece_ids = cache.get(piece)
            if piece_ids is None:
                piece_ids = self.encode_piece(piece)
            ids.extend(piece_ids)
        return ids

    def _encode_piece(self, piece: str) -> list[int]:
        try:
            data = piece.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"text contains {piece[exc.start:exc.end]!r}, a lone surrogate with no UTF-8 encoding") from None
        try:
            return bpe_encode.encode_piece(data, self.ranks)
        except KeyError:
            # A byte with no token of its own (SmolLM2 has none for 21 of the 256 bytes,
            # e.g. b'\x04' and the lead bytes of planes 4-11) is dropped, as Hugging Face
            # `tokenizers` does for a vocabulary without an unknown token.
            kept = bytes(b for b in data if bytes([b]) in self.ranks)
            return bpe_encode.encode_piece(kept, self.ranks) if kept else []

    def split(self, text: str) -> list[str]:
        """The pre-tokenizer's pieces (merges never cross them)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._regex.findall(text)

    # ------------------------------------------------------------------ decoding
    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Ids -> the bytes they stand for (special tokens as their text)."""
        if hasattr(ids, "tolist"):  # numpy array, torch tensor
            ids = ids.tolist()
        if isinstance(ids, int):
            raise TypeError("ids must be a sequence of ints, got a single int; wrap it in a list")
        ids = list(ids)
        table = self._id_to_bytes
        try:
            if not ids or min(ids) >= 0:  # (a negative index would wrap around)
                return b"".join([table[i] for i in ids])
        except (IndexError, TypeError):
            pass
        bad = [i for i in ids if not isinstance(i, int) or not (0 <= i < len(table)) or table[i] is None]
        if any(not isinstance(i, int) for i in bad):
            raise TypeError(f"ids must be ints, got {[i for i in bad if not isinstance(i, int)][:5]}")
        raise ValueError(f"unknown token ids {sorted(set(bad))[:10]} (this tokenizer has ids 0..{len(table) - 1})")

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Ids -> text. Bytes that do not form valid UTF-8 on their own become U+FFFD.

        `skip_special_tokens=True` leaves out special tokens such as '<|im_end|>'.
        """
        if skip_special_tokens:
            ids = [i for i in (ids.tolist() if hasattr(ids, "tolist") else ids) if i not in self._special_ids]
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def stream_decoder(self) -> "StreamDecoder":
        """A decoder for one token at a time that never splits a UTF-8 character."""
        return StreamDecoder(self)

    # ------------------------------------------------------------------ training, chat, files
    @classmethod
    def train(
        cls,
        text: str,
        vocab_size: int,
        pattern: str = "gpt4",
        special_tokens: Sequence[str] = (),
        progress=False,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        method: str = "incremental",
    ) -> "BPETokenizer":
        """Train on `text` to `vocab_size` ids (256 bytes + merges + special tokens).

        `progress`: False, True (a tqdm bar) or a callable(done, total).
        `method`: 'incremental' (fast) or 'naive' (the textbook loop; same merges).
        """
        from labkit.tokenizer.train import train_tokenizer

        return train_tokenizer(cls, text, vocab_size, pattern, special_tokens, progress, bos_token, eos_token, method)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """A conversation in the tokenizer's chat format (ChatML for SmolLM2) as text; encode with `encode_chat`."""
        from labkit.tokenizer.chat_template import render

        return render(self, messages, add_generation_prompt)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """The ids of a conversation; special-token text inside messages stays text (no forged turns)."""
        from labkit.tokenizer.chat_template import encode_chat

        return encode_chat(self, messages, add_generation_prompt)

    def save(self, path) -> None:
        """Write the tokenizer as JSON (tokens in the GPT-2 alphabet, merges, specials)."""
        from labkit.tokenizer.io import save

        save(self, path)

    @classmethod
    def load(cls, path) -> "BPETokenizer":
        """Read a tokenizer written by `save`; a damaged file raises an error naming it."""
        from labkit.tokenizer.io import load

        return load(cls, path)

    def __repr__(self) -> str:
        return f"BPETokenizer(name={self.name!r}, vocab_size={self.vocab_size}, special_tokens={len(self.special_tokens)})"


class StreamDecoder:
    """Turns ids into text one at a time, holding back bytes of an incomplete UTF-8 character.

        >>> dec = tok.stream_decoder()                      # doctest: +SKIP
        >>> [dec.push(i) for i in tok.encode("héllo")] + [dec.flush()]   # doctest: +SKIP
        ['h', 'é', 'llo', '']

    A token may end in the middle of a multi-byte character (an emoji is four
    bytes, often two tokens); `push` returns '' until the character is complete.
    Bytes that can never become valid UTF-8 come out as U+FFFD, as in `decode`.
    """

    def __init__(self, tokenizer):  # any labkit tokenizer: it reads `decode_bytes` alone
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Add one id; return the text that is now complete."""
        return self._utf8.decode(self.tokenizer.decode_bytes([token_id]))

    def flush(self) -> str:
        """End of stream: return what is held back (an incomplete character becomes U+FFFD)."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
