"""Figures of the modelled half of chapter 03: the roofline, the ridge point in tokens, the prefill share.

    >>> fig = roofline_figure("llama-2-7b", "h100-sxm", prompt_len=512)      # doctest: +SKIP
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from labkit.costmodel.estimator import ridge_tokens
from labkit.costmodel.profiles import hardware, precision_for
from labkit.costmodel.roofline import phase_time
from labkit.viz._spec import build
from labkit.costmodel.workload import decode_work, prefill_work

__all__ = ["roofline_figure", "roofline_spec", "ridge_figure", "ridge_spec", "prefill_share_grid", "prefill_share_figure", "WORKLOADS",
           "machine_check_figure"]

PREFILL_COLOR, DECODE_COLOR = "#d62728", "#1f77b4"
# (prompt, reply) medians of request traces: Splitwise (Azure) conversation and coding traces; a RAG-like shape
WORKLOADS = {"chat (1020 / 129)": (1020, 129), "coding (1500 / 13)": (1500, 13), "RAG (4096 / 16)": (4096, 16),
             "llm-analysis example (512 / 32)": (512, 32)}


def _phases(config, hw, prompt_len, context, batch, bits, tp, eff):
    pw = prefill_work(config, prompt_len, batch, tp=tp, **bits)
    dw = decode_work(config, context, batch, tp=tp, **bits)
    return phase_time(pw, hw, tp=tp, **bits, **eff), phase_time(dw, hw, tp=tp, **bits, **eff)


def roofline_spec(config, hw, prompt_len: int = 512, context: int | None = None, batch: int = 1, weight_bits=16,
                  kv_bits=16, act_bits=16, tp: int = 1, compute_eff=None, mem_eff=None) -> dict:
    hw = hardware(hw)
    context = prompt_len if context is None else context
    bits = dict(weight_bits=weight_bits, kv_bits=kv_bits, act_bits=act_bits)
    ce = hw.compute_eff if compute_eff is None else compute_eff
    me = hw.mem_eff if mem_eff is None else mem_eff
    precision = precision_for(weight_bits, act_bits)
    peak, bw = hw.peak_flops(precision), hw.mem_bw_gbs * 1e9
    ai = np.logspace(-1, 5, 200)
    pre, dec = _phases(config, hw, prompt_len, context, batch, bits, tp, dict(compute_eff=ce, mem_eff=me))
    traces = [dict(x=ai, y=np.minimum(peak, ai * bw)), dict(x=ai, y=np.minimum(peak * ce, ai * bw * me))]
    for name, pt in (("prefill", pre), ("decode step", dec)):
        flops, nbytes = float(pt.flops), float(sum(pt.level_bytes.values()))
        traces.append(dict(x=[flops / nbytes], y=[flops / float(pt.time)], text=[f"{name}: {pt.bound}-bound"]))
    ridge = hw.ridge_intensity(precision, ce, me)
    traces.append(dict(x=[ridge, ridge], y=[peak * ce / 1e4, peak * ce]))
    tok = ridge_tokens(hw, weight_bits, act_bits, ce, me)
    return {"traces": traces, "title": f"{hw.name}: ridge at {ridge:,.0f} FLOP/B = {tok:,.0f} tokens per weight read "
                                       f"(prompt {prompt_len}, decode at context {context}, batch {batch})"}


def roofline_figure(config, hw, prompt_len: int = 512, context: int | None = None, batch: int = 1, weight_bits=16,
                    kv_bits=16, act_bits=16, tp: int = 1, compute_eff=None, mem_eff=None) -> go.Figure:
    """Attainable FLOP/s vs arithmetic intensity, with the prefill and one decode step placed on it."""
    fig = go.Figure([go.Scatter(mode="lines", name="peak roof", line=dict(color="#999", dash="dash")),
                     go.Scatter(mode="lines", name="achievable roof", line=dict(color="black")),
                     go.Scatter(mode="markers+text", name="prefill", textposition="bottom center",
                                marker=dict(size=14, color=PREFILL_COLOR)),
                     go.Scatter(mode="markers+text", name="decode step", textposition="bottom right",
                                marker=dict(size=14, color=DECODE_COLOR)),
                     go.Scatter(mode="lines", name="ridge", line=dict(color="#2ca02c", dash="dot"))])
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP per byte moved)")
    fig.update_yaxes(type="log", title="FLOP/s")
    return build(fig, roofline_spec(config, hw, prompt_len, context, batch, weight_bits, kv_bits, act_bits, tp,
                                    compute_eff, mem_eff))


def ridge_spec(config, hw, prompt_len: int = 512, batch: int = 1, weight_bits=16, kv_bits=16, act_bits=16,
               tp: int = 1, compute_eff=None, mem_eff=None) -> dict:
    hw = hardware(hw)
    bits = dict(weight_bits=weight_bits, kv_bits=kv_bits, act_bits=act_bits)
    eff = dict(compute_eff=compute_eff, mem_eff=mem_eff)
    tokens = np.unique(np.round(np.logspace(0, 5, 120)).astype(int))
    pre = phase_time(prefill_work(config, tokens, 1, tp=tp, **bits), hw, tp=tp, **bits, **eff).time
    step = float(phase_time(decode_work(config, [1], 1, tp=tp, **bits), hw, tp=tp, **bits, **eff).time[0])
    here = float(pre[np.searchsorted(tokens, prompt_len)]) if prompt_len in tokens else float(
        phase_time(prefill_work(config, [prompt_len], 1, tp=tp, **bits), hw, tp=tp, **bits, **eff).time[0])
    r = ridge_tokens(hw, weight_bits, act_bits, compute_eff, mem_eff)
    rate = tokens / pre
    return {"traces": [dict(x=tokens, y=rate), dict(x=[1, batch], y=[1 / step, batch / step]),
                       dict(x=[prompt_len], y=[prompt_len / here]),
                       dict(x=[r, r], y=[rate.min() / 3, rate.max() * 3], name=f"ridge: {r:,.0f} tokens")],
            "title": f"{hw.name}: below {r:,.0f} tokens per pass the weights' bytes set the pace"}


def ridge_figure(config, hw, prompt_len: int = 512, batch: int = 1, weight_bits=16, kv_bits=16, act_bits=16,
                 tp: int = 1, compute_eff=None, mem_eff=None) -> go.Figure:
    """Tokens/s vs tokens processed per weight read (prompt tokens, or sequences in a decode batch).

    Below the ridge every extra token is nearly free (the weights are read anyway); above it time grows with tokens.
    """
    fig = go.Figure([go.Scatter(mode="lines", name="prefill: prompt tokens per pass", line=dict(color=PREFILL_COLOR)),
                     go.Scatter(mode="markers", name="decode: batch 1 and the chosen batch (KV reads left out)",
                                marker=dict(color=DECODE_COLOR, size=11)),
                     go.Scatter(mode="markers", name="this prompt", marker=dict(color="black", size=11, symbol="diamond")),
                     go.Scatter(mode="lines", line=dict(color="#2ca02c", dash="dot"))])
    fig.update_xaxes(type="log", title="tokens processed per pass over the weights")
    fig.update_yaxes(type="log", title="tokens per second")
    return build(fig, ridge_spec(config, hw, prompt_len, batch, weight_bits, kv_bits, act_bits, tp, compute_eff, mem_eff))


def prefill_share_grid(config, hw, prompt_lens, reply_lens, batch: int = 1, **settings):
    """Share of a request's time spent in prefill, for every (prompt, reply) pair: array [len(prompt), len(reply)].

    Uses one decode sweep over all contexts and prefix sums, so a 40 x 40 grid costs one roofline pass.
    """
    hw = hardware(hw)
    L = np.asarray(prompt_lens, dtype=int)
    n = np.asarray(reply_lens, dtype=int)
    bits = {k: settings.get(k, 16) for k in ("weight_bits", "kv_bits", "act_bits")}
    eff = {k: settings.get(k) for k in ("compute_eff", "mem_eff")}
    pre = phase_time(prefill_work(config, L, batch, **bits), hw, **bits, **eff).time
    ctx = np.arange(0, L.max() + n.max() + 1)
    step = phase_time(decode_work(config, ctx, batch, **bits), hw, **bits, **eff).time
    prefix = np.concatenate([[0.0], np.cumsum(step)])                     # prefix[c] = sum of steps at contexts < c
    dec = prefix[(L[:, None] + n[None, :] - 1).clip(min=0)] - prefix[L[:, None]]   # steps at L .. L + n - 2
    return pre[:, None] / (pre[:, None] + dec)


def prefill_share_figure(config, hw, batch: int = 1, **settings) -> go.Figure:
    """Heat map of the prefill share over prompt and reply lengths, with the articles' 40-60 % band outlined."""
    hw = hardware(hw)
    prompts = np.unique(np.round(np.logspace(np.log10(16), np.log10(8192), 40)).astype(int))
    replies = np.unique(np.round(np.logspace(0, np.log10(1024), 40)).astype(int))
    share = prefill_share_grid(config, hw, prompts, replies, batch, **settings)
    fig = go.Figure(go.Heatmap(x=replies, y=prompts, z=share * 100, colorscale="RdBu_r", zmin=0, zmax=100,
                               colorbar=dict(title="% prefill")))
    fig.add_trace(go.Contour(x=replies, y=prompts, z=share * 100, contours=dict(start=40, end=60, size=20, coloring="none"),
                             line=dict(color="black", width=2), showscale=False, name="40-60 %", hoverinfo="skip"))
    names = list(WORKLOADS)
    fig.add_trace(go.Scatter(x=[WORKLOADS[k][1] for k in names], y=[WORKLOADS[k][0] for k in names], mode="markers",
                             text=names, marker=dict(color="black", size=9), name="workloads"))
    for k in names:  # labels on a light box: readable on the dark and the light cells alike (log axes take log10)
        fig.add_annotation(x=np.log10(WORKLOADS[k][1]), y=np.log10(WORKLOADS[k][0]), text=k, showarrow=False, yshift=14,
                           bgcolor="rgba(255,255,255,0.85)", font=dict(size=11))
    fig.update_xaxes(type="log", title="reply length (tokens)")
    fig.update_yaxes(type="log", title="prompt length (tokens)")
    fig.update_layout(height=460, margin=dict(t=60, l=60, r=20, b=50), showlegend=False,
                      title=f"Share of the time in prefill on {hw.name}: a property of the request, not of the model")
    return fig


def machine_check_figure(result: dict) -> go.Figure:
    """Measured vs modelled decode step time on this machine (from `labkit.benchmarks.machinecheck.compare`)."""
    steps = np.arange(1, len(result["measured_step_s"]) + 1)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=steps, y=np.asarray(result["measured_step_s"]) * 1e3, mode="markers", name="measured",
                             marker=dict(color=DECODE_COLOR)))
    fig.add_trace(go.Scatter(x=steps, y=np.asarray(result["modelled_step_s"]) * 1e3, mode="lines",
                             name="roofline (measured bandwidth and FLOP/s)", line=dict(color="black")))
    fig.update_xaxes(title="decode step")
    fig.update_yaxes(title="ms per token", rangemode="tozero")
    fig.update_layout(height=380, margin=dict(t=60, l=60, r=20, b=50), legend=dict(orientation="h", y=-0.2),
                      title=f"SmolLM2 decode on this machine: measured / modelled = {result['ratio']:.2f}")
    return fig
