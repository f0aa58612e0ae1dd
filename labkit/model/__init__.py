"""The network: a model's config (and presets), RoPE, the Llama-style transformer, the GGUF weight loader."""
from labkit.model.config import ModelConfig
from labkit.model.probs import attention_probs
from labkit.model.transformer import Attention, Block, RMSNorm, SwiGLU, Transformer

__all__ = ["ModelConfig", "Transformer", "RMSNorm", "Attention", "SwiGLU", "Block", "attention_probs"]
