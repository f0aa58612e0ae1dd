"""Samplers against their published definitions: the reference vectors, HF parity,
properties (hypothesis), a chi-squared test of the sampled frequencies, and bad input."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from labkit.sampling.processors import top_k_filter, top_p_filter
from labkit.sampling import SamplingParams, build_pipeline, make_generator, process_logits, process_stages, sample_next

P = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
L = P.log()


def kept(logits) -> list[int]:
    return torch.isfinite(logits).nonzero().flatten().tolist()


# --- the vectors of the reference table -------------------------------------------------

@pytest.mark.parametrize(
    "knob, expected",
    [
        (dict(top_k=2), [0, 1]),
        (dict(top_p=0.75), [0, 1]),
        (dict(top_p=0.9), [0, 1, 2]),
        (dict(min_p=0.2), [0, 1, 2]),
        (dict(min_p=0.35), [0, 1]),  # threshold 0.175 > 0.15
        (dict(typical_p=0.5), [0, 1]),
        (dict(typical_p=0.9), [0, 1, 2]),
    ],
)
def test_reference_kept_sets(knob, expected):
    for order in ("hf", "llama.cpp"):
        assert kept(process_logits(L, None, temperature=1.0, order=order, **knob)) == expected
        assert kept(process_logits(L.float(), None, temperature=1.0, order=order, **knob)) == expected


def test_reference_temperature():
    assert torch.allclose(process_logits(L, None, temperature=0.5).softmax(-1),
                          torch.tensor([0.6849, 0.2466, 0.0616, 0.0068], dtype=torch.float64), atol=1e-4)
    assert torch.allclose(process_logits(L, None, temperature=2.0).softmax(-1),
                          torch.tensor([0.3790, 0.2936, 0.2076, 0.1198], dtype=torch.float64), atol=1e-4)


def test_reference_repetition_penalty():
    logits = torch.tensor([2.0, -1.0, 0.5, 0.0])
    seen = [0, 1, 3, 3, 0]  # applied once per distinct token, however often it was seen
    assert process_logits(logits, seen, temperature=1.0, repetition_penalty=2.0).tolist() == [1.0, -2.0, 0.5, 0.0]
    assert process_logits(logits, seen, temperature=1.0, repetition_penalty=0.5).tolist() == [4.0, -0.5, 0.5, 0.0]


def test_frequency_and_presence_penalties():
    logits = torch.tensor([1.0, 1.0, 1.0, 1.0])
    out = process_logits(logits, [2, 2, 2, 0], temperature=1.0, frequency_penalty=0.5, presence_penalty=0.25)
    assert out.tolist() == [1.0 - 0.5 - 0.25, 1.0, 1.0 - 1.5 - 0.25, 1.0]


def test_order_changes_which_tokens_survive():
    # HF: T=0.5 first sharpens to [.68, .25, .06, .01], so top_p=0.9 keeps 2 tokens.
    # llama.cpp: top_p=0.9 sees the T=1 distribution and keeps 3; temperature comes last.
    hf = process_logits(L, None, temperature=0.5, top_p=0.9, order="hf")
    cpp = process_logits(L, None, temperature=0.5, top_p=0.9, order="llama.cpp")
    assert kept(hf) == [0, 1] and kept(cpp) == [0, 1, 2]
    assert [n for n, _ in process_stages(L, None, temperature=0.5, top_p=0.9, order="llama.cpp")] == [
        "input", "top_p", "temperature"]


def test_greedy_is_argmax_with_lowest_id_tie_break_after_penalties():
    logits = torch.tensor([1.0, 3.0, 0.0, 3.0])
    assert sample_next(logits, []) == 1
    assert kept(process_logits(logits, [])) == [1]
    # the repetition penalty still applies in greedy mode (HF's do_sample=False)
    assert sample_next(logits, [1], repetition_penalty=2.0) == 3
    # truncation knobs are ignored by greedy decoding
    assert sample_next(logits, [], top_k=1, typical_p=0.1) == 1
    batch = torch.tensor([[0.0, 2.0, 2.0], [5.0, 5.0, 5.0]])
    assert sample_next(batch, None).tolist() == [1, 0]


def test_history_forms_and_padding():
    logits = torch.tensor([[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]])
    want = torch.tensor([[1.0, 2.0, 2.0], [2.0, 2.0, 1.0]])
    for history in ([[0, -1], [2, 2]], torch.tensor([[0, -1], [2, 2]])):
        assert torch.equal(process_logits(logits, history, temperature=1.0, repetition_penalty=2.0), want)
    assert process_logits(logits[0], torch.tensor([1]), temperature=1.0, repetition_penalty=2.0).tolist() == [2.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="history"):
        process_logits(logits, [0, 1], temperature=1.0, repetition_penalty=2.0)
    with pytest.raises(ValueError, match="vocab size"):
        process_logits(logits[0], [3], temperature=1.0, repetition_penalty=2.0)


def test_neutral_pipeline_is_empty_and_from_kwargs():
    assert build_pipeline(SamplingParams(temperature=1.0)) == []
    p = SamplingParams.from_kwargs(temperature=0.7, top_k=None, top_p=0.9)
    assert (p.temperature, p.top_k, p.top_p) == (0.7, 0, 0.9)
    assert SamplingParams.from_kwargs(p, top_p=None, min_p=0.1).top_p == 0.9
    with pytest.raises(TypeError, match="unknown"):
        SamplingParams.from_kwargs(topp=0.9)


# --- parity with Hugging Face's processors -------------------------------------------------

def _hf_pipeline(params: SamplingParams):
    lp = pytest.importorskip("transformers.generation.logits_process")
    procs = []
    if params.repetition_penalty != 1.0:
        procs.append(lp.RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if params.temperature != 1.0:
        procs.append(lp.TemperatureLogitsWarper(params.temperature))
    if params.top_k:
        procs.append(lp.TopKLogitsWarper(params.top_k))
    if params.top_p != 1.0:
        procs.append(lp.TopPLogitsWarper(params.top_p))
    if params.min_p:
        procs.append(lp.MinPLogitsWarper(params.min_p))
    if params.typical_p != 1.0:
        procs.append(lp.TypicalLogitsWarper(params.typical_p))
    return procs


def _top_p_margin(logits: torch.Tensor, top_p: float) -> float:
    """Distance of the descending cumulative mass to top_p, over all rows (float64)."""
    cum = logits.double().softmax(-1).sort(dim=-1, descending=True).values.cumsum(-1)
    return float((cum - top_p).abs().min())


PARITY_CASES = [
    SamplingParams(temperature=0.7, top_k=10),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.9, min_p=0.05),
    SamplingParams(temperature=1.0, typical_p=0.7),
    SamplingParams(temperature=0.8, repetition_penalty=1.3, top_k=20, top_p=0.9, min_p=0.02),
    SamplingParams(temperature=1.5, repetition_penalty=0.8, top_k=30, top_p=0.95, typical_p=0.9),
]


@pytest.mark.parametrize("params", PARITY_CASES, ids=lambda p: str(p)[15:70])
def test_parity_with_transformers(params):
    procs = _hf_pipeline(params)
    gen = torch.Generator().manual_seed(1234)
    checked = 0
    for _ in range(20):
        logits = torch.randn(4, 64, generator=gen) * 3  # [B, V] float32
        history = torch.randint(0, 64, (4, 12), generator=gen)
        # stay away from exact top-p boundaries (float32 vs float64 may disagree there)
        tempered = logits if params.temperature == 1.0 else logits / params.temperature
        if params.top_p != 1.0 and _top_p_margin(tempered, params.top_p) < 1e-4:
            continue
        want = logits.clone()
        for proc in procs:
            want = proc(history, want)
        got = process_logits(logits, history, params)
        assert torch.equal(torch.isfinite(got), torch.isfinite(want))
        assert torch.allclose(got[torch.isfinite(got)], want[torch.isfinite(want)], rtol=1e-6, atol=1e-6)
        checked += 1
    assert checked >= 15


# --- properties --------------------------------------------------------------------------

logit_rows = st.tuples(st.integers(1, 40), st.integers(0, 2**31 - 1), st.floats(0.1, 8.0)).map(
    lambda a: torch.randn(a[0], generator=torch.Generator().manual_seed(a[1]), dtype=torch.float64) * a[2]
)
params_st = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.5]),
    top_k=st.integers(0, 50),
    top_p=st.floats(0.01, 1.0),
    min_p=st.floats(0.0, 1.0),
    typical_p=st.floats(0.01, 1.0),
    repetition_penalty=st.floats(0.5, 2.0),
    frequency_penalty=st.floats(-1.0, 1.0),
    presence_penalty=st.floats(-1.0, 1.0),
    order=st.sampled_from(["hf", "llama.cpp"]),
)


@settings(max_examples=150, deadline=None)
@given(logits=logit_rows, params=params_st, data=st.data())
def test_kept_set_is_never_empty(logits, params, data):
    history = data.draw(st.lists(st.integers(0, logits.numel() - 1), max_size=10))
    out = process_logits(logits, history, params)
    assert torch.isfinite(out).sum() >= 1
    assert not torch.isnan(out).any()


@settings(max_examples=150, deadline=None)
@given(logits=logit_rows, top_p=st.floats(0.01, 0.999))
def test_top_p_keeps_the_smallest_set_with_mass_at_least_p(logits, top_p):
    assume(_top_p_margin(logits, top_p) > 1e-9)
    out = top_p_filter(logits.unsqueeze(0), top_p)[0]
    probs = logits.softmax(-1)
    keep = torch.isfinite(out)
    assert probs[keep].sum() >= top_p
    if keep.sum() > 1:  # without its least likely member the set would fall short of p
        assert probs[keep].sum() - probs[keep].min() < top_p
    if (~keep).any():  # the kept tokens are the most likely ones
        assert probs[keep].min() >= probs[~keep].max()


@settings(max_examples=100, deadline=None)
@given(logits=logit_rows, params=params_st, seed=st.integers(0, 2**31 - 1), data=st.data())
def test_pipeline_is_permutation_equivariant(logits, params, seed, data):
    V = logits.numel()
    assume(params.top_p == 1.0 or _top_p_margin(logits / max(params.temperature, 1e-3), params.top_p) > 1e-9)
    history = torch.tensor(data.draw(st.lists(st.integers(0, V - 1), max_size=8)), dtype=torch.long)
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(seed))
    inverse = torch.argsort(perm)  # token i of the original vocab is token inverse[i] after permuting
    out = process_logits(logits, history, params)
    out_perm = process_logits(logits[perm], inverse[history], params)
    if params.temperature == 0 and (logits == logits.max()).sum() > 1:
        return  # greedy's lowest-id tie-break is, by design, not equivariant
    assert torch.equal(torch.isfinite(out_perm), torch.isfinite(out[perm]))
    assert torch.allclose(out_perm[torch.isfinite(out_perm)], out[perm][torch.isfinite(out[perm])], rtol=1e-12, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(logits=logit_rows, extra=st.integers(0, 10), temperature=st.floats(0.2, 3.0))
def test_identities_top_k_at_least_v_and_top_p_one(logits, extra, temperature):
    V = logits.numel()
    row = logits.unsqueeze(0)
    assert torch.equal(top_k_filter(row, V + extra), row)
    assert torch.equal(top_p_filter(row, 1.0), row)  # |logits| <= ~40, no probability underflows to 0
    plain = process_logits(logits, None, temperature=temperature)
    assert torch.equal(process_logits(logits, None, temperature=temperature, top_k=V + extra, top_p=1.0), plain)
    assert torch.equal(process_logits(logits, None, temperature=temperature, min_p=0.0, typical_p=1.0), plain)


# --- sampling frequencies: a chi-squared test -------------------------------------------------

def chi2_pvalue(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-squared p-value of counts against probabilities (cells with p = 0 excluded)."""
    n = observed.sum()
    mask = expected_probs > 0
    expected = expected_probs[mask].double() * n
    stat = ((observed[mask].double() - expected) ** 2 / expected).sum()
    df = int(mask.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def test_sampling_frequencies_match_the_processed_softmax():
    logits = torch.tensor([2.0, 1.5, 1.0, 0.3, 0.0, -0.5, -1.0, -3.0])
    params = SamplingParams(temperature=0.8, top_k=6, top_p=0.95, repetition_penalty=1.2)
    history = [0, 3]
    n = 40_000
    expected = process_logits(logits, history, params).softmax(-1)
    draws = sample_next(logits.expand(n, -1), [history] * n, params, generator=make_generator(0))
    counts = torch.bincount(draws, minlength=8)
    assert counts[expected == 0].sum() == 0  # never a removed token
    assert chi2_pvalue(counts, expected) > 1e-3
    # negative control: the same counts are far from the unprocessed softmax
    assert chi2_pvalue(counts, logits.softmax(-1)) < 1e-6 or counts[logits.softmax(-1) > 0].min() == 0


def test_seeded_sampling_is_reproducible():
    logits = torch.randn(1000, 50, generator=torch.Generator().manual_seed(3))
    a = sample_next(logits, None, temperature=1.0, generator=make_generator(7))
    b = sample_next(logits, None, temperature=1.0, generator=make_generator(7))
    c = sample_next(logits, None, temperature=1.0, generator=make_generator(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert isinstance(sample_next(logits[0], None, temperature=1.0, generator=make_generator(7)), int)


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-0.1), r"temperature must be >= 0 \(0 means greedy\), got -0.1"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
        (dict(top_k=-1), r"top_k must be >= 0"),
        (dict(min_p=-0.1), r"min_p must be in \[0, 1\], got -0.1"),
        (dict(min_p=1.1), r"min_p must be in \[0, 1\]"),
        (dict(typical_p=0.0), r"typical_p must be in \(0, 1\]"),
        (dict(repetition_penalty=0.0), r"repetition_penalty must be > 0"),
        (dict(repetition_penalty=-1.0), r"repetition_penalty must be > 0"),
        (dict(temperature=float("nan")), r"temperature must be finite"),
        (dict(order="vllm"), r"order must be one of"),
    ],
)
def test_bad_parameters_raise_value_error_naming_the_range(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)
    with pytest.raises(ValueError, match=match):
        process_logits(L, None, **kwargs)


def test_wrong_types():
    with pytest.raises(TypeError, match="top_k must be an int"):
        SamplingParams(top_k=2.5)
    with pytest.raises(TypeError, match="floating point"):
        process_logits(torch.tensor([1, 2, 3]), None)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_positive_inf_logits_are_refused(bad):
    logits = torch.tensor([0.0, bad, 1.0])
    with pytest.raises(ValueError, match="NaN|\\+inf"):
        sample_next(logits, None, temperature=1.0, generator=make_generator(0))
    with pytest.raises(ValueError, match="NaN|\\+inf"):
        sample_next(logits, None)  # greedy too


def test_masked_entries_are_fine_but_an_all_masked_row_is_not():
    ninf = float("-inf")
    assert sample_next(torch.tensor([ninf, 0.0, ninf]), None, temperature=1.0, generator=make_generator(0)) == 1
    with pytest.raises(ValueError, match="every token"):
        sample_next(torch.tensor([[0.0, 1.0], [ninf, ninf]]), None, temperature=1.0)


def test_tiny_temperature_overflow_is_reported():
    with pytest.raises(ValueError, match="too small"):
        process_logits(torch.tensor([1e30, -1e30]), None, temperature=1e-20)
    assert math.isclose(process_logits(L, None, temperature=1e-3).softmax(-1)[0].item(), 1.0)
