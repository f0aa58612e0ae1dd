"""The tokenizer inside a GGUF file (SmolLM2's): tokens, merges, token types, BOS/EOS, chat template.

References: the GGUF specification (`ggml-org/ggml` `docs/gguf.md`) for the header
layout; llama.cpp's `tokenizer.ggml.*` keys for a "gpt2" (byte-level BPE) vocabulary.

A GGUF file starts with its metadata: key/value pairs such as
`tokenizer.ggml.tokens` (49152 strings in GPT-2's byte alphabet, 'Ġthe') and
`tokenizer.ggml.merges` ('Ġ t', in merge order). Reading only that header takes a
fraction of a second; `gguf.GGUFReader` indexes all the tensors too, which takes
seconds, so `from_gguf(path)` parses the header itself (a test checks it against
`gguf.GGUFReader`) and keeps the result in memory, per file.

    >>> from labkit.data import paths
    >>> tok = from_gguf(paths.smollm2_gguf_path())
    >>> tok.vocab_size, tok.bos_id, tok.eos_id
    (49152, 1, 2)
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path

import numpy as np

from labkit.tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN, SMOLLM2_PATTERN, token_to_bytes
from labkit.tokenizer.bpe import BPETokenizer
from labkit.tokenizer.spm import SentencePieceTokenizer

__all__ = ["from_gguf", "read_metadata", "PRE_TOKENIZERS", "TOKEN_TYPES"]

# `tokenizer.ggml.pre` -> the pre-tokenizer regex (llama.cpp's names).
PRE_TOKENIZERS = {"smollm": SMOLLM2_PATTERN, "gpt-2": GPT2_PATTERN, "gpt2": GPT2_PATTERN, "llama-bpe": GPT4_PATTERN}
TOKEN_TYPES = {1: "normal", 2: "unknown", 3: "control", 4: "user_defined", 5: "unused", 6: "byte"}

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
_cache: dict[tuple, BPETokenizer] = {}


def read_metadata(path, prefixes: tuple[str, ...] = ("tokenizer.", "general.")) -> dict:
    """The metadata of a GGUF file (keys starting with one of `prefixes`) as Python values.

    Numeric arrays come back as numpy arrays, string arrays as lists of str.
    Raises ValueError naming the file if it is not a GGUF v2/v3 file or is cut short.
    """
    path = Path(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            return _parse(buf, prefixes)
        except (struct.error, ValueError, UnicodeDecodeError, KeyError) as exc:
            raise ValueError(f"{path}: not a readable GGUF file ({exc})") from None


def _parse(buf, prefixes) -> dict:
    if buf[:4] != b"GGUF":
        raise ValueError("the file does not start with the magic bytes 'GGUF'")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 or 3 are)")
    pos = 24
    unpack = struct.unpack_from

    def string(pos):
        (n,) = unpack("<Q", buf, pos)
        end = pos + 8 + n
        if end > len(buf):
            raise ValueError("a string runs past the end of the file")
        return buf[pos + 8 : end].decode("utf-8"), end

    def value(kind, pos, keep):
        if kind == _STRING:
            return string(pos)
        if kind in _SCALARS:
            fmt = _SCALARS[kind]
            return unpack(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
        if kind == _ARRAY:
            item, count = unpack("<IQ", buf, pos)
            pos += 12
            if item in _NUMPY:
                width = np.dtype(_NUMPY[item]).itemsize
                out = np.frombuffer(buf, dtype=_NUMPY[item], count=count, offset=pos).copy() if keep else None
                return out, pos + width * count
            items = []
            for _ in range(count):
                v, pos = value(item, pos, keep)
                items.append(v)
            return (items if keep else None), pos
        raise ValueError(f"unknown GGUF value type {kind}")

    meta = {}
    for _ in range(n_kv):
        key, pos = string(pos)
        (kind,) = unpack("<I", buf, pos)
        keep = key.startswith(prefixes)
        v, pos = value(kind, pos + 4, keep)
        if keep:
            meta[key] = v
    return meta


def _from_reader(reader) -> dict:
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith(("tokenizer.", "general.")):
            v = field.contents()
            meta[key] = np.asarray(v) if key == "tokenizer.ggml.token_type" else v
    return meta


def from_gguf(path_or_reader) -> BPETokenizer | SentencePieceTokenizer:
    """The tokenizer stored in a GGUF file, from its path or an open `gguf.GGUFReader`.

    `tokenizer.ggml.model` "gpt2" (SmolLM2): a byte-level BPE, control and user-defined tokens special;
    "llama" (Gemma 3): a SentencePiece-style tokenizer (`labkit.tokenizer.spm`). The ids stay those of
    the file. The result is cached per file (path, size and modification time).
    """
    if isinstance(path_or_reader, (str, Path)):
        path = Path(path_or_reader)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        reader = None
    elif hasattr(path_or_reader, "fields"):
        reader = path_or_reader
        path = Path(getattr(getattr(reader, "data", None), "filename", "<GGUFReader>"))
    else:
        raise TypeError(f"path_or_reader must be a path or a gguf.GGUFReader, got {type(path_or_reader).__name__}")
    key = (str(path.resolve()), *(_stamp(path)))
    if key in _cache:
        return _cache[key]
    meta = read_metadata(path) if reader is None else _from_reader(reader)
    try:
        tok = _build(meta)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{path}: the tokenizer metadata is not usable ({exc})") from None
    if key[1] is not None:
        _cache[key] = tok
    return tok


def _stamp(path: Path) -> tuple:
    try:
        st = path.stat()
        return st.st_size, st.st_mtime_ns
    except OSError:
        return None, None


def _build(meta: dict) -> BPETokenizer | SentencePieceTokenizer:
    model = meta.get("tokenizer.ggml.model")
    if model == "llama":
        return _build_spm(meta)
    if model != "gpt2":
        raise ValueError(f"tokenizer.ggml.model is {model!r}; supported: 'gpt2' (byte-level BPE) and 'llama' "
                         f"(SentencePiece-style)")
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"pre-tokenizer {pre!r} is not supported; known: {sorted(PRE_TOKENIZERS)}")
    texts = meta["tokenizer.ggml.tokens"]
    types = np.asarray(meta.get("tokenizer.ggml.token_type", np.ones(len(texts), dtype=np.int32)))
    if len(types) != len(texts):
        raise ValueError(f"{len(texts)} tokens but {len(types)} token types")
    tokens: list[bytes | None] = []
    specials: dict[str, int] = {}
    for i, (text, kind) in enumerate(zip(texts, types.tolist())):
        if kind in (3, 4):  # control, user-defined: matched as whole strings, never merged
            specials[text] = i
            tokens.append(None)
        else:
            tokens.append(token_to_bytes(text))
    ids = {t: i for i, t in enumerate(texts)}
    merges = []
    last = -1
    for m in meta.get("tokenizer.ggml.merges", []):
        a, b = m.split(" ")
        pair = (ids[a], ids[b])
        made = ids[a + b]
        # The rank rule needs ids in merge order (true for GPT-2 and SmolLM2).
        if made <= last:
            raise ValueError(f"merge {m!r} makes token {made}, but an earlier merge made {last}: ids are not in merge order")
        last = made
        merges.append(pair)

    def special(key):
        i = meta.get(key)
        if i is None:
            return None
        text = texts[int(i)]
        if text not in specials:
            raise ValueError(f"{key} = {int(i)} ({text!r}) is not a control token")
        return text

    name = "-".join(str(meta[k]) for k in ("general.basename", "general.size_label") if k in meta) or "gguf"
    return BPETokenizer(
        tokens,
        PRE_TOKENIZERS[pre],
        specials,
        merges=merges,
        bos_token=special("tokenizer.ggml.bos_token_id"),
        eos_token=special("tokenizer.ggml.eos_token_id"),
        chat_template=meta.get("tokenizer.chat_template"),
        name=name.lower(),
    )


def _build_spm(meta: dict) -> SentencePieceTokenizer:
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        raise ValueError("tokenizer.ggml.add_space_prefix is true (or absent): labkit's SentencePiece-style tokenizer "
                         "implements the files that set it false (Gemma 3), not the prefixed space")
    texts = meta["tokenizer.ggml.tokens"]
    name = "-".join(str(meta[k]) for k in ("general.basename", "general.size_label") if k in meta) or "gguf"
    return SentencePieceTokenizer(
        texts, meta["tokenizer.ggml.scores"], meta["tokenizer.ggml.token_type"],
        bos_id=meta.get("tokenizer.ggml.bos_token_id"), eos_id=meta.get("tokenizer.ggml.eos_token_id"),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", True)), name=name.lower())
