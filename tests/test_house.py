"""The house rules that are not layers: docstrings say what code does, never what one machine measured."""
from __future__ import annotations

import ast
import re

from tests.conftest import ROOT

# A CPU model, or a figure said to be "measured on" a machine, belongs in data/ (with its provenance) or a chapter.
MACHINE = re.compile(r"\b(EPYC|Xeon|Zen ?\d|Ryzen|Core i\d)\b|measured on an? \d|measured on a \w+-core")
CPU_RECORD = ROOT / "labkit" / "measure" / "cpu.py"  # names CPUs: its docstrings show what it records


def docstrings(path):
    tree = ast.parse(path.read_text())
    for node in [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef,
                                                                      ast.AsyncFunctionDef))]:
        doc = ast.get_docstring(node, clean=False)
        if doc:
            yield getattr(node, "name", "<module>"), doc


def stale(paths) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{name}: {m.group(0)!r}" for p in paths for name, doc in docstrings(p)
            for m in [MACHINE.search(doc)] if m]


def test_no_docstring_carries_a_machine_measurement():
    paths = [p for p in sorted((ROOT / "labkit").rglob("*.py")) if p != CPU_RECORD]
    assert stale(paths) == [], "move the figure to data/ or the chapter that records it with its CPU"


def test_the_docstring_check_sees_a_machine(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text('"""Fast: 125 tok/s measured on a 2-core Zen 5."""\n')
    assert len(stale_in(bad)) == 1
    bad.write_text('"""Fast: 125 tok/s on an Intel Xeon."""\n')
    assert len(stale_in(bad)) == 1
    bad.write_text('"""Decode tokens: `labkit bench --only smollm2` measures the rate on this machine."""\n')
    assert stale_in(bad) == []


def stale_in(path) -> list[str]:
    return [m.group(0) for _, doc in docstrings(path) for m in [MACHINE.search(doc)] if m]
