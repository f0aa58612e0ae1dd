"""Before BPE: the GPT-2 byte<->unicode map and the regex pre-tokenizers.

References: `openai/gpt-2` `encoder.py::bytes_to_unicode` (the byte map), the
`tiktoken` patterns of `gpt2` and `cl100k_base` (the regexes), and the Hugging Face
`tokenizers` pre-tokenizers `Digits(individual_digits=True)` + `ByteLevel` (SmolLM2).

Byte-level BPE works on the UTF-8 bytes of a text, so it can encode any string
with a base vocabulary of only 256 tokens. Before merging, a regex cuts the text
into pieces ("words"), and merges never cross a piece boundary: " dog" and
" dog." share the token " dog" because "." is always its own piece.

    >>> split(GPT2_PATTERN, "I'm here, it's 12345!!")
    ['I', "'m", ' here', ',', ' it', "'s", ' 12345', '!!']
"""
from __future__ import annotations

import functools

import regex

__all__ = [
    "GPT2_PATTERN",
    "GPT4_PATTERN",
    "SMOLLM2_PATTERN",
    "PATTERNS",
    "bytes_to_unicode",
    "unicode_to_bytes",
    "token_to_bytes",
    "bytes_to_token",
    "resolve_pattern",
    "split",
]

# GPT-2 (tiktoken "gpt2"/"r50k_base", also the Hugging Face ByteLevel pre-tokenizer).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# GPT-4 (tiktoken "cl100k_base"): case-insensitive contractions, numbers in groups of
# at most three digits, newlines kept apart from other whitespace.
GPT4_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)

# SmolLM2 ("smollm" in GGUF): every number character is a piece of its own, then the
# GPT-2 regex runs on the text between them. Written as one regex: `\p{N}` comes
# first, ` ?\p{N}+` is gone, and the lookahead `(?!\S)` becomes `(?![^\s\p{N}])`,
# because for the GPT-2 regex running between digits, a digit is the end of the text.
SMOLLM2_PATTERN = r"""\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"""

PATTERNS = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN, "smollm2": SMOLLM2_PATTERN}


@functools.lru_cache(maxsize=None)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character (a bijection on 256 values).

    The 188 printable Latin-1 bytes map to themselves; the others (controls, space,
    and a few more) are shifted to U+0100 and up, so a token's bytes can be written
    as a visible string: a space is 'Ġ', a newline is 'Ċ'.

        >>> bytes_to_unicode()[32], bytes_to_unicode()[10], bytes_to_unicode()[ord('a')]
        ('Ġ', 'Ċ', 'a')
    """
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


@functools.lru_cache(maxsize=None)
def unicode_to_bytes() -> dict[str, int]:
    """The inverse of `bytes_to_unicode`: {'Ġ': 32, 'Ċ': 10, 'a': 97, ...}."""
    return {c: b for b, c in bytes_to_unicode().items()}


def token_to_bytes(token: str) -> bytes:
    """Bytes of a token written in the GPT-2 alphabet: 'Ġthe' -> b' the'.

    Raises ValueError if a character is outside the 256-character alphabet.
    """
    try:
        return token.translate(_decode_table()).encode("latin-1")
    except UnicodeEncodeError as exc:
        raise ValueError(f"token {token!r} has the character {token[exc.start]!r}, which is not in the GPT-2 byte alphabet") from None


@functools.lru_cache(maxsize=None)
def _decode_table() -> dict[int, str]:
    # str.translate table: alphabet character -> the Latin-1 character of its byte.
    # Latin-1 characters outside the alphabet (space, controls) become U+FFFF so that
    # the Latin-1 encode fails on them, as it does on anything above U+00FF.
    table = {c: "\uffff" for c in range(256)}
    table.update({ord(c): chr(b) for c, b in unicode_to_bytes().items()})
    return table


def bytes_to_token(data: bytes) -> str:
    """A token's bytes written in the GPT-2 alphabet: b' the' -> 'Ġthe'."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in data)


def resolve_pattern(pattern: str) -> str:
    """A pattern name ('gpt2', 'gpt4', 'smollm2') or a regex -> the regex."""
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str (a name in {sorted(PATTERNS)} or a regex), got {type(pattern).__name__}")
    return PATTERNS.get(pattern, pattern)


@functools.lru_cache(maxsize=32)
def compile_pattern(pattern: str) -> regex.Pattern:
    """The compiled regex for a pattern name or a regex string (cached)."""
    try:
        return regex.compile(resolve_pattern(pattern))
    except regex.error as exc:
        raise ValueError(f"pattern is not a valid regex: {exc}") from None


def split(pattern: str, text: str) -> list[str]:
    """Cut `text` into the pieces that BPE encodes separately.

        >>> split("smollm2", "in 1999 ")
        ['in', ' ', '1', '9', '9', '9', ' ']
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return compile_pattern(pattern).findall(text)
