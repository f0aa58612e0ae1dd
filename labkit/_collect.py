"""Packages whose public names come from their submodules.

`labkit.viz`, `labkit.widgets` and `labkit.exercises` hold one submodule per
chapter. Each submodule lists its public names in `__all__`; the package exposes
them all, so `labkit.viz.token_boundaries` works without the package's
`__init__` naming every function.
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def submodules(package: ModuleType) -> list[ModuleType]:
    """Import and return every submodule of `package`, in name order."""
    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))
    return [importlib.import_module(f"{package.__name__}.{name}") for name in names]


def public_names(package: ModuleType) -> dict[str, ModuleType]:
    """Map each name in a submodule's `__all__` to that submodule."""
    found: dict[str, ModuleType] = {}
    for module in submodules(package):
        for name in getattr(module, "__all__", ()):
            if name in found:
                raise ImportError(f"{package.__name__}: {name!r} is defined in both {found[name].__name__} and {module.__name__}")
            found[name] = module
    return found


def make_getattr(package_name: str):
    """A module-level `__getattr__` that resolves names from the submodules' `__all__`."""
    cache: dict[str, ModuleType] = {}

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if not cache:
            cache.update(public_names(importlib.import_module(package_name)))
        if name not in cache:
            raise AttributeError(f"module {package_name!r} has no attribute {name!r}")
        return getattr(cache[name], name)

    def __dir__():
        if not cache:
            cache.update(public_names(importlib.import_module(package_name)))
        return sorted(cache)

    return __getattr__, __dir__
