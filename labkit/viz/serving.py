"""Figures of chapter 09: a Gantt chart of the engine's passes, throughput vs latency, KV memory, ITL around a long prefill."""
from __future__ import annotations

import plotly.graph_objects as go

from labkit.viz._spec import wrap_title

__all__ = ["gantt_rows", "gantt_figure", "load_curve_figure", "kv_usage_figure", "itl_figure", "batch_figure", "cost_rows",
           "cost_figure", "spec_load_figure"]

_LAYOUT = dict(margin=dict(t=80, l=70, r=20, b=50), legend=dict(orientation="h", y=-0.2))
_PHASE = {"prefill": "#ff7f0e", "decode": "#1f77b4", "waiting": "#dddddd"}


def gantt_rows(replay) -> list[dict]:
    """One bar per (request, pass): start, end, tokens, phase ('prefill' for prompt tokens, else 'decode'),
    plus one 'waiting' bar per request from its arrival to its first pass."""
    steps = {s.index: s for s in replay.steps}
    first = replay.steps[0].index if replay.steps else 0
    rows = []
    for req in replay.requests:
        mine = [(i, n) for i, n in req.steps if i in steps]
        if mine:
            rows.append({"request": req.id, "start": req.arrival, "end": steps[mine[0][0]].start, "tokens": 0, "phase": "waiting"})
        for i, n in mine:
            step = steps[i]
            rows.append({"request": req.id, "start": step.start, "end": step.end, "tokens": n,
                         "phase": "decode" if n == 1 and i != mine[0][0] else "prefill", "step": i - first})
    return rows


def gantt_figure(replay, title: str | None = None, height: int = 360) -> go.Figure:
    """Requests (rows) against time: grey while waiting, orange while their prompt runs, blue while decoding."""
    rows = gantt_rows(replay)
    traces = []
    for phase, color in _PHASE.items():
        mine = [r for r in rows if r["phase"] == phase]
        traces.append(go.Bar(y=[f"req {r['request']}" for r in mine], x=[round(r["end"] - r["start"], 5) for r in mine],
                             base=[round(r["start"], 5) for r in mine], orientation="h", name=phase, marker_color=color,
                             marker_line_width=0, hovertext=[f"{r['tokens']} tokens" for r in mine]))
    end = max((r["end"] for r in rows), default=0.0)
    fig = go.Figure(traces)
    fig.update_layout(title=wrap_title(title or f"{replay.policy}: every request's life, {len(replay.steps)} passes, "
                                       f"done at {end:.2f} s"), barmode="overlay", height=height,
                      xaxis=dict(title="time (s)"), yaxis=dict(autorange="reversed", title=None), **_LAYOUT)
    return fig


def load_curve_figure(rows: list[dict], modelled: list[dict] | None = None,
                      labels: tuple[str, str] = ("measured", "modelled")) -> go.Figure:
    """Throughput (x) against latency (p99 TTFT, y) as the arrival rate rises, one curve per policy.

    rows: {"policy", "rate", "throughput_tok_s", "ttft_p50_s", "ttft_p99_s"} (from `labkit.serving.summarize`);
    `labels` name the two sets of rows in the legend.
    """
    fig = go.Figure()
    colors = {"static": "#7f7f7f", "continuous": "#1f77b4", "orca": "#9467bd", "chunked": "#2ca02c"}
    for label, data, dash in ((labels[0], rows, "solid"), (labels[1], modelled or [], "dot")):
        for policy in dict.fromkeys(r["policy"] for r in data):
            mine = sorted((r for r in data if r["policy"] == policy), key=lambda r: r["rate"])
            fig.add_scatter(x=[round(r["throughput_tok_s"], 2) for r in mine], y=[round(r["ttft_p99_s"], 4) for r in mine],
                            mode="lines+markers", name=f"{policy}, {label} (p99 TTFT)", text=[f"{r['rate']:g} req/s" for r in mine],
                            line=dict(color=colors.get(policy), dash=dash))
    fig.update_layout(title=wrap_title("Throughput against latency as the arrival rate rises: each point is one rate; "
                                       "the curve turns up where the server saturates"), height=420,
                      xaxis=dict(title="output tokens / s"), yaxis=dict(title="p99 time to first token (s)", type="log"),
                      **_LAYOUT)
    return fig


def kv_usage_figure(replay, bytes_per_token: float, context: int | None = None, max_tokens: int | None = None) -> go.Figure:
    """KV memory over time: tokens held, blocks allocated (paged), preallocation of prompt + `max_tokens` (default:
    the trace's longest reply) and of the exact reply per request, and of the whole context per request."""
    t = [round(s.end, 5) for s in replay.steps]
    mb = bytes_per_token / 2**20
    cap = max_tokens or max(r.max_new_tokens for r in replay.requests)
    traces = [go.Scatter(x=t, y=[round(s.kv_tokens * mb, 3) for s in replay.steps], name="tokens held", fill="tozeroy",
                         line=dict(color="#2ca02c")),
              go.Scatter(x=t, y=[round(s.kv_slots * mb, 3) for s in replay.steps], name="paged: blocks allocated",
                         line=dict(color="#1f77b4")),
              go.Scatter(x=t, y=[round((s.prompt_tokens + s.n_running * (cap - 1)) * mb, 3) for s in replay.steps],
                         name=f"preallocated: prompt + max_tokens ({cap}) per request", line=dict(color="#ff7f0e", dash="dash")),
              go.Scatter(x=t, y=[round(s.kv_reserved * mb, 3) for s in replay.steps],
                         name="preallocated with hindsight: prompt + the exact reply", line=dict(color="#8c564b", dash="dot"))]
    if context is not None:
        traces.append(go.Scatter(x=t, y=[round(s.n_running * context * mb, 3) for s in replay.steps],
                                 name=f"preallocated: the whole {context}-token context per request", line=dict(color="#d62728", dash="dot")))
    fig = go.Figure(traces)
    fig.update_layout(title=wrap_title("KV cache memory during the trace: what paging allocates vs what preallocation reserves"),
                      height=400, xaxis=dict(title="time (s)"), yaxis=dict(title="MiB", type="log" if context else "linear"),
                      **_LAYOUT)
    return fig


def itl_figure(results: list[dict]) -> go.Figure:
    """The running requests' inter-token gaps around a long prompt's prefill, one trace per policy."""
    fig = go.Figure()
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for r, color in zip(results, colors):
        gaps = sorted(((b, b - a) for req in r["running"] for a, b in zip(req.token_times, req.token_times[1:])))
        fig.add_scatter(x=[round(t, 4) for t, _ in gaps], y=[round(g * 1e3, 2) for _, g in gaps], mode="markers",
                        marker=dict(color=color),
                        name=f"{r['policy']} (chunk {r['chunk']}): p99 during / undisturbed gap = {r['p99_over_undisturbed']:.1f}x")
        long = r["long"]  # each run has its own clock: its window is shaded in its own colour
        fig.add_vrect(x0=long.arrival, x1=long.first_token, opacity=0.1, line_width=0, fillcolor=color)
    fig.update_layout(title=wrap_title("Inter-token latency of decoding requests while a long prompt is prefilled "
                                       "(shaded: from its arrival to its first token)"), height=420,
                      xaxis=dict(title="time (s)"), yaxis=dict(title="gap between tokens (ms)", type="log"), **_LAYOUT)
    return fig


def batch_figure(measured: list[dict], modelled: list[dict], critical: float | None = None) -> go.Figure:
    """Decode tokens/s against batch size, measured here and modelled, with the critical batch marked."""
    fig = go.Figure([
        go.Scatter(x=[r["batch"] for r in measured], y=[round(r["tokens_per_s"], 2) for r in measured],
                   mode="lines+markers", name="measured", line=dict(color="#d62728")),
        go.Scatter(x=[r["batch"] for r in modelled], y=[round(r["tokens_per_s"], 2) for r in modelled],
                   mode="lines+markers", name="cost model", line=dict(color="#1f77b4", dash="dot")),
    ])
    if critical is not None and critical != float("inf"):  # a trace, not a shape: shapes on a log axis take log10(x)
        top = max([r["tokens_per_s"] for r in measured + modelled] + [1.0])
        fig.add_scatter(x=[critical, critical], y=[0, round(top, 2)], mode="lines", name=f"critical batch {critical:.1f}",
                        line=dict(color="black", dash="dash", width=1))
    fig.update_layout(title=wrap_title("Decode throughput against batch size: one read of the weights serves the "
                                       "whole batch until compute runs out"), height=400,
                      xaxis=dict(title="batch (requests decoding together)", type="log"),
                      yaxis=dict(title="output tokens / s"), **_LAYOUT)
    return fig


def cost_rows(measured_tok_s: float, price_here: float, price_gpu: float, gpu: str = "h100-sxm",
              config="llama-2-7b", batches=(1, 8, 64), context: int = 512) -> list[dict]:
    """$ per 1M output tokens: this machine at its measured rate, and `config` on `gpu` at each batch (modelled)."""
    from labkit.costmodel import cost_per_million_tokens, decode_throughput

    rows = [{"label": "this machine (measured)", "tokens_per_s": measured_tok_s,
             "dollars_per_million": cost_per_million_tokens(measured_tok_s, price_here)}]
    for r in decode_throughput(config, gpu, list(batches), context=context):
        rows.append({"label": f"{gpu}, batch {r['batch']} (modelled)", "tokens_per_s": r["tokens_per_s"],
                     "dollars_per_million": cost_per_million_tokens(r["tokens_per_s"], price_gpu)})
    return rows


def cost_figure(measured_tok_s: float, price_here: float, price_gpu: float, gpu: str = "h100-sxm",
                config="llama-2-7b", batches=(1, 8, 64)) -> go.Figure:
    """Bars of $ per 1M output tokens (log scale): the price per hour over the tokens an hour brings."""
    rows = cost_rows(measured_tok_s, price_here, price_gpu, gpu, config, batches)
    cheapest = min(rows, key=lambda r: r["dollars_per_million"])
    fig = go.Figure(go.Bar(x=[r["label"] for r in rows], y=[round(r["dollars_per_million"], 5) for r in rows],
                           text=[f"${r['dollars_per_million']:.3g} ({r['tokens_per_s']:,.0f} tok/s)" for r in rows],
                           marker_color=["#d62728"] + ["#1f77b4"] * (len(rows) - 1)))
    # one "$" at most in a title: plotly reads "$...$" as LaTeX and, without MathJax, draws no title at all
    fig.update_layout(title=wrap_title(f"Dollars per 1M output tokens = price per hour / (tokens/s x 3600) x 1e6; "
                                       f"cheapest: {cheapest['label']}", width=60), height=440,
                      yaxis=dict(title="$ per 1M tokens", type="log"), **_LAYOUT)
    return fig


def spec_load_figure(sweeps: dict[str, list[dict]], title: str | None = None) -> go.Figure:
    """Each speculation budget against no speculation as the load rises: throughput (left) and each request's decode
    speed (right), one line per budget, one dash per sweep. `sweeps`: {label: `specload.ratios(rows)`}."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("throughput, x no speculation",
                                                        "per-request decode speed (1/TPOT), x no speculation"))
    colors = {"off": "#7f7f7f", "fixed": "#d62728", "vllm": "#9467bd", "auto": "#2ca02c"}
    for (label, rows), dash in zip(sweeps.items(), ("solid", "dot", "dash", "dashdot")):
        for budget in dict.fromkeys(r["budget"] for r in rows):
            if budget == "off":
                continue
            mine = sorted((r for r in rows if r["budget"] == budget), key=lambda r: r["load"])
            color = colors.get(budget.split(":")[0])
            for col, key in ((1, "throughput"), (2, "speed")):
                fig.add_scatter(x=[r["load"] for r in mine], y=[round(r[key], 4) for r in mine], mode="lines+markers",
                                name=f"{budget}, {label}", legendgroup=f"{budget}, {label}", showlegend=col == 1,
                                line=dict(color=color, dash=dash), row=1, col=col)
    for col in (1, 2):
        fig.add_hline(y=1.0, line=dict(color="#7f7f7f", width=1), row=1, col=col)
        fig.update_xaxes(title_text="load (arrival rate / capacity without speculation)", type="log", row=1, col=col)
    fig.update_layout(title=wrap_title(title or "Speculation under load: above 1 it pays, below 1 it costs"), height=460,
                      **_LAYOUT)
    return fig
