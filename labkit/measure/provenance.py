"""What made a stored figure: a digest of the code it measured, and a check of a stored record against today's code.

A figure in `data/` is only this lab's figure while the code that made it is the code the
chapter describes. So every file a bench writes carries a **code record**: for each source file
that determines the figure, a digest of what the code *does*, not of how it is written down:

  * Python: the syntax tree (`ast.dump`) with every docstring removed (comments never reach the
    tree), so a reworded comment or docstring keeps the digest and a changed expression does not;
  * C and C++ (the kernels under `labkit/quant/csrc/`): the text with `//` and `/* */` comments
    removed and runs of white space folded into one.

`code_record(sources)` takes paths relative to the repository (files or folders: a folder stands for
every `.py`, `.cpp`, `.h` file under it) and returns {"digest": ..., "files": {path: digest}};
`changed(stored, now)` names the files whose digest moved, appeared or went.

A record can be **scoped** to the files a run loaded (`scoped(record, loaded)`, with `loaded` from
`labkit._loaded`: the sources any process of the run imported): it keeps the digests of those files
only, the names of all the declared files, and says `"scope": "loaded"`. `outdated(stored, now)`
compares a scoped record on its loaded files, and still counts a declared file that appeared since in
a folder whose package imports what it finds there (`DISCOVERED`: `labkit.kvcache` registers every
cache kind in its folder); elsewhere a new file is loaded only by a file that changed to import it.
An unscoped record is compared on every declared file.
"""
from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path

__all__ = ["ROOT", "code_record", "changed", "source_files", "scoped", "scope_or_keep", "outdated"]

ROOT = Path(__file__).resolve().parents[2]  # the repository: labkit/ and data/ are in it
SUFFIXES = (".py", ".cpp", ".h")
# folders whose package imports every module it finds in them (pkgutil): a new file there may run unasked
# (tests/test_evidence.py finds every such package in the source)
DISCOVERED = ("labkit/kvcache/", "labkit/benchmarks/", "labkit/commands/", "labkit/exercises/", "labkit/viz/",
              "labkit/widgets/")


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def _python_digest(text: str) -> str:
    tree = _strip_docstrings(ast.parse(text))
    return hashlib.sha256(ast.dump(tree, annotate_fields=False).encode()).hexdigest()[:16]


def _c_digest(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()[:16]


def source_files(sources) -> list[str]:
    """The files (repository-relative, sorted) that `sources` names; a folder stands for its code files."""
    if isinstance(sources, str) or not sources:
        raise ValueError(f"sources must be a non-empty list of repository paths, got {sources!r}")
    out = set()
    for s in sources:
        p = ROOT / s
        if p.is_dir():
            out.update(str(f.relative_to(ROOT)) for f in p.rglob("*") if f.suffix in SUFFIXES and f.is_file())
        elif p.is_file():
            out.add(str(p.relative_to(ROOT)))
        else:
            raise ValueError(f"sources names {s!r}, which is neither a file nor a folder of the repository")
    return sorted(out)


def code_record(sources) -> dict:
    """{"digest": one digest over all, "files": {path: digest}} of the code `sources` names (module docstring)."""
    files = {}
    for rel in source_files(sources):
        text = (ROOT / rel).read_text()
        files[rel] = _python_digest(text) if rel.endswith(".py") else _c_digest(text)
    return {"digest": _digest_of(files), "files": files}


def changed(stored: dict, now: dict) -> list[str]:
    """What differs between two code records: 'path (changed)', 'path (new)', 'path (gone)', sorted."""
    a, b = stored.get("files", {}), now.get("files", {})
    out = [f"{k} (changed)" for k in sorted(set(a) & set(b)) if a[k] != b[k]]
    out += [f"{k} (new)" for k in sorted(set(b) - set(a))]
    out += [f"{k} (gone)" for k in sorted(set(a) - set(b))]
    return out


def _digest_of(files: dict) -> str:
    return hashlib.sha256("".join(f"{k}:{v}\n" for k, v in files.items()).encode()).hexdigest()[:16]


def scoped(record: dict, loaded) -> dict:
    """`record` (a `code_record`) kept to the files in `loaded`, marked `"scope": "loaded"`; ValueError when no
    file of the record was loaded (a run that loaded none of its declared sources says its log is wrong)."""
    files = {k: v for k, v in record["files"].items() if k in set(loaded)}
    if not files:
        raise ValueError(f"loaded names none of the record's {len(record['files'])} files: the run's log of loaded "
                         "sources is empty or wrong; keep the whole record")
    return {"digest": _digest_of(files), "files": files, "scope": "loaded", "declared": sorted(record["files"])}


def scope_or_keep(record: dict, loaded) -> tuple[dict, str]:
    """(`scoped(record, loaded)`, a line saying how many files it keeps), or (`record`, why) when `loaded` names none
    of its files: never a narrower record by mistake."""
    try:
        rec = scoped(record, loaded)
    except ValueError as exc:
        return record, str(exc)
    return rec, f"its record: {len(rec['files'])} of {len(record['files'])} declared source files, those its run loaded"


def outdated(stored: dict, now: dict) -> list[str]:
    """`changed(stored, now)`, where a scoped `stored` record (`scoped`) is compared on its loaded files, and a file
    declared now that it did not declare counts as new if it sits in a `DISCOVERED` folder."""
    if stored.get("scope") != "loaded":
        return changed(stored, now)
    files, declared = now.get("files", {}), set(stored.get("declared", ()))
    return (changed(stored, {"files": {k: v for k, v in files.items() if k in stored.get("files", {})}})
            + [f"{k} (new)" for k in sorted(files) if k not in declared and k not in stored.get("files", {})
               and k.startswith(DISCOVERED)])
