"""Weights: number formats and the GGUF block formats (Q4_0, Q4_1, Q8_0, ...), quantize and dequantize."""
from labkit.quant import ggml

__all__ = ["ggml"]
