"""From generated token ids to the text a client sees: incremental, UTF-8 safe, cut at stop strings.

A token can end in the middle of a multi-byte character, and a stop string can start in
one token and end in the next. `ReplyText.push(token)` returns only text that can never be
taken back: the tokenizer's `StreamDecoder` holds incomplete characters, and the tail of
the text that could still grow into a stop string is held until it cannot. Each token is
decoded once (the old server re-decoded the whole reply at every token: quadratic).

    >>> rt = ReplyText(tok, StopStrings(["\\n\\n"]))              # doctest: +SKIP
    >>> [rt.push(t) for t in tok.encode("Hi!\\n\\nBye")]           # doctest: +SKIP
    ['Hi', '!', '', '']                                           # then rt.stopped is True
"""
from __future__ import annotations

import math

from labkit.sampling.stopping import StopStrings

__all__ = ["ReplyText", "logprob_entry", "legacy_logprobs"]


class ReplyText:
    """Text of one reply, grown a token at a time (the end-of-sequence token is not text)."""

    def __init__(self, tok, stop: StopStrings | None = None):
        self.decoder = tok.stream_decoder()
        self.eos = getattr(tok, "eos_id", None)
        self.stops = stop if stop is not None else StopStrings(None)
        self.longest = max((len(s) for s in self.stops.stops), default=0)
        self.text, self.sent, self.stopped = "", 0, False

    def _emit(self, upto: int) -> str:
        piece, self.sent = self.text[self.sent:upto], max(self.sent, upto)
        return piece

    def push(self, token: int) -> str:
        """Add a token; return the text that is now final ('' while held back, and after a stop)."""
        if self.stopped or token == self.eos:
            return ""
        self.text += self.decoder.push(token)
        if not self.stops:
            return self._emit(len(self.text))
        hit = self.stops.find(self.text, self.sent - self.longest)
        if hit is not None:
            self.text, self.stopped = self.text[:hit], True
            return self._emit(hit)
        return self._emit(len(self.text) - self.stops.held_back(self.text))

    def finish(self) -> str:
        """The reply ended: release what was held back (an incomplete character becomes U+FFFD)."""
        if not self.stopped:
            self.text += self.decoder.flush()
            hit = self.stops.find(self.text, self.sent - self.longest) if self.stops else None
            if hit is not None:
                self.text, self.stopped = self.text[:hit], True
        return self._emit(len(self.text))


def _token(tok, token_id: int) -> tuple[str, list[int]]:
    raw = tok.token_bytes(token_id)
    return raw.decode("utf-8", errors="replace"), list(raw)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0  # JSON has no -inf; OpenAI uses -9999.0 for "never"


def logprob_entry(tok, token_id: int, logprob: float, top: list[tuple[int, float]]) -> dict:
    """One token of the chat API's `logprobs.content`: token, logprob, bytes and the top alternatives."""
    text, raw = _token(tok, token_id)
    alts = []
    for alt_id, alt_lp in top:
        alt_text, alt_raw = _token(tok, alt_id)
        alts.append({"token": alt_text, "logprob": _finite(alt_lp), "bytes": alt_raw})
    return {"token": text, "logprob": _finite(logprob), "bytes": raw, "top_logprobs": alts}


def legacy_logprobs(tok, req, start: int = 0, end: int | None = None, offset: int = 0) -> dict:
    """The completions API's `logprobs` for generated tokens [start, end): tokens, token_logprobs,
    top_logprobs (dicts) and text_offset (counted from `offset`, the reply's length before `start`)."""
    end = len(req.token_logprobs) if end is None else end
    tokens, lps, tops, offsets, at = [], [], [], [], offset
    for token_id, (lp, top) in zip(req.output[start:end], req.token_logprobs[start:end]):
        text, _ = _token(tok, token_id)
        tokens.append(text)
        lps.append(_finite(lp))
        tops.append({_token(tok, i)[0]: _finite(v) for i, v in top})
        offsets.append(at)
        at += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
