"""Chapter 05's figure, widget and the repetition statistics (its exercises: test_exercises_sampling.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from labkit.sampling import process_logits
from labkit.metrics import distinct_n, repeated_ngram_rate
from labkit.viz import repetition_rate_figure, sampling_pipeline_figure, sampling_stage_probs

LOGITS = torch.randn(200, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2


def test_stage_probs_follow_the_pipeline():
    knobs = dict(temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.3)
    history = [int(LOGITS.argmax())]
    sp = sampling_stage_probs(LOGITS, history, top_n=12, **knobs)
    assert sp.stages == ["input", "repetition penalty", "freq./presence penalty", "temperature", "top-k", "top-p",
                         "min-p", "typical-p"]
    assert sp.active == [True, True, False, True, True, True, False, False]
    final = process_logits(LOGITS, history, **knobs)
    assert sp.kept[-1] == int(torch.isfinite(final).sum()) and sp.kept[4] == 20
    want = torch.softmax(final, -1)[sp.token_ids].numpy()
    np.testing.assert_allclose(np.nan_to_num(sp.probs[-1]), want, atol=1e-12)
    assert np.isnan(sp.probs[-1]).sum() == (~torch.isfinite(final[sp.token_ids])).sum()
    assert sp.token_ids[0] == int(LOGITS.argmax())  # columns: most likely input token first
    # once removed, a token stays removed
    removed = np.isnan(sp.probs)
    assert (removed[1:] >= removed[:-1]).all()


def test_the_order_changes_the_rows_and_the_survivors():
    hf = sampling_stage_probs(LOGITS, temperature=0.5, top_p=0.9, top_n=10, order="hf")
    cpp = sampling_stage_probs(LOGITS, temperature=0.5, top_p=0.9, top_n=10, order="llama.cpp")
    assert cpp.stages[-1] == "temperature" and hf.stages[3] == "temperature"
    assert hf.kept[-1] < cpp.kept[-1]  # thresholds on the sharper distribution keep fewer tokens


def test_greedy_shows_one_survivor():
    sp = sampling_stage_probs(LOGITS, temperature=0.0, top_n=5)
    assert sp.stages[-1] == "greedy (argmax)" and sp.kept[-1] == 1
    assert sp.probs[-1][0] == 1.0 and np.isnan(sp.probs[-1][1:]).all()


def test_pipeline_figure_content():
    class Tok:
        def decode(self, ids):
            return {0: " the", 1: "\n"}.get(ids[0], "x")  # many tokens decode alike

    fig = sampling_pipeline_figure(LOGITS[:6], Tok(), temperature=1.0, top_k=3, top_n=6)
    heat, bar_in, bar_out = fig.data
    assert heat.type == "heatmap" and len(set(heat.x)) == 6  # equal labels are kept apart
    assert sum(1 for row in heat.text[-1] if row) == 3
    assert math.isclose(sum(bar_out.y), 100.0) and math.isclose(sum(bar_in.y), 100.0)
    assert "6 -> 3 tokens" in fig.layout.title.text.replace("<br>", " ")
    with pytest.raises(ValueError, match="top_p"):
        sampling_pipeline_figure(LOGITS, top_p=0.0)


def test_widget_redraws_in_place():
    from labkit.widgets import sampling_pipeline

    box = sampling_pipeline(LOGITS, None, top_n=8, temperature=1.0)
    fig = box.children[-1]
    controls = {c.description: c for col in box.children[0].children for c in col.children}
    heat = fig.data[0]
    controls["top_k (0 = off)"].value = 2
    assert fig.data[0] is heat and "-> 2 tokens" in fig.layout.title.text.replace("<br>", " ")
    controls["temperature"].value = 0.0
    assert "greedy" in fig.layout.title.text.replace("<br>", " ")


def test_repetition_statistics():
    assert repeated_ngram_rate([1, 2, 3, 4], n=2) == 0.0
    assert repeated_ngram_rate([7] * 10, n=3) == 7 / 8
    assert repeated_ngram_rate([1, 2], n=3) == 0.0
    assert distinct_n([1, 2, 1, 2], n=2) == 2 / 3
    with pytest.raises(ValueError, match="n must be"):
        repeated_ngram_rate([1, 2], n=0)
    fig = repetition_rate_figure([1.0, 1.2], [[0.3, 0.5], [0.1, 0.2]])
    assert list(fig.data[1].y) == pytest.approx([0.4, 0.15])
