"""The chapters as an nbgrader course: the source version's metadata, then generate_assignment and autograde for real."""
import shutil

import nbformat
import pytest

from labkit.exercises import _grading as grading
from tests.test_notebooks import NOTEBOOKS


def _cells(nb, key):
    return [c for c in nb.cells if c.metadata.get("nbgrader", {}).get(key)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_solution_is_a_region_and_every_checker_a_graded_cell(path):
    nb = nbformat.read(path, as_version=4)
    src = grading.source_version(nb)
    solutions, graded = _cells(src, "solution"), _cells(src, "grade")
    assert len(solutions) == sum("solution" in c.metadata.get("tags", []) for c in nb.cells) >= 2
    assert len(graded) >= 2 and all(c.source.startswith("assert labkit.exercises.check_") for c in graded)
    assert all("### BEGIN SOLUTION" in c.source and "### END SOLUTION" in c.source for c in solutions)
    assert all("check_" not in c.source for c in solutions)  # a checker call was split into its own cell
    ids = [c.metadata["nbgrader"]["grade_id"] for c in solutions + graded]
    assert len(ids) == len(set(ids))
    assert all(not c.get("outputs") for c in src.cells if c.cell_type == "code")
    compile("\n".join(c.source for c in src.cells if c.cell_type == "code" and not c.source.startswith("%")), path.name, "exec")


def test_solution_regions_wrap_function_bodies_only():
    out = grading.solution_regions('import math\n\ndef f(x):\n    """Doc."""\n    return math.sqrt(x)\n')
    assert out.splitlines() == ["import math", "", "def f(x):", "    ### BEGIN SOLUTION", '    """Doc."""',
                                "    return math.sqrt(x)", "    ### END SOLUTION"]
    with pytest.raises(ValueError, match="no checker cells"):
        grading.source_version(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]))


@pytest.mark.slow
def test_generate_assignment_then_autograde_gives_full_marks_to_the_solutions_and_zero_to_the_stubs(tmp_path):
    pytest.importorskip("nbgrader")
    from nbgrader.api import Gradebook

    chapter = next(p for p in NOTEBOOKS if p.name == "08_power.ipynb")  # the fastest chapter with exercises
    root = tmp_path / "course"
    released = grading.release([chapter], root)[0]
    release_nb = nbformat.read(released, as_version=4)
    stubs = _cells(release_nb, "solution")
    assert stubs and all("raise NotImplementedError()" in c.source and "BEGIN SOLUTION" not in c.source for c in stubs)
    for student, version in (("reference", root / "source" / chapter.stem / chapter.name), ("stubs", released)):
        target = root / "submitted" / student / chapter.stem / chapter.name
        target.parent.mkdir(parents=True)
        shutil.copy(version, target)
    grading.nbgrader("autograde", chapter.stem, root=root)
    n = len(_cells(release_nb, "grade"))
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        full = gb.find_submission(chapter.stem, "reference")
        zero = gb.find_submission(chapter.stem, "stubs")
        assert (full.score, full.max_score) == (n, n)
        assert (zero.score, zero.max_score) == (0, n)
