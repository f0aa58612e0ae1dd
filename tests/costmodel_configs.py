"""Published model shapes as plain stand-ins with ModelConfig's field names (duck typing)."""
from dataclasses import dataclass


@dataclass
class Cfg:  # a stand-in with the field names of labkit.model.config.ModelConfig's duck type
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    tie_embeddings: bool = False


# published shapes (Meta model cards / config.json)
L2_7B = Cfg(32, 4096, 32, 32, 128, 11008, 32000)
L2_13B = Cfg(40, 5120, 40, 40, 128, 13824, 32000)
L2_70B = Cfg(80, 8192, 64, 8, 128, 28672, 32000)
L32_3B = Cfg(28, 3072, 24, 8, 128, 8192, 128256, True)
L32_1B = Cfg(16, 2048, 32, 8, 64, 8192, 128256, True)
SMOL = Cfg(30, 576, 9, 3, 64, 1536, 49152, True)
