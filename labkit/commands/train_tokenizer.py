"""`labkit train-tokenizer`: train the byte-level BPE on the Shakespeare corpus (reproduces data/shakespeare-bpe-4k.json)."""
from __future__ import annotations


from labkit.measure.clock import now as clock_now


def add_parser(sub):
    p = sub.add_parser("train-tokenizer", help="train a byte-level BPE tokenizer (default: the lab's Shakespeare 4k)")
    p.add_argument("--input", metavar="FILE", help="text file to train on (default: the Shakespeare training split)")
    p.add_argument("--vocab-size", type=int, default=4096, help="ids in all: 256 bytes + merges + special tokens (default 4096)")
    p.add_argument("--pattern", default="gpt4", help="pre-tokenizer: gpt2, gpt4, smollm2 or a regex (default gpt4)")
    p.add_argument("--special", nargs="*", default=["<|endoftext|>"], metavar="TOKEN", help="special tokens (default <|endoftext|>)")
    p.add_argument("--method", choices=["incremental", "naive"], default="incremental")
    p.add_argument("--out", metavar="FILE", help="where to write the JSON (default data/shakespeare-bpe-4k.json)")
    return p


def run(args) -> int:
    from pathlib import Path

    from labkit.data import corpus
    from labkit.data import paths
    from labkit.tokenizer.named import SHAKESPEARE_BPE
    from labkit.tokenizer.bpe import BPETokenizer

    text = Path(args.input).read_text(encoding="utf-8") if args.input else corpus.load_text("train")
    eos = "<|endoftext|>" if "<|endoftext|>" in args.special else None
    start = clock_now()
    tok = BPETokenizer.train(
        text, args.vocab_size, pattern=args.pattern, special_tokens=args.special, progress=True, eos_token=eos, method=args.method
    )
    seconds = clock_now() - start
    out = Path(args.out) if args.out else paths.data_path(SHAKESPEARE_BPE)
    tok.name = out.stem
    tok.save(out)
    sample = text[:1_000_000]
    n_tokens = len(tok.encode(sample, allowed_special="none"))
    print(f"trained {len(tok.merges)} merges on {len(text.encode('utf-8')):,} bytes in {seconds:.1f} s ({args.method})")
    print(f"vocab_size {tok.vocab_size}; {len(sample.encode('utf-8')) / max(n_tokens, 1):.2f} bytes per token on the training text")
    print(f"wrote {out}")
    return 0
