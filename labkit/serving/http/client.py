"""A small client and load generator for `labkit serve` (standard library only; localhost, bounded).

    reply = chat(url, "smollm2-135m", "Hello")                         # the completion's JSON
    rows = load_test(url, "smollm2-135m", prompts, concurrency=4)      # one row per request, client-side times

`load_test` sends every prompt as a streamed request, at most `concurrency` in flight, and
times each from the client's side: TTFT is the first event with content, ITL the gaps
between events. Everything stops at `timeout_s`: a request still open then is recorded as
timed out rather than left hanging.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

from labkit.measure.clock import now as clock_now

__all__ = ["chat", "stream_chat", "load_test"]


def _check_url(url: str) -> None:
    host = urlparse(url).hostname
    if host not in ("127.0.0.1", "localhost"):
        raise ValueError(f"url must point at this machine (127.0.0.1), got {url!r}")


def _request(url: str, body: dict) -> urllib.request.Request:
    _check_url(url)
    return urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"})


def chat(url: str, model: str, content: str, max_tokens: int = 32, timeout_s: float = 60, **params) -> dict:
    """One non-streamed chat completion: the server's JSON (an HTTP error raises with the server's message)."""
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **params}
    try:
        with urllib.request.urlopen(_request(url, body), timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"HTTP {err.code}: {json.loads(err.read())['error']['message']}") from None


def stream_chat(url: str, model: str, content: str, max_tokens: int = 32, timeout_s: float = 60, **params) -> dict:
    """A streamed completion, timed: text, ttft_s, event times (seconds since the request was sent), finish_reason."""
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "stream": True, **params}
    t0 = clock_now()
    text, times, reason = [], [], None
    with urllib.request.urlopen(_request(url, body), timeout=timeout_s) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[len("data: "):])["choices"][0]
            piece = choice["delta"].get("content")
            if piece:
                text.append(piece)
                times.append(clock_now() - t0)
            reason = choice.get("finish_reason") or reason
    return {"text": "".join(text), "ttft_s": times[0] if times else None, "times": times,
            "total_s": clock_now() - t0, "finish_reason": reason}


def load_test(url: str, model: str, prompts: list[str], *, concurrency: int = 4, max_tokens: int = 32,
              timeout_s: float = 60.0) -> list[dict]:
    """Send `prompts` as streamed requests, `concurrency` at a time; one row per prompt (client-side times)."""
    _check_url(url)
    if not isinstance(concurrency, int) or not 1 <= concurrency <= 64:
        raise ValueError(f"concurrency must be an integer in [1, 64], got {concurrency!r}")
    if not prompts or len(prompts) > 1000:
        raise ValueError(f"prompts must hold 1 to 1000 prompts, got {len(prompts)}")
    start = clock_now()

    def one(i_prompt):
        i, prompt = i_prompt
        sent = clock_now() - start
        left = timeout_s - sent
        if left <= 0:
            return {"index": i, "sent_s": sent, "error": "timed out before it was sent"}
        try:
            row = stream_chat(url, model, prompt, max_tokens=max_tokens, timeout_s=left)
        except OSError as exc:
            return {"index": i, "sent_s": sent, "error": f"{type(exc).__name__}: {exc}"}
        return {"index": i, "sent_s": sent, **row}

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, enumerate(prompts)))
