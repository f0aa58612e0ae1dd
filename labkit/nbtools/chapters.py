"""Notebook tooling: execute chapters in place, check them, write student copies, release them with nbgrader.

    python -m labkit.nbtools execute notebooks/01_tokenization.ipynb
    python -m labkit.nbtools check notebooks/*.ipynb
    python -m labkit.nbtools student notebooks/*.ipynb --out .build/student
    python -m labkit.nbtools release notebooks/*.ipynb --root .build/course   # nbgrader (labkit.exercises._grading)

Chapters are executed with `store_widget_state=False` (a plotly FigureWidget's
saved state is 5 MB of JavaScript that JupyterLab does not even restore) and
`record_timing=False` (per-cell timestamps would change on every run).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from labkit.measure.clock import now as clock_now

__all__ = ["SOLUTION_TAG", "execute", "problems", "stub_source", "student_copy", "write_students", "main"]

SOLUTION_TAG = "solution"


def execute(path: str | Path, timeout: int = 600) -> float:
    """Execute a notebook top to bottom in a fresh kernel and save it in place; return seconds."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("widgets", None)
    start = clock_now()
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        store_widget_state=False,
        record_timing=False,
    )
    client.execute()
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    return clock_now() - start


def problems(path: str | Path) -> list[str]:
    """What keeps nbval from really checking a committed notebook (empty when fine)."""
    import nbformat

    nb = nbformat.read(Path(path), as_version=4)
    found = []
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    counts = [c.get("execution_count") for c in code]
    missing = [i for i, n in enumerate(counts) if n is None]
    if missing:
        found.append(f"{len(missing)} code cell(s) not executed (first: code cell {missing[0]})")
    elif counts != list(range(1, len(counts) + 1)):
        found.append(f"execution counts are not 1..{len(counts)} in order: {counts}")
    if "widgets" in nb.metadata:
        found.append("carries saved widget state (execute with store_widget_state=False)")
    for i, cell in enumerate(code):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append(f"code cell {i} stored an error: {out.get('ename')}: {out.get('evalue')}")
    return found


def stub_source(source: str) -> str:
    r"""Replace the body of every top-level function in `source` by a stub; keep everything else.

    >>> print(stub_source("def f(x):\n    return x + 1\n\ncheck(f)\n"))
    def f(x):
        # Your code here: replace the `raise` below.
        raise NotImplementedError
    <BLANKLINE>
    check(f)
    <BLANKLINE>
    """
    import ast

    tree = ast.parse(source)
    lines = source.splitlines()
    pieces = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first_body = node.body[0]
            keep_doc = (
                isinstance(first_body, ast.Expr)
                and isinstance(first_body.value, ast.Constant)
                and isinstance(first_body.value.value, str)
            )
            head_end = (first_body.end_lineno if keep_doc else first_body.lineno - 1)
            start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
            head = lines[start:head_end]
            indent = " " * (first_body.col_offset)
            pieces.append("\n".join(head + [indent + "# Your code here: replace the `raise` below.", indent + "raise NotImplementedError"]))
        else:
            pieces.append(ast.get_source_segment(source, node, padded=True))
    return "\n\n".join(pieces) + "\n"


def student_copy(nb):
    """Return a copy of `nb` whose cells tagged `solution` have their function bodies stubbed.

    Every code cell's stored output goes too: a student runs the chapter, and a stored
    `[PASS]` under a checker cell would give away that the stub passes (it does not).
    """
    import copy

    import nbformat

    out = copy.deepcopy(nb)
    for cell in out.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        if cell.cell_type == "code" and SOLUTION_TAG in cell.metadata.get("tags", []):
            cell.source = stub_source(cell.source)
            cell.outputs = []
            cell.execution_count = None
            cell.metadata["tags"] = [t for t in cell.metadata["tags"] if t != SOLUTION_TAG] + ["exercise"]
    nbformat.validate(out)
    return out


def write_students(paths, out_dir: str | Path) -> list[Path]:
    import nbformat

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in paths:
        nb = nbformat.read(Path(path), as_version=4)
        target = out_dir / Path(path).name
        nbformat.write(student_copy(nb), target)
        written.append(target)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit.nbtools")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("execute", help="execute notebooks in place")
    p.add_argument("paths", nargs="+")
    p = sub.add_parser("check", help="report notebooks that are not executed or carry widget state")
    p.add_argument("paths", nargs="+")
    p = sub.add_parser("student", help="write student copies (solution cells replaced by stubs)")
    p.add_argument("paths", nargs="+")
    p.add_argument("--out", default=".build/student")
    p = sub.add_parser("release", help="write nbgrader source and release versions of the chapters")
    p.add_argument("paths", nargs="+")
    p.add_argument("--root", default=".build/course")
    p = sub.add_parser("size", help="each notebook's words, code and exercises against the course's targets")
    p.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "size":
        from labkit.nbtools.course import table

        text, missing = table(args.paths)
        print(text + f"\n{missing} of {len(args.paths)} notebooks miss a target")
        return 0
    if args.cmd == "execute":
        for path in args.paths:
            print(f"executing {path} ...", flush=True)
            print(f"  done in {execute(path):.1f} s", flush=True)
    elif args.cmd == "check":
        bad = 0
        for path in args.paths:
            for problem in problems(path):
                print(f"{path}: {problem}")
                bad += 1
        return 1 if bad else 0
    elif args.cmd == "release":
        from labkit.exercises._grading import release

        for target in release(args.paths, args.root):
            print(f"released {target}")
    else:
        for target in write_students(args.paths, args.out):
            print(f"wrote {target}")
    return 0
