"""Chapter 03's exercise checkers pass the reference answers, print [TODO] for the stub, and fail the
plausible wrong answers: a formula applied where it does not hold, a stall counted in the wrong metric,
a prefill extrapolated without its fixed or its quadratic cost."""
import statistics

import numpy as np
import pytest

from labkit import exercises
from labkit.costmodel.workload import bits_per_element
from labkit.costmodel.profiles import precision_for, _lookup
from tests.conftest import assert_checker_separates


# --- the modelled half -------------------------------------------------------------------------------

def ridge_right(spec, wb, ab):
    peak = _lookup(spec["peak_tflops"], precision_for(wb, ab), "spec") * 1e12 * spec["compute_eff"]
    bw = spec["mem_bw_gbs"] * 1e9 * spec["mem_eff"]
    return peak * bits_per_element(wb, 64, 16, 16) / 8 / (2 * bw)


def ridge_no_scales(spec, wb, ab):       # forgets the group's scale and zero point
    peak = _lookup(spec["peak_tflops"], precision_for(wb, ab), "spec") * 1e12 * spec["compute_eff"]
    return peak * wb / 8 / (2 * spec["mem_bw_gbs"] * 1e9 * spec["mem_eff"])


def ridge_weight_precision(spec, wb, ab):  # multiplies in the weights' precision (W4A16 at the int4 peak)
    peak = _lookup(spec["peak_tflops"], precision_for(wb, wb), "spec") * 1e12 * spec["compute_eff"]
    return peak * bits_per_element(wb, 64, 16, 16) / 8 / (2 * spec["mem_bw_gbs"] * 1e9 * spec["mem_eff"])


def ridge_peaks(spec, wb, ab):           # peak against peak, the efficiencies left out
    peak = _lookup(spec["peak_tflops"], precision_for(wb, ab), "spec") * 1e12
    return peak * bits_per_element(wb, 64, 16, 16) / 8 / (2 * spec["mem_bw_gbs"] * 1e9)


@pytest.mark.parametrize("wrong", [ridge_no_scales, ridge_weight_precision, ridge_peaks])
def test_device_ridge_separates(wrong, capsys):
    assert_checker_separates("check_device_ridge", ridge_right, wrong, capsys)


def equal_right(F, BW, b, n):
    return n * max(1.0, F * b / (2 * BW))


@pytest.mark.parametrize("wrong", [
    lambda F, BW, b, n: n * F * b / (2 * BW),          # forgets that a step may be compute-bound
    lambda F, BW, b, n: F * b / (2 * BW),              # the ridge itself, whatever n
    lambda F, BW, b, n: n * F / (2 * BW),              # bytes per weight left out
    lambda F, BW, b, n: (n - 1) * max(1.0, F * b / (2 * BW)),
])
def test_equal_time_prompt_separates(wrong, capsys):
    assert_checker_separates("check_equal_time_prompt", equal_right, wrong, capsys)


def test_equal_time_prompt_accepts_whole_tokens(capsys):
    """The longest prompt in whole tokens is as right as the exact length; one token short or over is not."""
    import math

    assert_checker_separates("check_equal_time_prompt", lambda *a: math.floor(equal_right(*a)),
                             lambda *a: math.floor(equal_right(*a)) - 1, capsys)
    assert not exercises.check_equal_time_prompt(lambda *a: math.ceil(equal_right(*a)) + (equal_right(*a) % 1 == 0))
    assert not exercises.check_equal_time_prompt(lambda *a: None)   # not a number: a [FAIL], not a crash


# --- the measured half -------------------------------------------------------------------------------

def metrics_right(request_time, token_times):
    if token_times[0] < request_time or any(b < a for a, b in zip(token_times, token_times[1:])):
        raise ValueError("times go backwards")
    itl = [b - a for a, b in zip(token_times, token_times[1:])]
    if not itl:
        return {"ttft": token_times[0] - request_time, "itl_median": None, "itl_p90": None, "tpot": None}
    return {"ttft": token_times[0] - request_time, "itl_median": statistics.median(itl),
            "itl_p90": float(np.percentile(itl, 90)), "tpot": (token_times[-1] - token_times[0]) / len(itl)}


def metrics_first_gap_is_itl(request_time, token_times):   # counts the TTFT as one more ITL
    r = metrics_right(request_time, token_times)
    gaps = [token_times[0] - request_time] + [b - a for a, b in zip(token_times, token_times[1:])]
    return {**r, "tpot": sum(gaps) / len(gaps)}


def metrics_p90_is_max(request_time, token_times):
    r = metrics_right(request_time, token_times)
    return {**r, "itl_p90": max(b - a for a, b in zip(token_times, token_times[1:]))} if r["tpot"] else r


def metrics_median_is_mean(request_time, token_times):
    r = metrics_right(request_time, token_times)
    return {**r, "itl_median": r["tpot"]}


def metrics_no_checks(request_time, token_times):   # accepts times that go backwards
    try:
        return metrics_right(request_time, token_times)
    except ValueError:
        return {"ttft": 0.0, "itl_median": None, "itl_p90": None, "tpot": None}


@pytest.mark.parametrize("wrong", [metrics_first_gap_is_itl, metrics_p90_is_max, metrics_median_is_mean,
                                   metrics_no_checks])
def test_stream_metrics_separates(wrong, capsys):
    assert_checker_separates("check_stream_metrics", metrics_right, wrong, capsys)


def predict_right(rows, p):
    x = [r["prompt_len"] for r in rows]
    y = [r["ttft_s"] for r in rows]
    return float(np.polyval(np.polyfit(x, y, 2), p))


def predict_proportional(rows, p):      # the TTFT scales with the prompt from the longest one measured
    last = max(rows, key=lambda r: r["prompt_len"])
    return last["ttft_s"] * p / last["prompt_len"]


def predict_linear_ends(rows, p):       # a straight line through the last two points
    rows = sorted(rows, key=lambda r: r["prompt_len"])
    (x0, y0), (x1, y1) = [(r["prompt_len"], r["ttft_s"]) for r in rows[-2:]]
    return y1 + (y1 - y0) * (p - x1) / (x1 - x0)


def predict_unsorted_ends(rows, p):     # the same, trusting the rows' order
    (x0, y0), (x1, y1) = [(r["prompt_len"], r["ttft_s"]) for r in rows[-2:]]
    return y1 + (y1 - y0) * (p - x1) / (x1 - x0)


@pytest.mark.parametrize("wrong", [predict_proportional, predict_linear_ends, predict_unsorted_ends])
def test_ttft_prediction_separates(wrong, capsys):
    assert_checker_separates("check_ttft_prediction", predict_right, wrong, capsys)


@pytest.mark.parametrize("name", ["check_device_ridge", "check_equal_time_prompt", "check_stream_metrics",
                                  "check_ttft_prediction"])
def test_a_stub_prints_todo(name, capsys):
    def stub(*args):
        raise NotImplementedError

    assert not getattr(exercises, name)(stub)
    assert "[TODO]" in capsys.readouterr().out


def test_ttft_prediction_accepts_a_clamped_fit(capsys):
    """A fit that drops a negative P² term (noise, not attention) is as right on the checker's laws."""
    def clamped(rows, p):
        x = [r["prompt_len"] for r in rows]
        y = [r["ttft_s"] for r in rows]
        fit = np.polyfit(x, y, 2)
        if fit[0] < 0:
            fit = np.r_[0.0, np.polyfit(x, y, 1)]
        return float(np.polyval(fit, p))

    assert exercises.check_ttft_prediction(clamped)
    assert "[PASS]" in capsys.readouterr().out
