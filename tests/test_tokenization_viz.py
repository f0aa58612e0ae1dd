"""Chapter 01's figures, widgets, statistics and exercise checkers."""
import html
import re

import pytest

from labkit import exercises, viz, widgets
from labkit.data import corpus
from labkit.tokenizer.train import get_stats, merge
from labkit.tokenizer import BPETokenizer
from labkit.tokenizer.stats import compression, truncate, vocab_sweep

TRAIN = corpus.load_text("val")[:30_000]
EVAL = "Now are our brows bound with victorious wreaths; our bruised arms hung up for monuments."


@pytest.fixture(scope="module")
def tok():
    return BPETokenizer.train(TRAIN, 256 + 120, special_tokens=["<|endoftext|>"])


@pytest.fixture(scope="module")
def sweep():
    return vocab_sweep(TRAIN, EVAL, [256, 280, 320, 376])


def _span_texts(markup: str) -> list[str]:
    return [html.unescape(s) for s in re.findall(r"<span [^>]*>(.*?)</span>", markup, flags=re.S)]


def test_token_boundaries_show_every_token_and_the_whole_text(tok):
    text = "Now is the winter 中 😀\n<|endoftext|>"
    markup = viz.token_boundaries_html(tok, text)
    shown = "".join(_span_texts(markup)).replace("·", " ").replace("↵\n", "\n")
    assert shown == text
    n = len(tok.encode(text))
    assert f"{n} tokens" in markup and markup._repr_html_() == str(markup)
    assert "background:#444444" in markup  # the special token stands out
    assert "outline:1px dashed" in markup  # '中' is split over byte tokens in a tiny vocabulary


def test_token_spans_never_split_a_character(tok):
    spans = viz.token_spans(tok, "é中😀 Now")
    assert [t for _, t in spans][:3] == ["é", "中", "😀"]
    assert sum(len(ids) for ids, _ in spans) == len(tok.encode("é中😀 Now"))


def test_token_boundaries_escape_html(tok):
    markup = viz.token_boundaries_html(tok, "<b>&</b>")
    assert "<b>" not in markup and "</b>" not in markup and "&lt;" in markup
    assert "".join(_span_texts(markup)) == "<b>&</b>"


def test_compression_counts(tok):
    c = compression(tok, "Now is the winter")
    assert c["bytes"] == 17 and c["words"] == 4 and c["tokens"] == len(tok.encode("Now is the winter"))
    assert c["bytes_per_token"] == pytest.approx(17 / c["tokens"])


def test_truncated_tokenizer_equals_training_to_that_size(tok):
    small = truncate(tok, 300)
    assert small.merges == BPETokenizer.train(TRAIN, 300).merges and small.vocab_size == 300
    with pytest.raises(ValueError, match="vocab_size"):
        truncate(tok, 10_000)


def test_sweep_compression_grows_with_vocabulary(sweep):
    assert sweep.vocab_sizes == [256, 280, 320, 376]
    assert sweep.bytes_per_token[0] == pytest.approx(1.0)  # bytes only: one token per byte
    assert all(a < b for a, b in zip(sweep.bytes_per_token, sweep.bytes_per_token[1:]))
    assert all(a >= b for a, b in zip(sweep.tokens_per_word, sweep.tokens_per_word[1:]))
    assert all(a <= b for a, b in zip(sweep.train_seconds, sweep.train_seconds[1:]))


def test_vocab_size_figure_marks_the_chosen_size(sweep):
    fig = viz.vocab_size_figure(sweep, 320)
    markers = [t for t in fig.data if t.mode == "markers"]
    assert len(markers) == 3 and all(list(m.x) == [320] for m in markers)
    assert list(markers[0].y) == [sweep.at(320)["bytes_per_token"]]
    assert "vocab 320" in fig.layout.title.text.replace("<br>", " ")
    with pytest.raises(ValueError, match="vocab_size must be one of"):
        viz.vocab_size_figure(sweep, 333)


def test_token_costs_scale_with_tokens(tok):
    rows = viz.token_costs({"tiny": tok}, {"en": "Now is the winter", "zh": "现在是冬天"}, n_params=1e8)
    en, zh = rows
    assert zh["tokens"] == 15 and zh["prefill_gflop"] == pytest.approx(2 * 1e8 * 15 / 1e9)  # 5 characters x 3 bytes
    fig = viz.token_cost_figure(rows)
    assert list(fig.data[0].y) == [en["tokens"], zh["tokens"]]
    with pytest.raises(ValueError, match="n_params"):
        viz.token_costs({"tiny": tok}, {"en": "x"}, n_params=0)
    (with_head,) = viz.token_costs({"tiny": tok}, {"zh": "现在是冬天"}, n_params=1e8, head_params=3e7)
    assert with_head["prefill_gflop"] == pytest.approx(2 * (1e8 * 15 + 3e7) / 1e9)  # the head runs once, not per token


def test_widgets_build_and_react(tok, sweep):
    w = widgets.vocab_size_explorer(sweep, sample="Now is the winter")
    slider, fig, view = w.children
    before = view.value
    slider.value = 256
    assert fig.layout.title.text.startswith("vocab 256") and view.value != before
    t = widgets.token_boundaries({"tiny": tok}, text="Now")
    menu, box, out = t.children
    box.value = "Now is the winter"
    assert f"{len(tok.encode('Now is the winter'))} tokens" in out.value


def test_exercise_checkers_accept_the_reference_and_reject_bugs(capsys):
    assert exercises.check_get_stats(get_stats)
    assert not exercises.check_get_stats(lambda ids: {p: 1 for p in zip(ids, ids[1:])})  # forgets to count
    assert exercises.check_merge(merge)

    def overlapping(ids, pair, idx):  # merges overlapping occurrences: [5, 5, 5] -> [6, 6]
        out = []
        for i in range(len(ids) - 1):
            out.append(idx if (ids[i], ids[i + 1]) == pair else ids[i])
        return out

    assert not exercises.check_merge(overlapping)
    from labkit.exercises.tokenization import _reference_encode

    assert exercises.check_encode_with_merges(_reference_encode)
    assert not exercises.check_encode_with_merges(lambda ids, merges: ids)  # never merges
    out = capsys.readouterr().out
    assert out.count("[PASS]") == 3 and out.count("[FAIL]") == 3


def _leftmost_merge(ids, merges):  # merges the leftmost learned pair first: wrong when merges compete
    ids = list(ids)
    while True:
        i = next((i for i in range(len(ids) - 1) if (ids[i], ids[i + 1]) in merges), None)
        if i is None:
            return ids
        ids[i:i + 2] = [merges[(ids[i], ids[i + 1])]]


def test_the_merge_checker_fails_the_leftmost_pair_first():
    assert not exercises.check_encode_with_merges(_leftmost_merge)


def _most_frequent_merge(ids, merges):  # the training rule (most frequent pair, ties by lowest id), not encoding's
    from collections import Counter

    ids = list(ids)
    while True:
        counts = Counter(p for p in zip(ids, ids[1:]) if p in merges)
        if not counts:
            return ids
        pair = max(counts, key=lambda p: (counts[p], -merges[p]))
        out, i = [], 0
        while i < len(ids):
            if i < len(ids) - 1 and (ids[i], ids[i + 1]) == pair:
                out.append(merges[pair])
                i += 2
            else:
                out.append(ids[i])
                i += 1
        ids = out


def _merges_in_dict_order(ids, merges):  # one sweep per merge, in the dict's order: right only when it is id order
    ids = list(ids)
    for pair, new in merges.items():
        out, i = [], 0
        while i < len(ids):
            if i < len(ids) - 1 and (ids[i], ids[i + 1]) == pair:
                out.append(new)
                i += 2
            else:
                out.append(ids[i])
                i += 1
        ids = out
    return ids


@pytest.mark.parametrize("wrong", [_most_frequent_merge, _merges_in_dict_order])
def test_the_merge_checker_fails_the_training_rule_and_the_dict_order(wrong):
    assert not exercises.check_encode_with_merges(wrong)
