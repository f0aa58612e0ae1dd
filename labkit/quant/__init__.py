"""Weights: number formats, round-to-nearest quantization (`rtn`), the GGUF block formats (`ggml`),
weight-only quantized linear layers on the packed kernels (`linear`), whole-model quantization (`apply`)."""
from labkit.quant import ggml, mx
from labkit.quant.apply import METHODS, model_nbytes, quantize_model, read_nbytes
from labkit.quant.linear import QuantLinear, has_kernel
from labkit.quant.rtn import BITS, QuantizedTensor, bits_per_weight, dequantize, quantize

__all__ = ["quantize", "dequantize", "QuantizedTensor", "bits_per_weight", "BITS", "ggml", "QuantLinear", "has_kernel",
           "quantize_model", "METHODS", "model_nbytes", "read_nbytes", "mx"]
