"""Stored figures are compared by what a reader sees: last bits pass, real changes fail, and nbval uses it."""
import base64
import copy
import subprocess
import sys

import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from labkit.nbtools import figures
from tests.conftest import ROOT, python_env


def typed(arr) -> dict:
    arr = np.asarray(arr)
    code = {"float64": "f8", "float32": "f4", "int8": "i1", "int32": "i4"}[str(arr.dtype)]
    return {"dtype": code, "bdata": base64.b64encode(arr.tobytes()).decode()}


def figure(y, name="decode", title="ITL") -> dict:
    return {"data": [{"type": "scatter", "name": name, "x": typed(np.arange(len(y), dtype=np.float64)), "y": typed(y)}],
            "layout": {"title": {"text": title}, "yaxis": {"range": [0.0, float(np.max(y))]}}}


def test_typed_arrays_decode_as_plotly_wrote_them():
    import plotly.graph_objects as go

    y = np.array([0.1, 2.5e14, -3.0])
    fig = go.Figure(go.Scatter(y=y)).to_plotly_json()
    np.testing.assert_array_equal(figures.decode_typed_array(fig["data"][0]["y"]), y)
    assert figures.decode_typed_array(typed(np.array([1, -2], dtype=np.int8))).tolist() == [1, -2]
    with pytest.raises(ValueError, match="dtype"):
        figures.decode_typed_array({"dtype": "c16", "bdata": ""})


def test_last_bit_differences_pass():
    y = np.linspace(1e-3, 1e15, 200)
    y2 = np.nextafter(y, np.inf)  # every value one ulp away: bytes differ, no reader could tell
    ref, test = figure(y), figure(y2)
    assert ref != test
    assert figures.figure_differences(ref, test) == []
    # and as a plain list of floats (how plotly stores short lists), and in a float32 array
    assert figures.figure_differences({"x": [1.0, 2.0]}, {"x": [1.0, 2.0 * (1 + 1e-9)]}) == []
    assert figures.figure_differences({"x": typed(np.float32([1, 2]))}, {"x": [1.0, 2.0000001]}) == []


@pytest.mark.parametrize("change, expected", [
    (lambda f: f["data"][0]["y"].update(typed(np.array([1.0, 2.0, 3.01]))), "y[2]"),   # a point moved 0.3 %
    (lambda f: f["data"][0].update(y=typed(np.array([1.0, 2.0]))), "2 values where 3"),  # a point fewer
    (lambda f: f["data"][0].update(name="prefill"), "name"),                            # another label
    (lambda f: f["layout"]["title"].update(text="TTFT"), "title.text"),
    (lambda f: f["layout"]["yaxis"].update(range=[0.0, 3.1]), "yaxis.range[1]"),
    (lambda f: f["data"].append(copy.deepcopy(f["data"][0])), "2 items where 1"),     # a trace more
    (lambda f: f["layout"].update(showlegend=False), "showlegend"),
])
def test_real_changes_fail_and_say_where(change, expected):
    ref = figure(np.array([1.0, 2.0, 3.0]))
    test = copy.deepcopy(ref)
    change(test)
    diffs = figures.figure_differences(ref, test)
    assert diffs and expected in diffs[0]


def test_tolerance_is_relative_to_each_value_and_checked():
    # a small value on a log axis moving by 10 % fails, even beside a large one
    assert figures.figure_differences({"y": [1e-6, 1e6]}, {"y": [1.1e-6, 1e6]})
    assert figures.figure_differences({"y": [float("nan"), 1.0]}, {"y": [float("nan"), 1.0]}) == []
    assert figures.figure_differences({"y": [True]}, {"y": [1]})  # a bool is not a number
    with pytest.raises(ValueError, match="rtol"):
        figures.figure_differences({}, {}, rtol=2)


def test_nbval_compares_figures_this_way(tmp_path):
    """Through nbval itself, one run: a stored figure one ulp away passes; one with a moved point fails, naming it."""
    from labkit import nbtools

    draw = "import plotly.graph_objects as go\ngo.Figure(go.Scatter(y=[0.1, 0.2, 0.3])).show()"
    path = tmp_path / "chapter.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell(draw), new_code_cell(draw)]), path)
    nbtools.execute(path)
    (tmp_path / "conftest.py").write_text((ROOT / "notebooks" / "conftest.py").read_text())
    nb = nbformat.read(path, as_version=4)
    stored = [[0.1, float(np.nextafter(0.2, 1)), 0.3], [0.1, 0.2, 0.31]]  # last bits / a point moved by 3 %
    for cell, y in zip(nb.cells, stored):
        cell.outputs[0]["data"][figures.FIGURE_MIME]["data"][0]["y"] = typed(np.asarray(y))
    nbformat.write(nb, path)
    run = subprocess.run([sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "-q", "-p",
                          "no:cacheprovider", "--rootdir", str(tmp_path), str(path)],
                         cwd=tmp_path, env=python_env(), capture_output=True, text=True, timeout=120)
    assert "1 failed, 1 passed" in run.stdout, run.stdout[-2000:]
    assert "Cell 1" in run.stdout and "Cell 0 " not in run.stdout.split("short test summary")[-1]
    assert "y[2]" in run.stdout and "differs from the stored" in run.stdout, run.stdout[-2000:]
