"""Exercise of chapter 03, the measured half: TTFT and ITL from the timestamps of a streamed reply."""
from __future__ import annotations

from labkit.exercises._core import check

__all__ = ["check_ttft_and_itl"]


def _ttft_and_itl(request_time: float, token_times: list[float]) -> tuple[float, list[float]]:
    return token_times[0] - request_time, [b - a for a, b in zip(token_times, token_times[1:])]


def check_ttft_and_itl(fn) -> bool:
    """Check `fn(request_time, token_times) -> (ttft, itl)`: seconds from the request to the first
    token, and the gaps between consecutive tokens (one fewer than the tokens)."""
    cases = [(0.0, [0.5, 0.55, 0.61]), (10.0, [10.2]), (3.0, [3.9, 4.0, 4.1, 4.25, 4.3]), (0.0, [0.0, 1.0])]
    return check("ttft_and_itl", fn, _ttft_and_itl, cases,
                 hint="TTFT = first token time - request time; ITL = the differences between neighbouring "
                      "token times (a reply of n tokens has n - 1 of them)")
