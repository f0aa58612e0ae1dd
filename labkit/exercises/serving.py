"""Exercises of the serving chapter: admitting requests into a paged KV pool, the critical decode batch,
predicting a long prompt's TTFT under chunked prefill (checked against the real scheduler), and which drafted
tokens a load-aware speculation budget keeps (checked against `labkit.serving.engine.budget.LoadAware`)."""
from __future__ import annotations

import math

from labkit.exercises._core import check

__all__ = ["check_kv_admission", "check_critical_batch", "check_chunked_ttft", "check_spec_keep"]


# ---- 1. admission into a paged KV pool ------------------------------------------------------------


def _reference_kv_admission(queue: list[tuple[int, int]], free_blocks: int, block_size: int) -> int:
    # a request ever holds the KV of its prompt and of every generated token but the last (never fed back);
    # first come, first served: the head of the queue blocks the rest when it does not fit
    admitted = 0
    for prompt_len, max_new_tokens in queue:
        need = math.ceil((prompt_len + max(max_new_tokens - 1, 0)) / block_size)
        if need > free_blocks:
            break
        free_blocks -= need
        admitted += 1
    return admitted


def check_kv_admission(fn) -> bool:
    """Check `fn(queue, free_blocks, block_size) -> requests admitted` from the head of a FIFO queue.

    `queue` holds (prompt_len, max_new_tokens) pairs; a request is admitted only if the free blocks hold
    every KV slot it can ever fill, and the first one that does not fit stops admission.
    """
    cases = [
        ([(16, 1)], 1, 16),                        # one new token is never fed back: the prompt alone, 1 block
        ([(16, 2)], 1, 16),                        # the second token's input needs a 17th slot: 2 blocks
        ([(10, 7), (10, 7)], 2, 16),               # 16 slots each: an exact fit, twice
        ([(10, 8), (1, 1)], 1, 16),                # 17 slots need 2 blocks: the head blocks the 1-token request
        ([(5, 0), (5, 0), (5, 0)], 2, 4),          # no new tokens: the prompt's KV still lands (2 blocks each)
        ([(100, 28), (3, 3), (40, 1)], 9, 16),     # 127 slots -> 8 blocks, then 5 slots -> 1: exact fit of 9
        ([(1, 1)] * 5, 3, 1),                      # block size 1: a block per slot
        ([], 10, 16),                              # nothing waiting
        ([(8, 8)], 0, 16),                         # no free blocks
        ([(300, 213), (1, 1)], 32, 16),            # 512 slots: exactly 32 blocks, none left for the next
        ([(10, 1), (10, 1), (10, 1)], 2, 16),      # 30 slots would fit in 32, but each request needs a block of its own
    ]
    return check("kv_admission", fn, _reference_kv_admission, cases,
                 hint="count the slots a request can ever fill (which generated token is never fed back into the "
                      "model? and what if there are none?), round up to whole blocks, admit while the need is at most "
                      "what is free, and stop at the first request that does not fit (first come, first served)")


# ---- 2. the critical decode batch -----------------------------------------------------------------


def _reference_critical_batch(peak_flops: float, bandwidth: float, weight_bytes: float, n_params: float,
                              kv_bytes_per_seq: float) -> float:
    # compute 2 N B / F  =  memory (W + B kv) / BW   ->   B = W / (2 N BW / F - kv)
    denominator = 2 * n_params * bandwidth / peak_flops - kv_bytes_per_seq
    return weight_bytes / denominator if denominator > 0 else math.inf


def check_critical_batch(fn) -> bool:
    """Check `fn(peak_flops, bandwidth, weight_bytes, n_params, kv_bytes_per_seq) -> batch` (math.inf if never)."""
    h100 = (989e12, 3.35e12)                      # fp16 dense FLOP/s, HBM3 bytes/s
    l2_7b = (13.48e9, 6.74e9)                     # Llama-2-7B in fp16: weight bytes, parameters
    kv_mha = 524288                               # its KV bytes per token (32 layers x 32 heads x 128, K and V, fp16)
    mistral = (14.48e9, 7.24e9)                   # a 7B with GQA (8 KV heads): 131072 KV bytes per token
    cases = [
        (*h100, *l2_7b, 0.0),                     # no KV: the ridge in tokens (F x 2 bytes / (2 BW))
        (*h100, *l2_7b, 32 * kv_mha),             # short context: KV pushes the batch up
        (*h100, 3.79e9, 6.74e9, 32 * kv_mha),     # INT4 weights (4.5 bits): fewer bytes, smaller batch
        (*h100, *mistral, 128 * 131072),          # GQA at 128 tokens
        (*h100, *l2_7b, 2048 * kv_mha),           # 1 GiB of KV per sequence: never compute-bound
        (2.0, 1.0, 10.0, 1.0, 1.0),               # a sequence's KV takes exactly as long as its FLOPs: never
        (1e12, 1e11, 1e6, 1e9, 0.0),              # tiny weights: the answer is a fraction of a sequence, not rounded
        (1e12, 1e11, 4e9, 1e9, 1.99e8),           # just short of the edge: a large but finite batch
    ]
    return check("critical_batch", fn, _reference_critical_batch, cases,
                 hint="set 2 N B / F equal to (W + B kv) / BW and solve for B (no rounding); when each sequence's KV "
                      "bytes take at least as long to read as its FLOPs take to compute (2 N BW / F <= kv, equality "
                      "included), return math.inf")


# ---- 3. a long prompt's TTFT under chunked prefill ----------------------------------------------


def _reference_chunked_ttft(prompt_len: int, remaining: list[int], token_budget: int, pass_cost) -> float:
    """The real scheduler's answer: `studies.simulate` with policy "chunked" and `pass_cost` as the pass time.

    The decoding requests are prefilled in a first pass (one-token prompts); the long prompt arrives as it ends,
    when request i has `remaining[i]` tokens still to produce.
    """
    from labkit.serving.engine.request import Request
    from labkit.serving.studies.sweeps import simulate

    running = [Request(i, [i + 1], r + 1) for i, r in enumerate(remaining)]
    arrival = float(pass_cost(len(running))) if running else 0.0
    long = Request("long", list(range(1000, 1000 + prompt_len)), 1, arrival=arrival)
    simulate(running + [long], lambda rows: pass_cost(sum(n for _, n in rows)), policy="chunked",
             max_batch=len(running) + 1, token_budget=token_budget, block_size=1,
             num_blocks=prompt_len + sum(remaining) + 2 * len(running) + 8, max_wait_s=0.0)
    return long.ttft


def _affine(a: float, b: float):
    return lambda n: a + b * n


def _tiles(n: int) -> float:
    return 0.004 + 0.003 * math.ceil(n / 8)      # a kernel that works in tiles of 8 tokens


def _concave(n: int) -> float:
    return 0.02 + 0.001 * n ** 0.5


def check_chunked_ttft(fn) -> bool:
    """Check `fn(prompt_len, remaining, token_budget, pass_cost) -> seconds` against the chunked scheduler's replay."""
    cases = [
        (100, [50, 50, 50, 50], 20, _affine(0.030, 0.002)),   # 16 tokens a pass, the last chunk 4
        (96, [60, 60, 60, 60], 20, _affine(0.030, 0.002)),    # an exact multiple
        (64, [2, 5, 30], 8, _affine(0.010, 0.001)),           # decodes end mid-prefill: the chunk grows
        (10, [3, 3], 2, _affine(0.010, 0.001)),               # the decodes fill the budget: the prompt waits
        (45, [], 16, _affine(0.010, 0.001)),                  # nothing else running
        (12, [9, 9, 9], 16, _affine(0.010, 0.001)),           # the prompt fits in one pass
        (200, [40, 7, 100, 1, 100], 37, _tiles),              # a pass's cost in steps of 8 tokens
        (300, [25, 80, 80], 64, _concave),                    # cost grows slower than the tokens
        (33, [0, 4], 12, _affine(0.020, 0.0005)),             # a request with nothing left to produce
    ]
    return check("chunked_ttft", fn, _reference_chunked_ttft, cases,
                 hint="walk pass by pass: every request with tokens left decodes one (it is done after its last), "
                      "the prompt gets what is left of token_budget (maybe nothing), the pass costs pass_cost(all its "
                      "tokens), and the first token comes at the end of the pass that runs the prompt's last chunk")


# ---- 5. which drafted tokens a load-aware budget keeps ---------------------------------------------------


def _reference_spec_keep(alphas: list[float], drafted: list[int], rows: int, riding: int, room, pass_cost) -> list[int]:
    from types import SimpleNamespace

    from labkit.serving.engine.budget import LoadAware

    budget = LoadAware(cost=lambda r: pass_cost(sum(n for _, n in r)), gamma_max=8)  # the statement's cap
    budget.observe(SimpleNamespace(id=-1), 1, 1)  # something verified: no probe
    budget.recent.update({i: a for i, a in enumerate(alphas)})
    reqs = [(SimpleNamespace(id=i), m) for i, m in enumerate(drafted)]
    return budget.choose(reqs, batch=rows, riding=riding, decoding=rows, room=room)


def check_spec_keep(fn) -> bool:
    """Check `fn(alphas, drafted, rows, riding, room, pass_cost) -> drafted tokens kept per request` against the
    load-aware budget (`labkit.serving.engine.budget.LoadAware.choose`)."""
    cases = [
        ([0.6] * 4, [3] * 4, 4, 0, None, _affine(0.010, 0.0)),           # a flat pass: keep every drafted token
        ([0.6] * 4, [3] * 4, 4, 0, None, _affine(0.0, 0.001)),           # T proportional to n: keep none
        ([0.9, 0.2], [4, 4], 2, 0, None, _affine(0.010, 0.0015)),         # the likely request drafts, the other not
        ([0.7, 0.5, 0.3], [5, 5, 5], 6, 0, None, _affine(0.020, 0.001)),  # three decoding rows have no draft
        ([0.8, 0.6], [4, 4], 2, 30, 3, _affine(0.010, 0.0)),             # three free slots, then prompts wait
        ([0.95, 0.85, 0.4], [6, 2, 6], 3, 10, None, _concave),            # a cost that grows slower than n
        ([0.5, 0.99], [2, 8], 8, 0, 0, _affine(0.010, 0.0)),              # no free slot at all
        ([0.5, 0.5], [3, 3], 2, 10, None, _affine(0.0, 0.001)),           # T ∝ n, but riding tokens emit nothing
    ]
    return check("spec_keep", fn, _reference_spec_keep, cases,
                 hint="rank every candidate token (request i, position j) by alpha_i ** j; walk them in that order; a "
                      "token counts only if the one before it in its request was kept; keep it while the pass has room "
                      "and alpha_i ** j * T(N) > E * (T(N + 1) - T(N)), then N += 1 and E += alpha_i ** j (N starts at "
                      "rows + riding, E at rows)")
