"""Weights: number formats, round-to-nearest quantization (`rtn`), the GGUF block formats (`ggml`)."""
from labkit.quant import ggml
from labkit.quant.rtn import BITS, QuantizedTensor, bits_per_weight, dequantize, quantize

__all__ = ["quantize", "dequantize", "QuantizedTensor", "bits_per_weight", "BITS", "ggml"]
