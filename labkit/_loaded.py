"""Which of labkit's source files a process, and every process it starts, loaded: the scope of a stored file's record.

When the environment variable `LABKIT_LOADED_LOG` names a file, `import labkit` installs an audit hook
(`sys.addaudithook`, the interpreter's "import" event) that appends each labkit module's source file to that
file, repository-relative, one per line, as the module is first imported. Importing `labkit.quant.native`
(the lab's C++ kernels, compiled from `labkit/quant/csrc/`) also names every file under that folder. Child
processes inherit the variable: the worker processes a bench starts write to the same log, even if they are
later killed (each line is written as its import happens, not at exit).

`make evidence` (`labkit.benchmarks.evidence.remake`) sets it for each bench it runs and keeps, in the stored
file's code record, only the declared sources that some process of the run imported: a source file no process
imported cannot have determined the figures. This module imports only the standard library (it runs first).
"""
from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

__all__ = ["ENV", "module_files", "install", "read"]

ENV = "LABKIT_LOADED_LOG"
_PACKAGE = Path(__file__).resolve().parent
_ROOT = _PACKAGE.parent
_CSRC = _PACKAGE / "quant" / "csrc"
_NATIVE = "labkit.quant.native"  # the module that compiles and loads the C++ kernels
_seen: set = set()


def module_files(name: str) -> list[str]:
    """The repository-relative source files that importing the module `name` loads: its `.py` file (a package's
    `__init__.py`), and for `labkit.quant.native` every C++ file under `labkit/quant/csrc/`; [] for a module that
    is not labkit's."""
    if name != "labkit" and not name.startswith("labkit."):
        return []
    base = _ROOT.joinpath(*name.split("."))
    files = [f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()][:1]
    if name == _NATIVE:
        files += sorted(p for p in _CSRC.rglob("*") if p.suffix in (".cpp", ".h") and p.is_file())
    return [str(f.relative_to(_ROOT)) for f in files]


def _write(path: str, names) -> None:
    lines = "".join(f + "\n" for n in names for f in module_files(n))
    if lines:
        with open(path, "a") as f:  # one write per import: lines from several processes never interleave mid-line
            f.write(lines)


def _hook(event: str, args) -> None:
    if event != "import" or not isinstance(args[0], str) or not args[0].startswith("labkit"):
        return
    name = args[0]
    if name in _seen:
        return
    _seen.add(name)
    try:
        _write(os.environ[ENV], [name])
    except Exception:  # an audit hook must never break an import; a missing line leaves the record wider, see read
        pass


def install() -> bool:
    """Start logging this process's labkit imports to the file `LABKIT_LOADED_LOG` names (with the modules
    already imported); False when the variable is unset. Called once by `import labkit`."""
    path = os.environ.get(ENV)
    if not path or _seen:
        return bool(path)
    already = [n for n in list(sys.modules) if n == "labkit" or n.startswith("labkit.")]
    # `import labkit.a.b` announces labkit.a.b and labkit.a before labkit itself runs this: the imports under way
    # are the frames of importlib's `_find_and_load` below this one
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_find_and_load" and isinstance(frame.f_locals.get("name"), str):
            already.append(frame.f_locals["name"])
        if frame.f_code.co_name == "_get_module_details" and isinstance(frame.f_locals.get("mod_name"), str):
            already.append(frame.f_locals["mod_name"])  # `python -m labkit.x` runs labkit/x.py with no import
        frame = frame.f_back
    already = [n for n in dict.fromkeys(already) if n == "labkit" or n.startswith("labkit.")]
    _seen.update(already)
    _write(path, already + [__name__])
    sys.addaudithook(_hook)
    atexit.register(_at_exit)
    return True


def _at_exit() -> None:
    """Whatever the hook could not see (a module run by `python -m`, announced before the hook began)."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    names = [n for n in list(sys.modules) if (n == "labkit" or n.startswith("labkit.")) and n not in _seen]
    names += [main.name] if main is not None and main.name not in _seen else []
    try:
        _write(os.environ[ENV], names)
    except Exception:
        pass


def read(path) -> set:
    """The files a log names (`module_files` paths), as a set."""
    return {line.strip() for line in Path(path).read_text().splitlines() if line.strip()}
