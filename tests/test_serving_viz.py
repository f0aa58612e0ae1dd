"""Chapter 09's figures and widget: pure functions of a replay or of numbers, checked against what they draw."""
from __future__ import annotations

import pytest

from labkit.costmodel import cost_per_million_tokens, decode_throughput
from labkit.serving import Request, studies
from labkit.viz import serving as viz


@pytest.fixture(scope="module")
def replay():
    reqs = [Request(i, list(range(1, 2 + 3 * i)), 2 + i, arrival=0.5 * i) for i in range(4)]
    return studies.simulate(reqs, lambda rows: 0.1 * sum(n for _, n in rows), policy="chunked", max_batch=2,
                            token_budget=8, block_size=4, num_blocks=32)


def test_gantt_rows_account_for_every_token_and_the_wait(replay):
    rows = viz.gantt_rows(replay)
    for req in replay.requests:
        mine = [r for r in rows if r["request"] == req.id]
        assert sum(r["tokens"] for r in mine) == len(req.prompt) + req.max_new_tokens - 1  # the last token is never fed
        wait = [r for r in mine if r["phase"] == "waiting"][0]
        assert wait["start"] == req.arrival and wait["end"] <= req.first_token
        assert all(a["end"] <= b["start"] + 1e-9 for a, b in zip(mine[1:], mine[2:]))  # passes in time order
    fig = viz.gantt_figure(replay)
    assert [t.name for t in fig.data] == ["prefill", "decode", "waiting"]
    assert sum(len(t.x) for t in fig.data) == len(rows)


def test_kv_usage_figure_draws_the_replays_numbers(replay):
    fig = viz.kv_usage_figure(replay, bytes_per_token=2**20, context=64)
    assert list(fig.data[0].y) == [s.kv_tokens for s in replay.steps]
    assert all(held <= slots for held, slots in zip(fig.data[0].y, fig.data[1].y))


def test_cost_rows_are_price_over_tokens_per_hour():
    rows = viz.cost_rows(100.0, 0.36, 3.0, batches=(1, 64))
    assert rows[0]["dollars_per_million"] == pytest.approx(1.0)  # $0.36/h over 360,000 tokens/h
    h100 = decode_throughput("llama-2-7b", "h100-sxm", [1, 64], context=512)
    assert [r["dollars_per_million"] for r in rows[1:]] == pytest.approx(
        [cost_per_million_tokens(r["tokens_per_s"], 3.0) for r in h100])
    fig = viz.cost_figure(100.0, 0.36, 3.0)
    assert len(fig.data[0].x) == 4 and "cheapest" in fig.layout.title.text.replace("<br>", " ")
    assert fig.layout.title.text.count("$") <= 1  # two would make plotly read LaTeX and draw no title


def test_batch_and_load_curve_figures():
    fig = viz.batch_figure([{"batch": 1, "tokens_per_s": 10.0}, {"batch": 8, "tokens_per_s": 40.0}],
                           [{"batch": 1, "tokens_per_s": 12.0}], critical=6.0)
    assert list(fig.data[0].y) == [10.0, 40.0]
    rows = [{"policy": "static", "rate": r, "throughput_tok_s": 10.0 * r, "ttft_p50_s": 0.1, "ttft_p99_s": 0.2 * r}
            for r in (2, 1)]
    fig = viz.load_curve_figure(rows)
    assert list(fig.data[0].x) == [10.0, 20.0]  # sorted by rate


def test_cost_calculator_redraws_when_a_price_moves():
    pytest.importorskip("ipywidgets")
    from labkit.widgets import cost_calculator

    box = cost_calculator(100.0)
    controls, fig = box.children[0].children, box.children[1]
    before = list(fig.data[0].y)
    controls[0].value = 0.72
    assert fig.data[0].y[0] == pytest.approx(before[0] * 0.72 / 0.10, rel=1e-3)  # the default price here is $0.10/h
