"""The house keeps its layers: no import cycles, no upward imports, no plotting below the face.

The imports are read with `ast` (nothing is executed), imports inside functions
included: a lazy import is still a dependency. The layers, bottom first, are the
table in CONTRIBUTING.md; a package may import its own modules and anything in a
lower layer, never a higher one.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

PKG = ROOT / "labkit"

# Bottom first. Packages on one row are one layer: they may use each other (cycles are still refused).
LAYERS = [
    {"data", "measure", "checks"},
    {"metrics"},
    {"tokenizer"},
    {"quant"},
    {"kvcache"},
    {"model"},
    {"sampling"},
    {"generation"},
    {"speculative", "serving", "train"},
    {"costmodel"},
    {"power"},
    {"viz", "widgets", "exercises", "benchmarks", "commands", "nbtools", "<face>"},
]
RANK = {pkg: i for i, row in enumerate(LAYERS) for pkg in row}
FACE = RANK["<face>"]
PLOTTING = {"plotly", "ipywidgets", "anywidget", "IPython", "matplotlib"}
# The cost and power models are pure functions of a config and a profile: of the layers
# below them they may read only the data files and the model's config (its shapes).
PURE = {"costmodel", "power"}
PURE_MAY_IMPORT = {"data", "measure", "checks", "costmodel", "power", "labkit.model.config"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


MODULES = modules()


def package_of(module: str) -> str:
    parts = module.split(".")
    if module == "labkit.checks":  # the argument checks: a module at the top, in the bottom layer
        return "checks"
    if len(parts) == 1 or f"labkit.{parts[1]}" not in MODULES or not (PKG / parts[1]).is_dir():
        return "<face>"
    return parts[1]


def resolve(module: str, names: list[str]) -> list[str]:
    """The labkit modules an `import` / `from module import names` statement loads."""
    if module not in MODULES:
        return []
    out = []
    for n in names:
        sub = f"{module}.{n}"
        out.append(sub if sub in MODULES else module)  # `from labkit.pkg import submodule` loads the submodule
    return out or [module]


def imports(path: Path, self_name: str) -> list[tuple[str, int]]:
    """(imported module, line) for every labkit or third-party import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                found.append((a.name, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against this module's package
                base = self_name.split(".")
                is_pkg = path.name == "__init__.py"
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] == "labkit":
                found += [(m, node.lineno) for m in resolve(mod, [a.name for a in node.names])]
            else:
                found.append((mod, node.lineno))
    return found


def graph() -> dict[str, list[tuple[str, int]]]:
    g = {}
    for name, path in MODULES.items():
        deps = []
        for mod, line in imports(path, name):
            if mod.split(".")[0] == "labkit":
                while mod not in MODULES and "." in mod:  # `import labkit.a.b.attr` style: the deepest module
                    mod = mod.rsplit(".", 1)[0]
                if mod != name:
                    deps.append((mod, line))
        g[name] = deps
    return g


def find_cycle(g: dict[str, list[tuple[str, int]]]) -> list[str] | None:
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(g, WHITE)
    stack: list[str] = []

    def visit(u):
        color[u] = GREY
        stack.append(u)
        for v, _ in g.get(u, []):
            if v == "labkit":  # the package face imports lazily, by name, at attribute access
                continue
            if color.get(v) == GREY:
                return stack[stack.index(v):] + [v]
            if color.get(v) == WHITE:
                found = visit(v)
                if found:
                    return found
        stack.pop()
        color[u] = BLACK
        return None

    for u in g:
        if color[u] == WHITE:
            found = visit(u)
            if found:
                return found
    return None


def violations(g) -> list[str]:
    out = []
    for name, deps in g.items():
        here = package_of(name)
        for dep, line in deps:
            there = package_of(dep)
            where = f"{MODULES[name].relative_to(ROOT)}:{line}"
            if RANK[there] > RANK[here]:
                out.append(f"{where}: {name} ({here}) imports {dep} ({there}), a higher layer")
            elif here in PURE and there not in PURE_MAY_IMPORT and dep not in PURE_MAY_IMPORT:
                out.append(f"{where}: {name} ({here}) imports {dep}: the cost and power models never run a model")
    for name, path in MODULES.items():
        if RANK[package_of(name)] == FACE:
            continue
        for mod, line in imports(path, name):
            if mod.split(".")[0] in PLOTTING:
                out.append(f"{path.relative_to(ROOT)}:{line}: {name} imports {mod}; only labkit.viz and the face may")
    return out


def test_every_package_has_a_layer():
    packages = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()} | {"checks"}
    assert packages - set(RANK) == set(), "add the new package to LAYERS (and to CONTRIBUTING.md)"


def test_no_import_cycles():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_upward_imports_and_no_plotting_below_the_face():
    assert violations(graph()) == []


def test_the_checker_sees_cycles_and_upward_imports():
    g = {"labkit.model.transformer": [("labkit.generation.stages", 3)], "labkit.generation.stages": [("labkit.model.transformer", 5)]}
    assert find_cycle(g) == ["labkit.model.transformer", "labkit.generation.stages", "labkit.model.transformer"]
    assert find_cycle({"labkit.model.transformer": [("labkit.kvcache.base", 1)], "labkit.kvcache.base": []}) is None
    fake = {"labkit.model.transformer": [("labkit.generation.stages", 3)], "labkit.costmodel.estimator": [("labkit.kvcache.base", 9)]}
    found = violations({**{k: [] for k in MODULES}, **fake})
    assert any("labkit.model.transformer (model) imports labkit.generation.stages (generation)" in v for v in found)
    assert any("labkit.costmodel.estimator (costmodel) imports labkit.kvcache.base" in v for v in found)


def test_files_stay_small():
    long = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 320}
    assert long == {}, "split these by idea (about 300 lines a file at most)"


def test_top_level_keeps_only_the_face():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "_collect.py", "_loaded.py", "checks.py", "cli.py", "doctor.py", "registry.py", "threads.py"]


@pytest.mark.parametrize("init", sorted(PKG.rglob("*/__init__.py")), ids=lambda p: str(p.parent.relative_to(PKG)))
def test_package_faces_hold_no_logic(init):
    """A package's __init__ hands on names: imports, __all__, a docstring; no functions or classes."""
    tree = ast.parse(init.read_text())
    logic = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
    allowed = {"__getattr__", "__dir__"}  # the collected packages (viz, widgets, exercises) resolve names lazily
    assert [n.name for n in logic if n.name not in allowed] == []


# Serving's three parts import in one direction: the studies and the HTTP face use the engine, never the reverse.
SERVING_MAY_IMPORT = {"engine": {"engine"}, "http": {"engine", "http"}, "studies": {"engine", "studies"}}


def serving_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["labkit", "serving"] else None


def test_serving_parts_import_in_one_direction():
    wrong = []
    for name, deps in graph().items():
        here = serving_part(name)
        if here is None:
            continue
        for dep, line in deps:
            there = serving_part(dep)
            if there is not None and there not in SERVING_MAY_IMPORT[here]:
                wrong.append(f"{MODULES[name].relative_to(ROOT)}:{line}: serving.{here} imports {dep}")
    assert wrong == []
    top = sorted(p.name for p in (PKG / "serving").iterdir() if p.name != "__pycache__")
    assert top == ["__init__.py", "engine", "http", "studies"]


def test_the_serving_check_sees_a_wrong_direction():
    assert serving_part("labkit.serving.engine.loop") == "engine"
    assert "studies" not in SERVING_MAY_IMPORT[serving_part("labkit.serving.engine.loop")]
    assert serving_part("labkit.serving") is None and serving_part("labkit.model.transformer") is None
