"""SmolLM2 loaded once per test session, shared by the test files that need the real model."""
from __future__ import annotations

import functools

import pytest
import torch


@functools.lru_cache(maxsize=None)
def smollm2(dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from `labkit.load`; skips the test when the GGUF package is missing."""
    import labkit
    from labkit.data import paths

    try:
        paths.smollm2_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return labkit.load("smollm2-135m", dtype=dtype)


@functools.lru_cache(maxsize=None)
def reader():
    from labkit.data import paths
    from labkit.model.gguf import open_gguf

    return open_gguf(paths.smollm2_gguf_path())
