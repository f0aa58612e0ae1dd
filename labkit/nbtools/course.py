"""How big each notebook of the course is, against the targets a class can cover in one sitting.

A core lesson (`NN_topic.ipynb`) carries one story: its objectives at the top, at most `TARGETS["core"]` words of
prose and of printed output, at least three exercises (cells tagged `solution`), and no code cell longer than
`MAX_CELL_LINES` lines or with a line over `MAX_LINE` characters. A deep dive (`NNx_topic.ipynb`, a letter after the
number: `03a_compiled_step.ipynb`) sits beside its lesson with a larger allowance.

    python -m labkit.nbtools size notebooks/*.ipynb    # the table, and every target a notebook misses

Counted: a word is a run of letters, digits or underscores (`\\w+`: "1.25×" is two words, "·" or "|" none), so a
table of numbers counts what a reader reads; prose = the words of the markdown cells; printed = the words of the code
cells' outputs (streams, text/plain results, the text of HTML tables; a figure's text is not counted); code lines =
non-blank source lines.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["TARGETS", "MAX_CELL_LINES", "MAX_LINE", "MIN_EXERCISES", "kind_of", "size", "misses", "table"]

TARGETS = {"core": {"prose": 3500, "printed": 1200}, "deep dive": {"prose": 4000, "printed": 1500}}
MAX_CELL_LINES, MAX_LINE, MIN_EXERCISES = 25, 110, 3
_WORD = re.compile(r"\w+")
_OBJECTIVES = re.compile(r"^\s*(#+\s*|\*\*)\s*(learning objectives|objectives|after this (chapter|lesson|notebook))",
                         re.IGNORECASE | re.MULTILINE)


def kind_of(path: str | Path) -> str:
    """"core" for `NN_topic.ipynb`, "deep dive" for `NNx_topic.ipynb` (a letter after the chapter number)."""
    name = Path(path).name
    if re.match(r"^\d\d_", name):
        return "core"
    if re.match(r"^\d\d[a-z]_", name):
        return "deep dive"
    raise ValueError(f"path must name a chapter NN_topic.ipynb or a deep dive NNx_topic.ipynb, got {name!r}")


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else str(source)


def _printed(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(_text(out.get("text", "")))
        elif out.get("output_type") in ("execute_result", "display_data"):
            data = out.get("data", {})
            if {"image/png", "image/svg+xml", "application/vnd.plotly.v1+json"} & set(data):
                continue
            if "text/html" in data:
                parts.append(re.sub(r"<[^>]*>", " ", _text(data["text/html"])))
            elif "text/plain" in data:
                parts.append(_text(data["text/plain"]))
    return "\n".join(parts)


def size(nb: dict | str | Path) -> dict:
    """The counts of one notebook (a path or its JSON as a dict): prose and printed words, code lines, the longest
    code cell (lines), code lines over `MAX_LINE` characters, exercises (cells tagged `solution`) and whether the
    first markdown cell states the objectives."""
    if not isinstance(nb, dict):
        nb = json.loads(Path(nb).read_text())
    if not isinstance(nb.get("cells"), list):
        raise ValueError("nb must be a notebook (a dict with a list of 'cells'), got one without 'cells'")
    cells = nb["cells"]
    markdown = [_text(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    code = [c for c in cells if c["cell_type"] == "code"]
    lines = [[ln for ln in _text(c["source"]).splitlines() if ln.strip()] for c in code]
    return {
        "prose": sum(len(_WORD.findall(m)) for m in markdown),
        "printed": sum(len(_WORD.findall(_printed(c))) for c in code),
        "code_lines": sum(len(x) for x in lines),
        "longest_cell": max((len(x) for x in lines), default=0),
        "long_lines": sum(len(ln) > MAX_LINE for x in lines for ln in x),
        "exercises": sum("solution" in c.get("metadata", {}).get("tags", []) for c in cells),
        "objectives": bool(markdown) and bool(_OBJECTIVES.search(markdown[0])),
    }


def misses(counts: dict, kind: str) -> list[str]:
    """Each target of `kind` ("core" or "deep dive") the counts miss, in words (empty: all met)."""
    if kind not in TARGETS:
        raise ValueError(f"kind must be one of {sorted(TARGETS)}, got {kind!r}")
    out = [f"{what} {counts[what]:,} words > {limit:,}" for what, limit in TARGETS[kind].items() if counts[what] > limit]
    if counts["longest_cell"] > MAX_CELL_LINES:
        out.append(f"a code cell of {counts['longest_cell']} lines > {MAX_CELL_LINES}")
    if counts["long_lines"]:
        out.append(f"{counts['long_lines']} code lines over {MAX_LINE} characters")
    if counts["exercises"] < MIN_EXERCISES:
        out.append(f"{counts['exercises']} exercises < {MIN_EXERCISES}")
    if not counts["objectives"]:
        out.append("no objectives at the top")
    return out


def table(paths) -> tuple[str, int]:
    """A markdown table of every notebook's counts and the targets it misses; and how many notebooks miss one."""
    rows = ["| notebook | kind | prose | printed | code lines | longest cell | lines > 110 | exercises | misses |",
            "|---|---|---|---|---|---|---|---|---|"]
    missing = 0
    for path in sorted(Path(p) for p in paths):
        kind, counts = kind_of(path), size(path)
        miss = misses(counts, kind)
        missing += bool(miss)
        rows.append(f"| {path.stem} | {kind} | {counts['prose']:,} | {counts['printed']:,} | {counts['code_lines']} | "
                    f"{counts['longest_cell']} | {counts['long_lines']} | {counts['exercises']} | "
                    f"{'; '.join(miss) or 'none'} |")
    return "\n".join(rows), missing
