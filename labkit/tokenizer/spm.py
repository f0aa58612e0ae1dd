"""A SentencePiece-style tokenizer as a GGUF file stores it (`tokenizer.ggml.model = "llama"`): Gemma 3's.

Byte-level BPE (`labkit.tokenizer.bpe`, SmolLM2's) ranks **merges**: the file lists pairs in the order
they were learned and encoding applies the earliest first. A SentencePiece BPE vocabulary has no merge
list; each piece has a **score** (in Gemma 3's file it falls piece by piece: a rank), and encoding merges,
among all adjacent pairs whose concatenation is a piece, the pair whose merged piece scores highest, again
and again: the priority belongs to the result, not to a learned pair. What
cannot be covered by a piece falls back to **bytes**: 256 pieces `<0x00>`…`<0xFF>`. There is no
pre-tokenizer regex: a space is an ordinary character, written `▁` (U+2581) inside pieces.

Encoding, as llama.cpp's `llm_tokenizer_spm` does it (the tests compare every id with llama.cpp's on a
corpus of whitespace runs, digits, emoji, CJK and invalid UTF-8):

1. user-defined pieces (Gemma's runs of newlines, spaces and tabs, its HTML tags) are cut out of the
   text first, as whole pieces, longest first; control pieces (`<bos>`, `<start_of_turn>`) only when
   `parse_special=True`;
2. in each remaining fragment spaces become `▁` (no space is prefixed: `add_space_prefix` is false for
   Gemma) and the fragment is split into UTF-8 characters (an invalid byte starts a character of the
   length its high bits announce);
3. the adjacent pair with the highest score whose concatenation is a piece is merged (ties: the leftmost),
   until no pair is a piece;
4. each symbol left is its piece's id, or its bytes' `<0xXX>` ids.

Decoding turns `▁` back into spaces, byte pieces into their bytes, and drops control pieces (unless
asked); the bytes are then read as UTF-8.

    >>> tok = SentencePieceTokenizer(["<unk>", "<s>", "</s>", "▁", "a", "b", "ab", "▁ab"],
    ...                              [0, 0, 0, -1, -2, -2, -1.5, -1], [2, 3, 3, 1, 1, 1, 1, 1], bos_id=1, eos_id=2)
    >>> tok.encode(" ab", add_bos=False)   # '▁' 'a' 'b': 'ab' (score -1.5) merges first, then '▁ab' (-1)
    [7]
    >>> tok.encode(" ab")                  # the file's add_bos_token: <bos> first (SmolLM2's BPE adds none)
    [1, 7]

The calls the rest of labkit makes on a tokenizer are the same on both (`labkit.tokenizer.bpe`'s names):
`encode(text, allowed_special=...)`, `encode_ordinary`, `decode(ids, skip_special_tokens=...)`,
`decode_bytes`, `token_bytes`, `stream_decoder()`, `id_to_token`, `is_special`, `vocab_size`, `bos_id`,
`eos_id`, `chat_template` and `encode_chat` (Gemma 3 270M's file is a base model: no template, and
`encode_chat` says so). Three defaults differ: `encode` puts `<bos>` first (the file asks for it), matches no
control piece typed in the text unless `allowed_special` says so (the BPE tokenizer matches all), and `decode`
leaves control pieces out unless `skip_special_tokens=False` (as llama.cpp's detokenizer does).
"""
from __future__ import annotations

import heapq
import re
from typing import Iterable

from labkit import checks

__all__ = ["SentencePieceTokenizer", "SPACE"]


SPACE = "\u2581"  # ▁, a space inside a piece
_SPACE_BYTES = SPACE.encode("utf-8")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # GGUF token types
_UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)  # by a lead byte's high 4 bits, as llama.cpp reads
# a fragment's words: a run of ▁ with the characters up to the next ▁, or the characters before the first ▁
_WORDS = re.compile(rb"(?:\xe2\x96\x81)+(?:[^\xe2]|\xe2(?!\x96\x81))*|(?:[^\xe2]|\xe2(?!\x96\x81))+")
_CACHE_LIMIT = 200_000  # words kept in the encode cache


def _space_after_text(piece: bytes) -> bool:
    """Whether `piece` holds a ▁ after a character that is not one (`▁▁a` does not, `a▁b` does)."""
    i = 0
    while piece.startswith(_SPACE_BYTES, i):
        i += len(_SPACE_BYTES)
    return _SPACE_BYTES in piece[i:]


class SentencePieceTokenizer:
    """Score-based BPE with byte fallback over `pieces` (str), `scores` and GGUF token `types`."""

    chat_template = None  # the files labkit reads with this tokenizer are base models (Gemma 3 270M)

    def __init__(self, pieces: list[str], scores, types, *, bos_id: int | None = None, eos_id: int | None = None,
                 add_bos: bool = True, name: str = "spm"):
        if not (len(pieces) == len(scores) == len(types)):
            raise ValueError(f"pieces, scores and types must have one entry per token, got {len(pieces)}, "
                             f"{len(scores)} and {len(types)}")
        self.pieces = list(pieces)
        self.scores = [float(s) for s in scores]
        self.types = [int(t) for t in types]
        self.name = name
        self.add_bos = checks.flag("add_bos", add_bos)
        for label, value in (("bos_id", bos_id), ("eos_id", eos_id)):
            checks.integer(label, value, 0, len(pieces) - 1, none_ok=True)
        self._bos, self._eos = bos_id, eos_id
        self._ids = {p.encode("utf-8"): i for i, p in enumerate(self.pieces) if self.types[i] != BYTE}
        self._byte_ids = {}
        for i, p in enumerate(self.pieces):
            if self.types[i] == BYTE:
                self._byte_ids[int(p[3:5], 16)] = i
        specials = [i for i, t in enumerate(self.types) if t in (CONTROL, USER_DEFINED, UNKNOWN)]
        specials.sort(key=lambda i: -len(self.pieces[i].encode("utf-8")))  # longest first, as llama.cpp sorts
        self._specials = [(self.pieces[i].encode("utf-8"), i, self.types[i]) for i in specials if self.pieces[i]]
        # a merge can cross the start of a ▁ run only into a piece that holds a ▁ after another character (a
        # bridge; Gemma 3's vocabulary has one, `>▁</`), and only where that piece's text occurs: a fragment without
        # one merges word by word, the same as whole, each word served from a cache once seen
        self._bridges = [p for p in self._ids if _space_after_text(p)]
        self._by_word = len(self._bridges) <= 64
        self._cache: dict[bytes, list[int]] = {}

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def eos_id(self) -> int | None:
        return self._eos

    # ---- encoding --------------------------------------------------------------------------

    def _partition(self, data: bytes, parse_special) -> list[bytes | int]:
        """Cut whole special pieces out of `data`: a list of raw fragments (bytes) and token ids (int).
        `parse_special`: True (every control piece), False (none) or a set of the control pieces' ids to match."""
        parts: list[bytes | int] = [data]
        for text, tid, kind in self._specials:
            wanted = parse_special if parse_special is True or parse_special is False else tid in parse_special
            if kind != USER_DEFINED and not wanted:
                continue
            out: list[bytes | int] = []
            for part in parts:
                if isinstance(part, int) or text not in part:
                    out.append(part)
                    continue
                start = 0
                while (hit := part.find(text, start)) >= 0:
                    if hit > start:
                        out.append(part[start:hit])
                    out.append(tid)
                    start = hit + len(text)
                if start < len(part):
                    out.append(part[start:])
            parts = out
        return parts

    def _fragment(self, data: bytes) -> list[int]:
        """One fragment's ids: word by word from the cache where no merge can cross a word's start (no bridge piece
        in the fragment, see `__init__`) and the fragment is valid UTF-8 (an invalid lead byte may announce a
        character that runs into a ▁), else merged whole."""
        data = data.replace(b" ", _SPACE_BYTES)
        if not self._by_word or any(bridge in data for bridge in self._bridges):
            return self._merge(data)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return self._merge(data)
        ids: list[int] = []
        cache = self._cache
        for word in _WORDS.findall(data):
            got = cache.get(word)
            if got is None:
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                got = cache[word] = self._merge(word)
            ids.extend(got)
        return ids

    def _merge(self, data: bytes) -> list[int]:
        """Score-based merging over the UTF-8 characters of `data` (spaces already ▁), then byte fallback."""
        starts, i = [], 0
        while i < len(data):
            starts.append(i)
            i += min(_UTF8_LEN[data[i] >> 4], len(data) - i)
        n = len(starts)
        ends = starts[1:] + [len(data)]
        syms = [[s, e, k - 1, k + 1 if k + 1 < n else -1] for k, (s, e) in enumerate(zip(starts, ends))]  # start, end, prev, next
        heap: list = []

        def bigram(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            text = data[syms[left][0]:syms[right][1]]
            tid = self._ids.get(text)
            if tid is not None:
                heapq.heappush(heap, (-self.scores[tid], left, right, len(text)))

        for k in range(1, n):
            bigram(k - 1, k)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            if a[1] == a[0] or b[1] == b[0] or (a[1] - a[0]) + (b[1] - b[0]) != size:
                continue  # stale: one side was merged into something else since
            a[1], b[1] = b[1], b[0]  # left takes right's bytes; right becomes empty
            a[3] = b[3]
            if b[3] >= 0:
                syms[b[3]][2] = left
            bigram(a[2], left)
            bigram(left, a[3])
        ids: list[int] = []
        k = 0 if n else -1
        while k >= 0:
            s, e, _, nxt = syms[k]
            tid = self._ids.get(data[s:e])
            ids.extend([tid] if tid is not None else [self._byte_ids[c] for c in data[s:e]])
            k = nxt
        return ids

    def encode(self, text: str | bytes, allowed_special=None, *, add_bos: bool | None = None,
               parse_special: bool = False) -> list[int]:
        """Token ids of `text` (str, or bytes: invalid UTF-8 is encoded byte by byte); `<bos>` first when
        `add_bos` (default: the file's `add_bos_token`). `parse_special`: match control pieces in the text.
        `allowed_special` (the BPE tokenizer's name for it): "all", "none", or the control pieces to match."""
        if allowed_special is not None:
            if parse_special:
                raise ValueError("give allowed_special or parse_special, not both")
            parse_special = self._allowed(allowed_special)
        else:
            checks.flag("parse_special", parse_special)
        if isinstance(text, str):
            data = text.encode("utf-8", errors="surrogatepass")
        elif isinstance(text, (bytes, bytearray)):
            data = bytes(text)
        else:
            raise TypeError(f"text must be a str or bytes, got {type(text).__name__}")
        add_bos = self.add_bos if add_bos is None else checks.flag("add_bos", add_bos)
        ids = [self._bos] if add_bos and self._bos is not None else []
        for part in self._partition(data, parse_special):
            ids.extend([part] if isinstance(part, int) else self._fragment(part))
        return ids

    def _allowed(self, allowed_special):
        """"all" -> True, "none" -> False, pieces -> the set of their ids (each must be a control piece)."""
        if allowed_special in ("all", "none"):
            return allowed_special == "all"
        if isinstance(allowed_special, str) or not hasattr(allowed_special, "__iter__"):
            raise ValueError(f"allowed_special must be 'all', 'none' or control pieces, got {allowed_special!r}")
        ids = {p.decode("utf-8"): i for p, i, kind in self._specials if kind == CONTROL}
        unknown = [p for p in allowed_special if p not in ids]
        if unknown:
            raise ValueError(f"allowed_special: {unknown[:5]} are not control pieces of this tokenizer")
        return {ids[p] for p in allowed_special}

    def encode_ordinary(self, text: str | bytes) -> list[int]:
        """`encode` with no control piece matched in the text (typed `<start_of_turn>` stays text); `<bos>` first
        as the file asks."""
        return self.encode(text, parse_special=False)

    def encode_chat(self, messages, add_generation_prompt: bool = True) -> list[int]:
        raise ValueError(f"{self.name} is a base model's tokenizer: it has no chat template; give a plain prompt "
                         f"(labkit.generate(..., chat=False), or the completions API)")

    def id_to_token(self, token_id: int) -> str:
        """The piece of `token_id` as the file stores it (`▁` for a space, `<0x0A>` for a byte)."""
        checks.integer("token_id", token_id, 0, self.vocab_size - 1)
        return self.pieces[token_id]

    def is_special(self, token_id: int) -> bool:
        """Whether `token_id` is a control piece (`<bos>`, `<eos>`, `<start_of_turn>`): never text."""
        checks.integer("token_id", token_id, 0, self.vocab_size - 1)
        return self.types[token_id] == CONTROL

    # ---- decoding --------------------------------------------------------------------------

    def token_bytes(self, token_id: int, special: bool = False) -> bytes:
        """The bytes token `token_id` stands for (a control piece: b"" unless `special`)."""
        checks.integer("token_id", token_id, 0, self.vocab_size - 1)
        kind, piece = self.types[token_id], self.pieces[token_id]
        if kind == BYTE:
            return bytes([int(piece[3:5], 16)])
        if kind == CONTROL:
            return piece.encode("utf-8") if special else b""
        if kind == UNKNOWN:
            return "\u2585".encode("utf-8")
        if kind == NORMAL:
            return piece.replace(SPACE, " ").encode("utf-8")
        return piece.encode("utf-8")

    def decode_bytes(self, ids: Iterable[int], special: bool = False) -> bytes:
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return b"".join(self.token_bytes(int(i), special) for i in ids)

    def decode(self, ids: Iterable[int], special: bool | None = None, *, skip_special_tokens: bool | None = None) -> str:
        """The text of `ids`; bytes that are not UTF-8 become U+FFFD. Control pieces are left out unless `special`
        (or `skip_special_tokens=False`, the BPE tokenizer's name)."""
        if special is not None and skip_special_tokens is not None:
            raise ValueError("give special or skip_special_tokens, not both")
        show = (not checks.flag("skip_special_tokens", skip_special_tokens)) if skip_special_tokens is not None \
            else bool(special)
        return self.decode_bytes(ids, show).decode("utf-8", errors="replace")

    def stream_decoder(self):
        """A decoder for one token at a time that never splits a UTF-8 character (`bpe.StreamDecoder`)."""
        from labkit.tokenizer.bpe import StreamDecoder

        return StreamDecoder(self)

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer({self.name!r}, {self.vocab_size} pieces)"
