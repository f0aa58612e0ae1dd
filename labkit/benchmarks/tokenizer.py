"""BPE training and encoding speed, next to the naive trainer, tiktoken and Hugging Face `tokenizers`."""
from __future__ import annotations


TITLE = "BPE training (incremental vs naive) and encoding speed (vs tiktoken)"


def _once(fn):
    from labkit import measure

    with measure.timer() as t:
        out = fn()
    return t.seconds, out


def run(quick: bool = False) -> dict:
    from labkit.data import corpus
    from labkit.tokenizer import gguf as gguf_tokenizer
    from labkit.data import paths
    from labkit import measure
    from labkit.tokenizer.bpe import BPETokenizer
    from labkit.tokenizer.gguf import from_gguf

    results: dict = {}
    train_text, val_text = corpus.load_text("train"), corpus.load_text("val")

    # 1. The lab's tokenizer: the whole training split to 4096 ids.
    seconds, tok = _once(lambda: BPETokenizer.train(train_text, 4096, special_tokens=["<|endoftext|>"]))
    mb = len(train_text.encode("utf-8")) / 1e6
    print(f"  train Shakespeare ({mb:.1f} MB) -> 4096 vocab, incremental: {seconds:8.2f} s")
    results["train_4k_s"] = seconds
    results["train_mb"] = mb

    # 2. Naive vs incremental on a slice the naive loop can finish.
    size, vocab = (10_000, 256 + 100) if quick else (30_000, 256 + 200)
    piece = train_text[:size]
    naive_s, naive = _once(lambda: BPETokenizer.train(piece, vocab, method="naive"))
    fast_s, fast = _once(lambda: BPETokenizer.train(piece, vocab))
    assert naive.merges == fast.merges, "the trainers disagree"
    print(f"  slice {size // 1000} kB -> {vocab} vocab: naive {naive_s:8.2f} s   incremental {fast_s:8.3f} s"
          f"   ({naive_s / fast_s:.0f}x, same merges)")
    results.update(slice_bytes=size, slice_vocab=vocab, naive_s=naive_s, incremental_s=fast_s)

    # 3. Encoding the validation plays: labkit (cold cache, warm cache) vs tiktoken with the same ranks.
    repeat = 2 if quick else 5
    n_tokens = len(tok.encode(val_text))
    tok._cache.clear()
    cold_s, _ = _once(lambda: tok.encode(val_text))
    timings = {"labkit": lambda: tok.encode(val_text)}
    try:
        import tiktoken

        enc = tiktoken.Encoding("labkit-bench", pat_str=tok.pattern, mergeable_ranks=tok.ranks, special_tokens=tok.special_tokens)
        timings["tiktoken"] = lambda: enc.encode_ordinary(val_text)
    except ImportError:
        print("  (tiktoken not installed: no peer)")
    encode_run = measure.run(timings, rounds=repeat)
    medians = encode_run.medians()
    results["encode_timings"] = encode_run.as_dict()
    print(f"  encode {len(val_text.encode('utf-8')) / 1e6:.2f} MB -> {n_tokens:,} tokens:")
    print(f"    {'labkit, cold cache':20s} {n_tokens / cold_s:12,.0f} tokens/s")
    for name, s in medians.items():
        label = f"{name}, {'warm cache' if name == 'labkit' else 'same ranks'}"
        print(f"    {label:20s} {n_tokens / s:12,.0f} tokens/s")
    results["encode_tokens"] = n_tokens
    results["encode_cold_tokens_per_s"] = n_tokens / cold_s
    results.update({f"encode_{k}_tokens_per_s": n_tokens / s for k, s in medians.items()})
    if "tiktoken" in medians:
        print(f"    tiktoken / labkit (warm): {medians['labkit'] / medians['tiktoken']:.1f}x")

    # 4. SmolLM2: loading the tokenizer from the GGUF file, and a ~200-token chat prompt.
    try:
        path = paths.smollm2_gguf_path()
    except FileNotFoundError as exc:
        print(f"  (SmolLM2 skipped: {exc})")
        return results
    gguf_tokenizer._cache.clear()
    load_s, smol = _once(lambda: from_gguf(path))
    question = " ".join(val_text.split()[:60])
    messages = [{"role": "user", "content": question}]
    ids = smol.encode_chat(messages)
    smol._cache.clear()
    first_s, _ = _once(lambda: smol.encode_chat(messages))
    warm = measure.run({"warm": lambda: smol.encode_chat(messages)}, rounds=repeat * 4)["warm"]
    warm_s = warm.median
    results["smollm2_prompt_warm_timing"] = warm.as_dict()
    print(f"  SmolLM2 tokenizer from GGUF: {load_s * 1e3:8.0f} ms")
    print(f"  SmolLM2 chat prompt of {len(ids)} tokens: {first_s * 1e3:.2f} ms cold, {warm_s * 1e3:.2f} ms warm")
    results.update(smollm2_load_s=load_s, smollm2_prompt_tokens=len(ids), smollm2_prompt_cold_s=first_s, smollm2_prompt_warm_s=warm_s)
    results["gemma3_vs_smollm2"] = _two_tokenizers(smol, val_text[: 50_000 if quick else 200_000], repeat)
    return results


def _two_tokenizers(smol, text: str, rounds: int) -> dict:
    """Gemma 3's SentencePiece-style tokenizer beside SmolLM2's byte-level BPE on the same text, interleaved.

    Equal conditions: both tokenizers' caches (the BPE's pieces, the SentencePiece tokenizer's words) are emptied
    before each call (untimed); then Gemma's again with its cache warm from the text (the lab's target: 1 M
    tokens/s on held-out text)."""
    from labkit import measure
    from labkit.data import paths
    from labkit.tokenizer.gguf import from_gguf

    try:
        gemma = from_gguf(paths.gemma3_gguf_path())
    except FileNotFoundError as exc:
        print(f"  (Gemma 3 skipped: {exc})")
        return {"skipped": str(exc)}
    fns = {"smollm2 bpe": lambda: smol.encode_ordinary(text), "gemma3 spm": lambda: gemma.encode(text, add_bos=False)}
    counts = {name: len(fn()) for name, fn in fns.items()}
    run = measure.run(fns, rounds=rounds, setup=lambda name: (smol if name == "smollm2 bpe" else gemma)._cache.clear())
    words, size = len(text.split()), len(text.encode("utf-8"))
    out = {"text_bytes": size, "words": words, "timings": run.as_dict()}
    print(f"  {size / 1e3:.0f} kB of held-out Shakespeare ({words:,} words), BPE cache emptied before each call:")
    for name, timing in run.timings.items():
        n = counts[name]
        out[name] = {"tokens": n, "tokens_per_word": n / words, "tokens_per_s": n / timing.median,
                     "bytes_per_s": size / timing.median}
        print(f"    {name:12s} vocab {(smol if 'bpe' in name else gemma).vocab_size:7,}: {n:7,} tokens "
              f"({n / words:.2f} per word), {n / timing.median:10,.0f} tokens/s, {size / timing.median / 1e6:.2f} MB/s "
              f"(IQR {timing.iqr / timing.median:.0%} of the median)")
    gemma.encode(text, add_bos=False)  # the word cache warm from this text
    warm = measure.run({"warm": lambda: gemma.encode(text, add_bos=False)}, rounds=rounds)["warm"]
    n = counts["gemma3 spm"]
    out["gemma3 spm"]["warm_tokens_per_s"] = n / warm.median
    print(f"    {'gemma3 spm, word cache warm':27s}: {n / warm.median:10,.0f} tokens/s "
          f"(IQR {warm.iqr / warm.median:.0%} of the median)")
    return out
