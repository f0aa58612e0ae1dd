"""The course's size report (`labkit.nbtools.course`): what it counts, and the targets it names as missed."""
from __future__ import annotations

import pytest

from labkit.nbtools import course


def _nb(cells):
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _md(text):
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(text, printed="", tags=(), figure=False):
    outputs = [{"output_type": "stream", "name": "stdout", "text": printed}] if printed else []
    if figure:
        outputs.append({"output_type": "display_data", "data": {"text/plain": "Figure({ lots of words here })",
                                                                 "application/vnd.plotly.v1+json": {}}})
    return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": text, "outputs": outputs,
            "execution_count": 1}


def test_it_counts_prose_printed_words_code_and_exercises():
    nb = _nb([_md("# 01 · Title\n\n**After this lesson** you can count words."), _md(["two ", "words"]),
              _code("x = 1\n\n\ny = 2\n", printed="three printed words\n", figure=True),
              _code("def f():\n    return " + "1 + " * 40 + "1\n", tags=["solution"])])
    counts = course.size(nb)
    assert counts == {"prose": 11, "printed": 3, "code_lines": 4, "longest_cell": 2, "long_lines": 1, "exercises": 1,
                      "objectives": True}
    assert course.misses(counts, "core") == ["1 code lines over 110 characters", "1 exercises < 3"]


def test_a_word_is_a_run_of_letters_or_digits_and_html_tables_count():
    html = {"output_type": "display_data", "data": {"text/html": "<table><tr><td>p99</td><td>1.25</td></tr></table>",
                                                     "text/plain": "<Table>"}}
    cell = _code("t", printed="| rate | 1.25× | · |\n")
    cell["outputs"].append(html)
    counts = course.size(_nb([_md("T(k) = 3.5 ms — k·γ"), cell]))
    assert counts["prose"] == 7          # T, k, 3, 5, ms, and k·γ is two: k, γ
    assert counts["printed"] == 3 + 3    # rate 1 25, then p99 1 25 from the table's cells (not the tags)


def test_a_notebook_over_every_target_is_told_each_one():
    long_cell = "\n".join(f"x{i} = {i}" for i in range(course.MAX_CELL_LINES + 1))
    nb = _nb([_md("# Title\n" + "word " * 3600), _code(long_cell, printed="w " * 1300)])
    miss = course.misses(course.size(nb), "core")
    assert miss == ["prose 3,601 words > 3,500", "printed 1,300 words > 1,200", "a code cell of 26 lines > 25",
                    "0 exercises < 3", "no objectives at the top"]
    assert course.misses(course.size(nb), "deep dive")[:1] == ["a code cell of 26 lines > 25"]  # its larger allowance


def test_kinds_and_bad_input_are_named():
    assert course.kind_of("notebooks/03_prefill_decode.ipynb") == "core"
    assert course.kind_of("notebooks/03a_compiled_step.ipynb") == "deep dive"
    with pytest.raises(ValueError, match="NN_topic.ipynb"):
        course.kind_of("notebooks/welcome.ipynb")
    with pytest.raises(ValueError, match="kind must be one of"):
        course.misses(course.size(_nb([])), "lecture")
    with pytest.raises(ValueError, match="without 'cells'"):
        course.size({"metadata": {}})
