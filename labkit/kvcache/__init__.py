"""KV caches: one interface (`KVCache` in `base.py`), one module per kind.

A kind registers itself by subclassing `KVCache` with a class attribute `kind`;
`new_cache(kind, config, ...)` (and `model.new_cache(kind=...)`) finds it, importing
this package's submodules on first use, so adding `sliding.py` or `paged.py` needs no
edit here or in `labkit/model.py`.

    >>> from labkit.config import ModelConfig
    >>> cache = new_cache("contiguous", ModelConfig.from_name("smollm2-135m"), max_len=16)
    >>> cache.seq_len, cache.bytes_allocated()
    (0, 737280)
"""
from __future__ import annotations

import importlib
import pkgutil

from labkit.kvcache.base import KINDS, KVCache

__all__ = ["KVCache", "KINDS", "kinds", "new_cache"]


def kinds() -> list[str]:
    """The cache kinds available, e.g. ['contiguous', ...]."""
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_") and info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")
    return sorted(KINDS)


def new_cache(kind: str, config, **opts) -> KVCache:
    """Build a cache of `kind` for a model with `config`; `opts` go to that kind's constructor."""
    if kind not in KINDS:
        kinds()
    if kind not in KINDS:
        raise ValueError(f"unknown cache kind {kind!r}; available kinds: {', '.join(kinds())}")
    return KINDS[kind](config, **opts)
