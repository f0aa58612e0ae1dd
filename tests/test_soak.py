"""The soak bench's parts: its seeded mix, a window's figures and the four claims it makes; and one short live run
of `labkit serve` in its own process (the bench itself is `labkit bench --only soak`)."""
from __future__ import annotations

import pytest

from labkit.benchmarks import soak


def test_the_mix_is_seeded_and_holds_every_kind():
    a, b = soak.plan(2000, seed=1), soak.plan(2000, seed=1)
    assert a == b and a != soak.plan(2000, seed=2)
    share = {k: sum(r["kind"] == k for r in a) / len(a) for k, _ in soak.MIX}
    for kind, weight in soak.MIX:
        assert abs(share[kind] - weight) < 0.03, (kind, share[kind])
    assert 0.2 < sum(r["long"] for r in a) / len(a) < 0.3 and {r["max_tokens"] for r in a} == set(range(4, 25))


def _rows(latencies, kind="chat", status=200):
    return [{"kind": kind, "status": status, "latency_s": x} for x in latencies]


def test_a_window_counts_complete_requests_only_and_every_non_2xx():
    rows = _rows([0.1 * (i + 1) for i in range(200)]) + _rows([50.0] * 5, kind="cancel") + \
        _rows([0.01] * 3, kind="invalid", status=400) + _rows([0.01], kind="invalid", status=422)
    w = soak.window_summary(rows)
    assert w["requests"] == 209 and w["complete"] == 200
    assert w["p50_s"] == pytest.approx(10.05) and w["p99_interval"][0] <= w["p99_s"] <= w["p99_interval"][1]
    assert w["non_2xx"] == {"400": 3, "422": 1}


def _window(rss, p99s):
    w = soak.window_summary(_rows(p99s))
    return {**w, "rss_bytes": rss}


def test_the_claims_fail_on_a_leak_a_slowdown_a_lost_request_and_a_wrong_answer():
    fast = [0.1 + 0.0001 * (i % 997) for i in range(2000)]
    good = [_window(100e6, fast[:500]), _window(101e6, fast[:500]), _window(102e6, fast[:500])]
    rows = _rows(fast) + _rows([0.01], kind="invalid", status=400)
    verdicts = [c.verdict for c in soak.verdicts(good, rows, {"running": 0, "waiting": 0})]
    assert verdicts == ["holds", "holds", "holds", "holds"]
    leak = [_window(100e6, fast[:500]), _window(104e6, fast[:500]), _window(110e6, fast[:500])]
    assert soak.verdicts(leak, rows, {})[0].verdict == "fails"
    slow = _rows(fast[:1000] + [3 * x for x in fast[1000:]])
    assert soak.verdicts(good, slow, {})[1].verdict == "fails"
    few = _rows(fast[:400])  # 200 a side cannot bound a p99: neither holds nor fails
    assert soak.verdicts(good, few, {})[1].verdict == "inconclusive"
    assert soak.verdicts(good, rows + _rows([120.0], status=-1), {})[2].verdict == "fails"
    assert soak.verdicts(good, rows, {"running": 1, "waiting": 0})[2].verdict == "fails"  # a slot left open
    assert soak.verdicts(good, rows + _rows([0.01], kind="invalid", status=200), {})[3].verdict == "fails"


def test_a_short_live_soak_loses_nothing():
    out = soak.run(requests=80, clients=4, window=40)
    claims = {c["name"]: c for c in out["claims"]}
    assert claims["requests lost, hung or left open"]["verdict"] == "holds", out["errors"]
    assert claims["invalid requests not answered 4xx"]["verdict"] == "holds"
    assert len(out["windows"]) == 2 and out["after"]["running"] == 0
    with pytest.raises(ValueError, match="two windows"):
        soak.run(requests=10, window=40)
