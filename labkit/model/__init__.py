"""The network: a model's config (and presets), RoPE, the Llama-style transformer, the GGUF weight loader.

Names resolve on first use (`__getattr__`), so importing one module of the package loads only what it needs."""
import importlib

_NAMES = {"ModelConfig": "config", "attention_probs": "probs", "Transformer": "transformer", "RMSNorm": "transformer",
          "Attention": "transformer", "SwiGLU": "transformer", "Block": "transformer"}

__all__ = ["ModelConfig", "Transformer", "RMSNorm", "Attention", "SwiGLU", "Block", "attention_probs"]


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'labkit.model' has no attribute {name!r}")
    return getattr(importlib.import_module(f"labkit.model.{_NAMES[name]}"), name)


def __dir__():
    return sorted(set(globals()) | set(__all__))
