"""The serving exercise checkers accept the reference answers and reject the plausible wrong ones."""
import math
import random

import pytest

from tests.conftest import assert_checker_separates


def _critical_batch(F, BW, W, N, kv):
    d = 2 * N * BW / F - kv
    return W / d if d > 0 else math.inf


def _admission(queue, free_blocks, block_size, slots=lambda p, m: p + max(m - 1, 0), skip=False, fits=lambda n, f: n <= f):
    admitted = 0
    for p, m in queue:
        need = -(-slots(p, m) // block_size)
        if not fits(need, free_blocks):
            if skip:
                continue
            break
        free_blocks -= need
        admitted += 1
    return admitted


def _pooled_admission(queue, free_blocks, block_size):
    # "admit while the slots fit in the free slots": forgets that blocks are not shared between requests
    admitted, room = 0, free_blocks * block_size
    for p, m in queue:
        need = p + max(m - 1, 0)
        if need > room:
            break
        room -= need
        admitted += 1
    return admitted


def _chunked_ttft(prompt_len, remaining, token_budget, pass_cost, *, finish=True, budget_for_decodes=True,
                  full_last=False):
    left, remaining, t = prompt_len, list(remaining), 0.0
    while left > 0:
        decoding = sum(1 for r in remaining if r > 0)
        room = token_budget - decoding if budget_for_decodes else token_budget
        chunk = room if full_last else min(left, room)
        t += pass_cost(decoding + chunk)
        left -= chunk
        remaining = [r - 1 if (r > 0 or not finish) else r for r in remaining if r > 0 or not finish]
        if not finish:
            remaining = [max(r, 1) for r in remaining]
    return t


def _one_pass_plus_decodes(prompt_len, remaining, token_budget, pass_cost):
    # "the decode passes the chunks ride in, plus the prompt's price as one pass": off by the intercepts
    d = sum(1 for r in remaining if r > 0)
    passes = math.ceil(prompt_len / (token_budget - d))
    return passes * pass_cost(d) + pass_cost(prompt_len)


def _spec_keep(alphas, drafted, rows, riding, room, cost, *, chain=True, grow=True, use_room=True, power=True,
               e_drafting=False):
    """The keep rule written from the chapter's statement (not through LoadAware); the flags break one piece each."""
    kept = [0] * len(alphas)
    n, e = rows + riding, float(len(alphas) if e_drafting else rows)
    room = float("inf") if room is None or not use_room else room
    cands = sorted(((a ** j if power else a, -j, i) for i, (a, m) in enumerate(zip(alphas, drafted))
                    for j in range(1, m + 1)), reverse=True)
    for gain, neg_j, i in cands:
        if chain and kept[i] != -neg_j - 1:
            continue
        if room <= 0:
            break
        if gain * cost(n) > e * (cost(n + 1) - cost(n)):
            kept[i] += 1
            room -= 1
            if grow:
                n, e = n + 1, e + gain
    return kept


# (a token whose predecessor was refused is never kept anyway: with N and E unchanged a smaller gain cannot pass)
SPEC_WRONG = [lambda *a: _spec_keep(*a, grow=False),
              lambda *a: _spec_keep(*a, use_room=False), lambda *a: _spec_keep(*a, power=False),
              lambda *a: _spec_keep(*a, e_drafting=True)]


@pytest.mark.parametrize("wrong", SPEC_WRONG)
def test_the_spec_keep_checker_passes_the_rule_and_fails_a_broken_one(wrong, capsys):
    assert_checker_separates("check_spec_keep", _spec_keep, wrong, capsys)


@pytest.mark.parametrize("name, right, wrong", [
    # admission: the reference, against a cache that also reserves the last token, pools over requests, rounds down,
    # skips past the head, or refuses an exact fit
    ("check_kv_admission", _admission, lambda q, f, b: _admission(q, f, b, slots=lambda p, m: p + m)),
    ("check_kv_admission", _admission, lambda q, f, b: _admission(q, f, b, slots=lambda p, m: p + m - 1)),
    ("check_kv_admission", _admission, lambda q, f, b: _admission(q, f, b, skip=True)),
    ("check_kv_admission", _admission, lambda q, f, b: _admission(q, f, b, fits=lambda n, free: n < free)),
    ("check_kv_admission", _admission,
     lambda q, f, b: _admission(q, f, b, slots=lambda p, m: (p + max(m - 1, 0)) // b * b + b)),   # one block too many
    ("check_kv_admission", _admission, _pooled_admission),
    ("check_critical_batch", _critical_batch, lambda F, BW, W, N, kv: W * F / (2 * N * BW)),                   # no KV
    ("check_critical_batch", _critical_batch, lambda F, BW, W, N, kv: W / (2 * N * BW / F - kv)),  # no inf case
    ("check_critical_batch", _critical_batch,
     lambda F, BW, W, N, kv: (lambda d: W / d if d >= 0 else math.inf)(2 * N * BW / F - kv)),      # the edge itself
    ("check_critical_batch", _critical_batch, lambda F, BW, W, N, kv: math.ceil(_critical_batch(F, BW, W, N, kv))
     if _critical_batch(F, BW, W, N, kv) != math.inf else math.inf),                               # rounded up
    # chunked TTFT: decodes that never finish, a budget that ignores the decodes, a full-size last chunk, the prompt
    # priced as one pass, and chunk passes without the decodes riding in them
    ("check_chunked_ttft", _chunked_ttft, lambda P, r, B, c: _chunked_ttft(P, r, B, c, finish=False)),
    ("check_chunked_ttft", _chunked_ttft, lambda P, r, B, c: _chunked_ttft(P, r, B, c, budget_for_decodes=False)),
    ("check_chunked_ttft", _chunked_ttft, lambda P, r, B, c: _chunked_ttft(P, r, B, c, full_last=True)),
    ("check_chunked_ttft", _chunked_ttft, _one_pass_plus_decodes),
    ("check_chunked_ttft", _chunked_ttft,
     lambda P, r, B, c: math.ceil(P / (B - sum(1 for x in r if x > 0))) * c(B - sum(1 for x in r if x > 0))),
])
def test_checker_passes_the_right_answer_and_fails_a_wrong_one(name, right, wrong, capsys):
    assert_checker_separates(name, right, wrong, capsys)


def test_a_stub_is_reported_as_todo(capsys):
    from labkit.exercises import check_chunked_ttft, check_kv_admission

    def stub(*args):
        raise NotImplementedError

    assert not check_kv_admission(stub) and not check_chunked_ttft(stub)
    assert capsys.readouterr().out.count("[TODO]") == 2


def test_the_critical_batch_cases_are_realistic():
    # Llama-2-7B fp16 on an H100 without KV is the ridge in tokens: 989e12 * 2 / (2 * 3.35e12) = 295
    assert _critical_batch(989e12, 3.35e12, 13.48e9, 6.74e9, 0.0) == pytest.approx(989e12 / 3.35e12)
    assert _critical_batch(989e12, 3.35e12, 13.48e9, 6.74e9, 32 * 524288) == pytest.approx(466.8, abs=0.1)


def test_the_admission_reference_is_the_static_schedulers_rule():
    # labkit's static batching reserves every slot a request can fill, first come first served: the same count
    from labkit.exercises.serving import _reference_kv_admission
    from labkit.kvcache.blocks import BlockTables
    from labkit.serving.engine.request import Request
    from labkit.serving.engine.scheduler import Scheduler

    rng = random.Random(0)
    for _ in range(200):
        block_size, free = rng.choice([1, 4, 16]), rng.randint(1, 40)
        queue = [(rng.randint(1, 60), rng.randint(1, 40)) for _ in range(rng.randint(1, 6))]
        queue = [(p, m) for p, m in queue if -(-(p + m - 1) // block_size) <= free]   # each fits an empty pool
        sched = Scheduler(BlockTables(free, block_size), policy="static", max_batch=len(queue) + 1,
                          token_budget=max(block_size, 10_000), max_wait_s=0.0)
        for i, (p, m) in enumerate(queue):
            sched.add(Request(i, [1] * p, m))
        sched.schedule(0.0, draining=True)
        assert len(sched.running) == _reference_kv_admission(queue, free, block_size), (queue, free, block_size)


def test_the_chunked_ttft_reference_is_the_pass_by_pass_walk():
    # the checker's reference replays the real scheduler; on random cases it agrees with the walk a learner writes
    from labkit.exercises.serving import _reference_chunked_ttft

    rng = random.Random(1)
    for _ in range(100):
        budget = rng.randint(2, 40)
        remaining = [rng.randint(0, 30) for _ in range(rng.randint(0, min(budget, 6)))]
        prompt_len = rng.randint(1, 200)
        a, b = rng.uniform(0.001, 0.05), rng.uniform(0.0, 0.003)
        cost = lambda n: a + b * n  # noqa: E731
        assert _reference_chunked_ttft(prompt_len, remaining, budget, cost) == pytest.approx(
            _chunked_ttft(prompt_len, remaining, budget, cost), rel=1e-9), (prompt_len, remaining, budget)
