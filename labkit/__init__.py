"""labkit: a lab that teaches how large language models run inference, and measures it.

The public surface (see the README):

    model, tok = labkit.load("smollm2-135m")
    out = labkit.generate(model, tok, "What is the capital of France?")
    state = labkit.prefill(model, ids); ids = labkit.decode(model, state, 16)

Submodules are imported lazily so that `import labkit` stays fast (no torch import
until a model is needed).
"""
from __future__ import annotations

import importlib

from labkit import _loaded

_loaded.install()  # first: a stored file's record names the sources its run loaded (labkit._loaded, LABKIT_LOADED_LOG)
from labkit import threads as _threads  # noqa: E402

__version__ = "0.1.0"
_threads.apply()  # before torch starts its thread pool: how many threads, on a CPU other programs share

# public name -> module that defines it
_LAZY = {
    "load": "labkit.registry",
    "available_models": "labkit.registry",
    "generate": "labkit.generation",
    "stream": "labkit.generation",
    "prefill": "labkit.generation",
    "decode": "labkit.generation",
    "PrefillState": "labkit.generation",
    "GenerationOutput": "labkit.generation",
}


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        return getattr(module, name)
    try:
        return importlib.import_module(f"labkit.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"labkit.{name}":
            raise
        raise AttributeError(f"module 'labkit' has no attribute {name!r}") from None


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
