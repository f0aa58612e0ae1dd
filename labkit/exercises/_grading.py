"""The chapters as an nbgrader course: solution regions and autograded checker cells in nbgrader's metadata.

    python -m labkit.nbtools release notebooks/*.ipynb --root .build/course     # (make release)

For each chapter this writes nbgrader's *source* version, `ROOT/source/<chapter>/<chapter>.ipynb`:

- a cell tagged `solution` becomes a solution cell: the body of every function in it sits between
  `### BEGIN SOLUTION` and `### END SOLUTION`, which `nbgrader generate_assignment` replaces by a
  stub that raises;
- a cell that calls a checker (`labkit.exercises.check_<name>(fn)`) becomes a locked, autograded
  test cell worth one point: `assert labkit.exercises.check_<name>(fn)` (a checker returns a
  verdict that is false when a case fails, or when the stub raises);
- stored outputs are cleared.

Then it runs `nbgrader generate_assignment` for each chapter, which writes the release version
(what students get) to `ROOT/release/<chapter>/`. Collecting and `nbgrader autograde` follow
nbgrader's usual course layout (`ROOT/submitted/<student>/<chapter>/<chapter>.ipynb`).
"""
from __future__ import annotations

import ast
import copy
import os
import re
import subprocess
import sys
from pathlib import Path

SOLUTION_TAG = "solution"
CHECKER = re.compile(r"^\s*labkit\.exercises\.(check_\w+)\(.*\)\s*$", re.S)

__all__ = ["source_version", "write_source", "release", "solution_regions"]


def solution_regions(source: str) -> str:
    """Wrap the body of every top-level function in `source` in nbgrader's solution markers.

    >>> print(solution_regions("def f(x):\\n    return 2 * x"))
    def f(x):
        ### BEGIN SOLUTION
        return 2 * x
        ### END SOLUTION
    """
    tree = ast.parse(source)
    lines = source.splitlines()
    funcs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not funcs:  # not a function: the whole cell is the solution
        return "### BEGIN SOLUTION\n" + source.rstrip("\n") + "\n### END SOLUTION"
    for node in reversed(funcs):  # bottom-up, so earlier line numbers stay valid
        body = node.body
        indent = " " * body[0].col_offset
        lines.insert(node.end_lineno, indent + "### END SOLUTION")
        lines.insert(body[0].lineno - 1, indent + "### BEGIN SOLUTION")
    return "\n".join(lines)


def _nbgrader(grade: bool, solution: bool, grade_id: str, points: int = 0) -> dict:
    meta = {"grade": grade, "solution": solution, "locked": not solution, "grade_id": grade_id,
            "schema_version": 3, "task": False}
    if grade:
        meta["points"] = points
    return meta


def _split_checker(source: str) -> tuple[str, str | None]:
    """(the code before, the checker call) when a cell ends with a top-level checker call, else (source, None)."""
    tree = ast.parse(source)
    last = tree.body[-1] if tree.body else None
    if last is None or len(tree.body) < 2 or not isinstance(last, ast.Expr):
        return source, None
    call = ast.get_source_segment(source, last)
    if not CHECKER.match(call):
        return source, None
    lines = source.splitlines()
    return "\n".join(lines[:last.lineno - 1]).rstrip() + "\n", call


def source_version(nb):
    """nbgrader's source version of a chapter (see the module docstring); `nb` is left unchanged.

    A solution cell that ends with its checker call is split in two: the solution, then the
    graded checker cell.
    """
    import nbformat

    out = copy.deepcopy(nb)
    cells, n_solution, n_check = [], 0, 0

    def graded(call: str, cell=None):
        nonlocal n_check
        n_check += 1
        cell = cell or nbformat.v4.new_code_cell()
        cell.source = "assert " + call.strip()
        cell.outputs, cell.execution_count = [], None
        cell.metadata["nbgrader"] = _nbgrader(True, False, f"check-{n_check}-{CHECKER.match(call).group(1)}", 1)
        return cell

    for cell in out.cells:
        if cell.cell_type != "code":
            cells.append(cell)
            continue
        cell.outputs, cell.execution_count = [], None
        if SOLUTION_TAG in cell.metadata.get("tags", []):
            n_solution += 1
            code, call = _split_checker(cell.source)
            cell.source = solution_regions(code)
            cell.metadata["nbgrader"] = _nbgrader(False, True, f"solution-{n_solution}")
            cells.append(cell)
            if call:
                cells.append(graded(call))
        elif CHECKER.match(cell.source):
            cells.append(graded(cell.source, cell))
        else:
            cells.append(cell)
    if not n_check:
        raise ValueError("this chapter has no checker cells (labkit.exercises.check_<name>(fn)): nothing to grade")
    out.cells = cells
    return out


def write_source(paths, root: str | Path) -> list[Path]:
    """Write the source version of each chapter to ROOT/source/<chapter>/<chapter>.ipynb."""
    import nbformat

    written = []
    for path in map(Path, paths):
        target = Path(root) / "source" / path.stem / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(source_version(nbformat.read(path, as_version=4)), target)
        written.append(target)
    return written


def nbgrader(*args: str, root: str | Path) -> subprocess.CompletedProcess:
    """Run an nbgrader command on the course at `root`; RuntimeError with its output if it fails."""
    cmd = [sys.executable, "-m", "nbgrader", *args, f"--CourseDirectory.root={Path(root).resolve()}"]
    env = dict(os.environ)  # nbgrader runs `alembic` from the environment it is installed in
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:])} failed:\n{done.stdout}\n{done.stderr}")
    return done


def release(paths, root: str | Path) -> list[Path]:
    """Source versions, then `nbgrader generate_assignment` for each: the release versions' paths."""
    try:
        import nbgrader as _  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("nbgrader is not installed: pip install -e '.[classroom]' (make setup installs it)") from exc
    out = []
    for source in write_source(paths, root):
        nbgrader("generate_assignment", source.parent.name, "--force", root=root)
        out.append(Path(root) / "release" / source.parent.name / source.name)
    return out
