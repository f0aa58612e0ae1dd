"""`labkit tokenize`: show how a tokenizer cuts a text (ids, tokens, count)."""
from __future__ import annotations

import sys


def add_parser(sub):
    p = sub.add_parser("tokenize", help="show the tokens of a text (SmolLM2's tokenizer by default)")
    p.add_argument("text", nargs="?", help="the text (default: read standard input)")
    p.add_argument("--tokenizer", default="smollm2", help="smollm2, gemma3 (SentencePiece-style, <bos> first), "
                   "shakespeare or a tokenizer .json file")
    p.add_argument("--ids", action="store_true", help="print only the ids")
    p.add_argument("--plain", action="store_true", help="encode special-token text as plain text")
    return p


def run(args) -> int:
    from labkit.tokenizer.named import get_tokenizer
    from labkit.tokenizer.spm import SentencePieceTokenizer

    tok = get_tokenizer(args.tokenizer)
    text = sys.stdin.read() if args.text is None else args.text
    ids = tok.encode(text, allowed_special="none" if args.plain else "all")
    if args.ids:
        print(" ".join(map(str, ids)))
        return 0
    spm = isinstance(tok, SentencePieceTokenizer)  # its control pieces (<bos>) shown as text, as BPE's specials are
    for i in ids:
        print(f"{i:>7}  {(tok.decode_bytes([i], special=True) if spm else tok.decode_bytes([i]))!r}")
    n_bytes = len(text.encode("utf-8"))
    print(f"{len(ids)} tokens for {len(text)} characters ({n_bytes} bytes): {n_bytes / max(len(ids), 1):.2f} bytes per token")
    return 0
