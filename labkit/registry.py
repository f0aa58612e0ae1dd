"""The models the lab can load by name: `labkit.load(name)` -> (model, tokenizer).

Each entry is a `ModelSpec`: a one-line description and a loader function. New models
(the lab's own Shakespeare target and draft) are added by one `register(...)` call
where their loader lives, or in this table; nothing else needs to change.

    >>> sorted(available_models())                  # doctest: +SKIP
    ['shakespeare', 'shakespeare-csa', 'shakespeare-draft', 'smollm2-135m']
    >>> model, tok = load("smollm2-135m")           # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from labkit import checks

__all__ = ["ModelSpec", "register", "load", "available_models", "DTYPES"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelSpec:
    """A loadable model: `loader(dtype) -> (model, tokenizer)`."""

    name: str
    description: str
    loader: Callable[..., tuple]  # loader(dtype) -> (model, tokenizer); loader(dtype, weights) for other weights
    weights: tuple[str, ...] = ("float",)


_REGISTRY: dict[str, ModelSpec] = {}


def register(name: str, description: str, loader: Callable[..., tuple], weights: tuple[str, ...] = ("float",)) -> None:
    """Make `load(name)` call `loader(dtype)` (and `loader(dtype, weights)` for the other `weights` it offers)."""
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} is already registered")
    _REGISTRY[name] = ModelSpec(name, description, loader, weights)


def available_models() -> dict[str, str]:
    """Model name -> one-line description."""
    return {name: spec.description for name, spec in _REGISTRY.items()}


def _as_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        return DTYPES[dtype]
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return dtype


def load(name: str, dtype: torch.dtype | str = torch.float32, weights: str = "float", compile: bool = False):
    """Load a model and its tokenizer: `model, tok = labkit.load("smollm2-135m")`.

    `dtype`: torch.float32 (exact; the default) or torch.bfloat16 / torch.float16 (half the
    bytes per decode step; "bfloat16" as a string works too). `weights="gguf"` (SmolLM2) keeps
    the file's Q4_1 blocks as int4 codes for the packed kernel instead of dequantizing them;
    `dtype` is then the activations' dtype (float32 or bfloat16). `compile=True` calls
    `model.export_step()`: decode steps and short passes run as one program exported with AOTInductor,
    built once under .build/exported/ and loaded from there after (without a C++ compiler: a warning
    that says so, and the eager step).
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; available models: {', '.join(sorted(_REGISTRY)) or 'none'}")
    spec = _REGISTRY[name]
    if weights not in spec.weights:
        raise ValueError(f"weights must be one of {spec.weights} for {name!r}, got {weights!r}")
    checks.flag("compile", compile)
    loaded = spec.loader(_as_dtype(dtype)) if weights == "float" else spec.loader(_as_dtype(dtype), weights)
    _release_freed_memory()
    if compile:
        try:
            loaded[0].export_step()
        except RuntimeError as e:  # no C++ compiler: the eager step, said out loud
            import warnings

            warnings.warn(f"compile=True: the model runs eagerly: {e}", RuntimeWarning, stacklevel=2)
    return loaded


def _release_freed_memory() -> None:
    """Give the loader's temporary buffers back to the system (glibc keeps freed memory otherwise: ~200 MB for
    SmolLM2's dequantization, which a server or a notebook holding several models would carry for nothing)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _load_smollm2(dtype: torch.dtype, weights: str = "float"):
    from labkit.data import paths
    from labkit.model.gguf import load_gguf, open_gguf
    from labkit.tokenizer.gguf import from_gguf

    path = paths.smollm2_gguf_path()  # FileNotFoundError naming the install command
    reader = open_gguf(path)
    if weights == "gguf":
        from labkit.model.gguf_native import load_gguf_native

        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"with weights='gguf' dtype is the activations' dtype: float32 or bfloat16, got {dtype}")
        model = load_gguf_native(reader, act_dtype=dtype)
    else:
        model = load_gguf(reader, dtype=dtype)
    model.config = model.config.replace(name="smollm2-135m")
    return model, from_gguf(path)


register(
    "smollm2-135m",
    "SmolLM2-135M-Instruct (Llama architecture, 30 layers, GQA 9/3 heads) from its Q4_1 GGUF file",
    _load_smollm2,
    weights=("float", "gguf"),
)


def _load_gemma3(dtype: torch.dtype):
    from labkit.data import paths
    from labkit.model.gguf import load_gguf, open_gguf
    from labkit.tokenizer.gguf import from_gguf

    path = paths.gemma3_gguf_path()  # FileNotFoundError naming the package to install
    model = load_gguf(open_gguf(path), dtype=dtype)
    model.config = model.config.replace(name="gemma3-270m")
    return model, from_gguf(path)


register(
    "gemma3-270m",
    "Gemma 3 270M base (the same Transformer as a Gemma config: sandwich norms, QK-norm, GeGLU, 5 sliding layers "
    "to 1 global) from its Q4_K_M GGUF file, dequantized",
    _load_gemma3,
)


def _shakespeare_loader(name: str):
    def load_it(dtype: torch.dtype):
        from labkit.data import paths
        from labkit.model.checkpoint import load_model
        from labkit.tokenizer.named import get_tokenizer

        path = paths.data_path(f"{name}.safetensors")
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: `git checkout -- data/` restores it, "
                                    f"`labkit train --model {name}` retrains it")
        model, _ = load_model(path, dtype=dtype)
        return model, get_tokenizer("shakespeare")

    return load_it


register("shakespeare", "the lab's Shakespeare target: a small Llama (GQA 6/2 heads) trained by labkit on 33 plays",
         _shakespeare_loader("shakespeare"))
register("shakespeare-csa", "the target with compressed sparse attention (blocks of 4 tokens, a top-16 indexer, a "
         "64-token window), trained with the target's recipe", _shakespeare_loader("shakespeare-csa"))
register("shakespeare-draft", "its draft for speculative decoding: a much smaller Llama, distilled from the target",
         _shakespeare_loader("shakespeare-draft"))
