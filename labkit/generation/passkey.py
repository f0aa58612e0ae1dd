"""Passkey retrieval: can the model still find one number hidden in a long text, through a compressed cache?

The task of Mohtashami and Jaggi 2023 ("Landmark Attention", §4.2), used since to test long
context and KV compression: a long filler text, one sentence planting a random key somewhere
in it, and a question at the end asking for the key. Here:

- **Filler.** `"repeat"` (default): the neutral sentences of the original task repeated; they
  carry no information, so the key is the only thing worth keeping and the task measures
  whether a cache kept it, not whether a 135M model reads Shakespeare well. `"shakespeare"`:
  held-out Shakespeare (`data/shakespeare_val.txt`, from a seeded line), a harder, more
  natural haystack.
- **Key.** `digits` random digits (first one not 0), planted by `NEEDLE` (the key said twice)
  at a seeded random depth in [0.1, 0.9] of the filler.
- **Prompt.** Introduction, filler before, needle, filler after, question, in SmolLM2's chat
  template (`encode_prompt`); `length` counts the whole prompt in tokens, template included,
  to within a few tokens (the filler is cut in tokens, then the text is encoded once).
- **Score.** Greedy decoding of `max_new_tokens` tokens; correct when the first run of digits
  in the reply is the key (`score_answer`).

Everything is seeded: the same seed gives the same key, depth, filler and ids.

    >>> task = passkey_prompt(tok, 1024, seed=0)                                    # doctest: +SKIP
    >>> task["key"], task["depth"], len(task["ids"])                                # doctest: +SKIP
    ('86215', 0.41, 1024)
"""
from __future__ import annotations

import random
import re

import torch

from labkit import checks
from labkit.data import data_path
from labkit.generation.reply import encode_prompt
from labkit.kvcache.longcontext import feed

__all__ = ["FILLERS", "NEEDLE", "passkey_prompt", "score_answer", "key_kept", "passkey_trial", "passkey_accuracy"]

INTRO = ("There is an important piece of information hidden inside a lot of irrelevant text. "
         "Find it and memorize it. I will quiz you about it.\n\n")
REPEATED = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "\nThe pass key is {key}. Remember it. {key} is the pass key.\n"
QUESTION = "\n\nWhat is the pass key? Answer with the number only."
FILLERS = ("repeat", "shakespeare")


def _filler_text(kind: str, rng: random.Random, chars: int) -> str:
    if kind == "repeat":
        return REPEATED * (chars // len(REPEATED) + 1)
    lines = data_path("shakespeare_val.txt").read_text().splitlines(keepends=True)
    start = rng.randrange(len(lines) // 2)  # the second half leaves more than 8k tokens after any start
    text = "".join(lines[start:])
    return text[:chars]


def passkey_prompt(tok, length: int, seed: int = 0, digits: int = 5, filler: str = "repeat") -> dict:
    """One seeded passkey prompt of about `length` tokens (chat template included).

    Returns {ids, key (str), depth (the share of the filler before the needle, as drawn),
    key_index (token index of the key's first digit in ids), key_indices (every place the key stands: the needle
    says it twice), length (len(ids)), filler}.
    """
    checks.integer("length", length, 64, why="tokens in the prompt")
    checks.integer("digits", digits, 1, 12)
    if filler not in FILLERS:
        raise ValueError(f"filler must be one of {FILLERS}, got {filler!r}")
    rng = random.Random(seed)
    key = str(rng.randrange(10 ** (digits - 1), 10 ** digits))
    depth = round(rng.uniform(0.1, 0.9), 3)
    needle = NEEDLE.format(key=key)
    overhead = len(encode_prompt(tok, INTRO + needle + QUESTION, chat=True))
    n_fill = length - overhead
    if n_fill < 16:
        raise ValueError(f"length={length} leaves {n_fill} tokens of filler after the template, question and "
                         f"needle ({overhead} tokens); use length >= {overhead + 16}")
    pool = tok.encode(_filler_text(filler, rng, 8 * (n_fill + 64)))
    if len(pool) < n_fill + 64:
        raise ValueError(f"length={length} needs more filler than the {filler!r} text holds")
    ids = []
    for _ in range(4):  # cutting in tokens then encoding the text once can shift a few tokens: correct twice
        cut = round(depth * n_fill)
        before, after = tok.decode(pool[:cut]), tok.decode(pool[cut:n_fill])
        ids = encode_prompt(tok, INTRO + before + needle + after + QUESTION, chat=True)
        if len(ids) == length:
            break
        n_fill += length - len(ids)
    found = _find_all(ids, tok.encode(" " + key)[-digits:])
    return {"ids": ids, "key": key, "depth": depth, "key_index": found[0], "key_indices": found, "length": len(ids),
            "filler": filler}


def _find_all(ids: list[int], part: list[int]) -> list[int]:
    found = [i for i in range(len(ids) - len(part) + 1) if ids[i:i + len(part)] == part]
    if not found:
        raise RuntimeError("the key's tokens are not in the prompt (the tokenizer merged them with a neighbour)")
    return found


def score_answer(reply: str, key: str) -> bool:
    """Whether the first run of digits in `reply` is exactly `key` ("The pass key is 42817." for 42817: True)."""
    found = re.search(r"\d+", reply)
    return found is not None and found.group() == str(key)


def key_kept(cache, task: dict, per_digit: bool = False):
    """Share of (layer, KV head) pairs whose cache still holds every token of the key in at least one of the
    places the needle says it (`task["key_indices"]`, one token per digit), read after the prompt: 1.0 for a
    kind that keeps every token. `per_digit`: a list, the share of pairs holding each digit's token in either
    place."""
    n = len(task["key"])
    starts = task.get("key_indices") or [task["key_index"]]
    places = torch.tensor([[s + d for d in range(n)] for s in starts])  # [copies, digits]
    if not hasattr(cache, "kept_positions"):
        return [1.0] * n if per_digit else 1.0  # contiguous, paged, quantized: nothing is evicted
    if cache.kind == "sliding":
        kept = cache.kept_positions()
        hits = (kept[None, None, :] == places[..., None]).any(-1)[None]  # [1 pair, copies, digits]
    else:
        held = [cache.kept_positions(layer) for layer in range(cache.config.n_layers)]  # [B, Hkv, n] each
        hits = torch.cat([(h.reshape(-1, h.shape[-1])[:, None, None, :] == places[None, ..., None]).any(-1)
                          for h in held])  # [pairs, copies, digits]
    if per_digit:
        return [float(x) for x in hits.any(1).float().mean(0)]
    return float(hits.all(-1).any(-1).float().mean())


@torch.inference_mode()
def passkey_trial(model, tok, task: dict, cache="contiguous", options: dict | None = None, chunk: int = 256,
                  max_new_tokens: int = 16, one_pass: bool | None = None) -> dict:
    """Feed the prompt through a new `cache` kind (`labkit.kvcache.longcontext.feed`: chunks of `chunk`
    tokens, evicting between them; SnapKV's prompt in one pass; `one_pass` True or False for any kind),
    decode greedily, score the reply.

    Returns {reply, correct, bytes (the cache's `bytes_allocated()` after the prompt), key_kept (`key_kept`),
    key_kept_by_digit (the same per digit),
    peak_tokens (the most tokens per layer and KV head a prompt pass attended over)}.
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    window = model.config.max_seq_len
    if len(task["ids"]) + max_new_tokens - 1 > window:
        raise ValueError(f"task of {len(task['ids'])} prompt tokens leaves no room for max_new_tokens={max_new_tokens} "
                         f"in the context window of {window}: use a prompt of at most {window - max_new_tokens + 1} tokens")
    options = dict(options or {})
    options.setdefault("max_len", len(task["ids"]) + max_new_tokens)
    kv = model.new_cache(cache, **options)
    trace = {}
    logits = feed(model, task["ids"], kv, chunk, one_pass, trace)
    held, kept, digits = kv.bytes_allocated(), key_kept(kv, task), key_kept(kv, task, per_digit=True)
    out = []
    for i in range(max_new_tokens):
        token = int(logits.argmax())
        if token in getattr(tok, "stop_ids", ()) or token == getattr(tok, "eos_id", None):
            break
        out.append(token)
        if i + 1 < max_new_tokens:
            logits = model.step(torch.tensor([[token]]), cache=kv, last_only=True)[0, -1]
    reply = tok.decode(out)
    return {"reply": reply, "correct": score_answer(reply, task["key"]), "bytes": held, "key_kept": kept,
            "key_kept_by_digit": digits, "peak_tokens": trace["peak_tokens"]}


def passkey_accuracy(model, tok, length: int, trials: int = 5, cache="contiguous", options: dict | None = None,
                     seed: int = 0, filler: str = "repeat", chunk: int = 256, one_pass: bool | None = None) -> dict:
    """Share of `trials` seeded passkey prompts (seeds seed .. seed + trials − 1) answered right.

    Returns {accuracy, trials, correct, replies, key_kept (per trial), peak_tokens (the largest over trials)}.
    """
    if not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be a positive integer, got {trials!r}")
    results = [passkey_trial(model, tok, passkey_prompt(tok, length, seed + i, filler=filler), cache, options, chunk,
                             one_pass=one_pass) for i in range(trials)]
    correct = sum(r["correct"] for r in results)
    return {"accuracy": correct / trials, "trials": trials, "correct": correct, "replies": [r["reply"] for r in results],
            "key_kept": [r["key_kept"] for r in results], "peak_tokens": max(r["peak_tokens"] for r in results)}
