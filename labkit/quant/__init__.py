"""Weights: number formats, round-to-nearest quantization (`rtn`), the GGUF block formats (`ggml`),
weight-only quantized linear layers on the packed kernels (`linear`), whole-model quantization (`apply`).

Names resolve on first use (`__getattr__`): the model imports `labkit.quant.rows` without loading the
quantizers, the C++ kernels' build or the K-quant encoders, so a stored figure of a float model does not
depend on them (`labkit._loaded`)."""
import importlib

# public name -> the submodule that defines it
_NAMES = {"quantize": "rtn", "dequantize": "rtn", "QuantizedTensor": "rtn", "bits_per_weight": "rtn", "BITS": "rtn",
          "QuantLinear": "linear", "has_kernel": "linear", "quantize_model": "apply", "METHODS": "apply",
          "model_nbytes": "apply", "read_nbytes": "apply", "ggml": None, "mx": None}

__all__ = ["quantize", "dequantize", "QuantizedTensor", "bits_per_weight", "BITS", "ggml", "QuantLinear", "has_kernel",
           "quantize_model", "METHODS", "model_nbytes", "read_nbytes", "mx"]


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'labkit.quant' has no attribute {name!r}")
    where = _NAMES[name]
    if where is None:
        return importlib.import_module(f"labkit.quant.{name}")
    return getattr(importlib.import_module(f"labkit.quant.{where}"), name)


def __dir__():
    return sorted(set(globals()) | set(__all__))
