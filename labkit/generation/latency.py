"""Measured on this machine: TTFT vs prompt length, ITL vs position, the KV cache's speed-up.

The metric names follow vLLM's `benchmarks/serve.py`: TTFT is the time to the first
token (here: the prefill, which produces it), ITL the gap between consecutive tokens
(one decode step). The speed-up compares greedy generation with a KV cache against
generation without one, where every step runs the whole sequence again (what the
articles call O(n²)): both produce the same tokens, and the cumulative time of each
after n tokens gives the speed-up at every length from one run. Timings are medians of
runs interleaved side by side, so machine noise hits both alike.

    >>> model, tok = labkit.load("smollm2-135m")                    # doctest: +SKIP
    >>> ttft_sweep(model, [16, 64, 256])                            # doctest: +SKIP
    [{'prompt_len': 16, 'ttft_s': 0.05}, ...]
"""
from __future__ import annotations

import torch

from labkit import checks, measure
from labkit.measure.clock import now as clock_now

__all__ = ["filler_ids", "ttft_sweep", "itl_sweep", "time_steps", "generate_without_cache", "generate_with_cache",
           "speedup_run", "predict_speedup", "crossing", "interpolate", "reply_estimate"]


def filler_ids(n: int, vocab_size: int, seed: int = 0) -> list[int]:
    """`n` random token ids (timing does not depend on what the tokens say)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(min(100, vocab_size // 2), vocab_size, (n,), generator=g).tolist()


def _check_lengths(name: str, values) -> list[int]:
    values = list(values)
    if not values or any(not isinstance(v, int) or v < 1 for v in values):
        raise ValueError(f"{name} must be a non-empty list of positive integers, got {values!r}")
    return values


@torch.inference_mode()
def ttft_sweep(model, prompt_lens, repeat: int = 3) -> list[dict]:
    """Median prefill time (the TTFT without tokenizing) for each prompt length, with every sample ("samples"):
    one `labkit.measure.run`, the lengths interleaved in a fresh order each round (a prompt of fresh ids each call)."""
    from labkit import measure
    from labkit.generation.stages import prefill

    prompt_lens = _check_lengths("prompt_lens", prompt_lens)
    checks.positive_int("repeat", repeat)
    prefill(model, filler_ids(8, model.config.vocab_size), max_len=8)  # warm-up
    calls = {p: 0 for p in prompt_lens}

    def first_token(p: int) -> None:
        state = prefill(model, filler_ids(p, model.config.vocab_size, seed=calls[p]), max_len=p + 1)
        int(state.logits.argmax())  # the first token
        calls[p] += 1

    run = measure.run({str(p): (lambda p=p: first_token(p)) for p in prompt_lens}, rounds=repeat, warmup=0,
                      machine=False, loops=1)
    return [{"prompt_len": p, "ttft_s": run[str(p)].median, "samples": list(run[str(p)].samples)} for p in prompt_lens]


def _step_run(model, runs: list[list], steps: int):
    """A `measure.Run` of `steps` greedy decode steps of each run (variant "0", "1", ...): one step of every run per
    round, in a fresh random order each round, each step's state following the last (no warm-up: the callers warm)."""
    def stepper(run):
        def one_step():
            logits = (model or run[0]).step(run[-1], cache=run[-2], last_only=True)
            run[-1] = logits[:, -1].argmax(-1, keepdim=True)
        return one_step

    return measure.run({str(i): stepper(run) for i, run in enumerate(runs)}, rounds=steps, warmup=0, machine=False,
                       loops=1)


def time_steps(model, runs: list[list], steps: int, samples: bool = False) -> list:
    """Median seconds of a greedy decode step for each run (a list ending with its cache and its next token [1, 1],
    both updated in place), the runs interleaved step by step (`measure.run`, a fresh order each round) so that a
    drift of the machine's speed hits all alike. `model=None`: each run starts with its own model (models compared
    side by side). `samples`: every step's seconds per run instead of the medians."""
    run = _step_run(model, runs, steps)
    return [list(run[str(i)].samples) if samples else run[str(i)].median for i in range(len(runs))]


@torch.inference_mode()
def itl_sweep(model, positions, steps: int = 5, cache="contiguous", **cache_opts) -> list[dict]:
    """Median decode-step time (the ITL) at each position, with every step's time ("samples").

    Prefills `position` random tokens for every position first, then times `steps` steps
    round-robin across them, so every position sees the same machine (the samples of two positions are
    paired step by step: `labkit.measure.Run.from_samples` and `compare`). `cache` is a kind
    name (with `cache_opts`), or a list of kinds to compare at one position each
    (rows then carry a "cache" key too).
    """
    from labkit.generation.stages import prefill

    positions = _check_lengths("positions", positions)
    kinds = cache if isinstance(cache, (list, tuple)) else [cache]
    runs = []  # (position, kind, cache, next token)
    for kind in kinds:
        for p in positions:
            kv = model.new_cache(kind, max_len=p + steps + 2, **cache_opts)
            state = prefill(model, filler_ids(p, model.config.vocab_size), cache=kv)
            token = torch.tensor([[int(state.logits.argmax())]])
            model.step(token, cache=state.cache)  # warm-up step (the token is the model's own: no id check, as in decode)
            runs.append([p, kind, state.cache, token])
    timed = _step_run(model, runs, steps)
    rows = [{"position": run[0], "itl_s": timed[str(i)].median, "samples": list(timed[str(i)].samples)}
            for i, run in enumerate(runs)]
    if isinstance(cache, (list, tuple)):
        for row, run in zip(rows, runs):
            row["cache"] = run[1]
    return rows


@torch.inference_mode()
def generate_without_cache(model, ids, n: int, times: list | None = None) -> list[int]:
    """Greedy: each of the `n` steps runs the *whole* sequence through the model again.

    `times`, if given, receives the cumulative seconds after each token.
    """
    x = torch.tensor([list(ids)])
    out, start = [], clock_now()
    for _ in range(n):
        token = int(model(x, last_only=True)[0, -1].argmax())
        out.append(token)
        x = torch.cat([x, torch.tensor([[token]])], dim=1)
        if times is not None:
            times.append(clock_now() - start)
    return out


@torch.inference_mode()
def generate_with_cache(model, ids, n: int, cache="contiguous", times: list | None = None) -> list[int]:
    """Greedy with a KV cache: one prefill, then one token per step (same tokens as without)."""
    ids = list(ids)
    if isinstance(cache, str):
        cache = model.new_cache(kind=cache, max_len=len(ids) + n)
    start = clock_now()
    logits = model(torch.tensor([ids]), cache=cache, last_only=True)
    out = []
    for i in range(n):
        token = int(logits[0, -1].argmax())
        out.append(token)
        if times is not None:
            times.append(clock_now() - start)
        if i + 1 < n:
            logits = model.step(torch.tensor([[token]]), cache=cache)
    return out


def speedup_run(model, ids, n: int, repeat: int = 1) -> list[dict]:
    """Generate `n` tokens with and without a cache (`repeat` rounds, interleaved in a fresh order each round by
    `measure.run`); for every length 1..n: the median over rounds of the cumulative seconds of each, and the
    speed-up."""
    checks.positive_int("n", n)
    checks.positive_int("repeat", repeat)
    generate_with_cache(model, ids, 2)  # warm-up
    runs: dict = {"cached": [], "uncached": []}
    replies: dict = {"cached": [], "uncached": []}

    def timed(kind, generate):
        def one_reply():
            times: list = []
            replies[kind].append(generate(model, ids, n, times=times))
            runs[kind].append(times)
        return one_reply

    measure.run({"cached": timed("cached", generate_with_cache), "uncached": timed("uncached", generate_without_cache)},
                rounds=repeat, warmup=0, machine=False, loops=1)
    for a, b in zip(replies["cached"], replies["uncached"]):
        if a != b:  # float32: the same greedy tokens, or the comparison is meaningless
            raise RuntimeError(f"cached and uncached greedy tokens differ at step {next(i for i in range(n) if a[i] != b[i])}")
    rows = []
    for i in range(n):  # the cumulative seconds after token i: a Timing over the rounds
        cached = measure.Timing("cached", tuple(r[i] for r in runs["cached"])).median
        uncached = measure.Timing("uncached", tuple(r[i] for r in runs["uncached"])).median
        rows.append({"new_tokens": i + 1, "cached_s": cached, "uncached_s": uncached, "speedup": uncached / cached})
    return rows


def predict_speedup(ttft_rows, itl_rows, prompt_len: int, lengths) -> list[tuple[int, float]]:
    """The KV cache's speed-up for each reply length, predicted from a calibration run made beforehand.

    `ttft_rows` (`ttft_sweep`: one uncached pass over L tokens) and `itl_rows` (`itl_sweep`: a
    cached step at position p) are interpolated. Without a cache, new token i re-runs the whole
    sequence, a pass over prompt_len + i tokens; with one, it is a step at position
    prompt_len + i; the first token is the prefill in both. Returns [(new_tokens, speed-up)].
    """
    if not ttft_rows or not itl_rows:
        raise ValueError("need ttft_rows and itl_rows from a calibration run (ttft_sweep, itl_sweep)")
    passes = [(r["prompt_len"], r["ttft_s"]) for r in ttft_rows]
    out = []
    for n in lengths:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"lengths must be positive integers, got {n!r}")
        cached = reply_estimate(ttft_rows, itl_rows, prompt_len, n)  # the prefill, then n - 1 cached steps
        without = cached["ttft_s"] + sum(max(0.0, interpolate(passes, prompt_len + i)) for i in range(1, n))
        out.append((n, without / cached["total_s"]))
    return out


def crossing(rows: list[dict], x: str, y: str, level: float) -> float | None:
    """The first x at which y reaches `level`, linearly interpolated (None if it never does).

    >>> crossing([{"n": 1, "s": 1.0}, {"n": 3, "s": 5.0}, {"n": 5, "s": 9.0}], "n", "s", 3.0)
    2.0
    """
    for a, b in zip(rows, rows[1:]):
        if a[y] < level <= b[y]:
            return a[x] + (level - a[y]) * (b[x] - a[x]) / (b[y] - a[y])
    if rows and rows[0][y] >= level:
        return float(rows[0][x])
    return None


def interpolate(points, x: float) -> float:
    """Piecewise-linear through sorted (x, y) `points`, extended linearly past both ends.

    >>> interpolate([(0, 0.0), (10, 1.0), (20, 3.0)], 30)
    5.0
    """
    points = sorted(points)
    if len(points) == 1:
        return float(points[0][1])
    i = next((k for k in range(1, len(points) - 1) if x < points[k][0]), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def reply_estimate(ttft_rows, itl_rows, prompt_len: int, reply_len: int) -> dict:
    """Time of one reply from measured sweeps: the TTFT at `prompt_len`, then `reply_len` − 1
    decode steps at positions prompt_len + 1, ... (the first token comes out of the prefill).

    >>> est = reply_estimate([{"prompt_len": 10, "ttft_s": 0.1}, {"prompt_len": 110, "ttft_s": 1.1}],
    ...                      [{"position": 0, "itl_s": 0.05}, {"position": 1000, "itl_s": 0.05}], 60, 11)
    >>> round(est["ttft_s"], 3), round(est["decode_s"], 3), round(est["prefill_share"], 3)
    (0.6, 0.5, 0.545)
    """
    for name, value in (("prompt_len", prompt_len), ("reply_len", reply_len)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    ttft = max(0.0, interpolate([(r["prompt_len"], r["ttft_s"]) for r in ttft_rows], prompt_len))
    itl_points = [(r["position"], r["itl_s"]) for r in itl_rows]
    steps = [max(0.0, interpolate(itl_points, prompt_len + i)) for i in range(1, reply_len)]
    decode_s = sum(steps)
    total = ttft + decode_s
    return {"ttft_s": ttft, "decode_s": decode_s, "total_s": total, "prefill_share": ttft / total if total else 0.0,
            "itl_s": decode_s / len(steps) if steps else 0.0, "steps_s": steps}
