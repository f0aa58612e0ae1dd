"""The network: a model's config (and presets), RoPE, the Llama-style transformer, the GGUF weight loader."""
from labkit.model.config import ModelConfig
from labkit.model.transformer import Attention, Block, RMSNorm, SwiGLU, Transformer, attention_probs

__all__ = ["ModelConfig", "Transformer", "RMSNorm", "Attention", "SwiGLU", "Block", "attention_probs"]
