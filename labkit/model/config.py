"""`ModelConfig`: the shape of a Llama-architecture transformer, and named presets.

The presets follow the published configs (Meta's Llama 2 / Llama 3 / Llama 3.2 model
cards and `config.json` files, HuggingFaceTB's SmolLM2-135M-Instruct); the table
mirrors gpt-fast's `transformer_configs`. They feed the calculators (KV cache bytes,
parameter counts, FLOPs); `labkit.load` builds the config of a real model from its file.

    >>> cfg = ModelConfig.from_name("llama-2-13b")
    >>> cfg.kv_bytes_per_token(bytes_per_value=2)      # K and V, 40 layers, 40 heads of 128, fp16
    819200.0
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labkit import checks

ROPE_LAYOUTS = ("interleaved", "half")
NORM_PLACEMENTS = ("pre", "sandwich")  # Llama: x + f(norm(x)); Gemma: x + norm(f(norm(x)))
ACTIVATIONS = ("silu", "gelu_tanh")  # the gated MLP's gate: SwiGLU (Llama) or GeGLU with tanh-GELU (Gemma)
FAMILY_FIELDS = ("norm_placement", "qk_norm", "activation", "embed_scale", "layer_windows", "rope_local_base")
CSA_FIELDS = ("csa_block", "csa_topk", "csa_window", "csa_index_heads", "csa_index_dim")


@dataclass
class ModelConfig:
    """Hyper-parameters of a Llama-architecture decoder.

    `rope_layout` says how the Q/K weights pair up dimensions for the rotation:
    "interleaved" rotates (x0, x1), (x2, x3), ... (Meta's checkpoints, GGUF files);
    "half" rotates (x_i, x_{i+d/2}) (Hugging Face checkpoints). It must match the weights.
    """

    name: str = "custom"
    vocab_size: int = 32000
    d_model: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None  # None: same as n_heads (multi-head attention)
    head_dim: int | None = None  # None: d_model // n_heads
    ffn_dim: int = 11008  # width of the SwiGLU hidden layer
    rope_base: float = 10000.0
    rope_layout: str = "half"
    norm_eps: float = 1e-5
    max_seq_len: int = 4096  # the context window
    tie_embeddings: bool = False  # LM head shares the token-embedding matrix
    # compressed sparse attention (`labkit.model.compressed`, in the spirit of DeepSeek-V4's CSA); 0 = dense
    csa_block: int = 0  # m: every m consecutive tokens are merged into one compressed KV entry
    csa_topk: int = 0  # compressed entries the indexer selects for each query
    csa_window: int = 0  # recent tokens every query also attends to uncompressed
    csa_index_heads: int = 0  # the indexer's query heads
    csa_index_dim: int = 0  # the indexer's key and query width
    # one family's choices, each with Llama's default (Gemma 3's come from its file: `labkit.model.gguf`)
    norm_placement: str = "pre"  # "sandwich": the attention's and the MLP's outputs are normed too
    qk_norm: bool = False  # RMSNorm over each head of q and of k, before RoPE
    activation: str = "silu"
    embed_scale: float = 1.0  # token embeddings times this (Gemma: √d_model)
    layer_windows: tuple = ()  # () all global, else per layer: 0 (global) or the tokens a sliding layer attends to
    rope_local_base: float | None = None  # RoPE base of the sliding layers (None: rope_base)

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        for field in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_seq_len"):
            checks.positive_int(field, getattr(self, field))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads must be a multiple of n_kv_heads, got {self.n_heads} and {self.n_kv_heads}")
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model must be a multiple of n_heads when head_dim is not given, got {self.d_model} and {self.n_heads}")
            self.head_dim = self.d_model // self.n_heads
        if not isinstance(self.head_dim, int) or self.head_dim < 2 or self.head_dim % 2:
            raise ValueError(f"head_dim must be an even integer >= 2 (RoPE rotates pairs), got {self.head_dim!r}")
        if self.rope_layout not in ROPE_LAYOUTS:
            raise ValueError(f"rope_layout must be one of {ROPE_LAYOUTS}, got {self.rope_layout!r}")
        if not self.rope_base > 1:
            raise ValueError(f"rope_base must be > 1, got {self.rope_base}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps}")
        csa = {f: getattr(self, f) for f in CSA_FIELDS}
        for field, value in csa.items():
            checks.integer(field, value, 0)
        if any(csa.values()) and not all(csa.values()):
            raise ValueError(f"compressed attention needs all of {', '.join(CSA_FIELDS)} >= 1 (or all 0 for dense "
                             f"attention), got {csa}")
        self._check_family()
        if self.csa_block and self.csa_window < max(2, self.csa_block):
            raise ValueError(f"csa_window must be at least csa_block and 2 (the window covers the block being filled "
                             f"and one token before the query), got csa_window={self.csa_window} and "
                             f"csa_block={self.csa_block}")

    def _check_family(self) -> None:
        checks.one_of("norm_placement", self.norm_placement, NORM_PLACEMENTS)
        checks.flag("qk_norm", self.qk_norm)
        checks.one_of("activation", self.activation, ACTIVATIONS)
        checks.positive("embed_scale", self.embed_scale)
        self.layer_windows = tuple(self.layer_windows)
        if self.layer_windows and len(self.layer_windows) != self.n_layers:
            raise ValueError(f"layer_windows must be empty or give one window per layer ({self.n_layers}), "
                             f"got {len(self.layer_windows)}")
        for w in self.layer_windows:
            checks.integer("layer_windows entries", w, 0, why="0 for a global layer")
        checks.number("rope_local_base", self.rope_local_base, 1, low_open=True, none_ok=True)
        if self.compressed_attention and (self.layer_windows or self.qk_norm or self.norm_placement != "pre"):
            raise ValueError("compressed attention (csa_*) is implemented for the Llama block only: no layer_windows, "
                             "qk_norm or sandwich norms with it")

    @property
    def sliding_window(self) -> int:
        """The smallest window of a sliding layer (0: every layer global)."""
        return min((w for w in self.layer_windows if w), default=0)

    def identity(self) -> dict:
        """The fields as a dict, leaving out the family fields at their Llama default: a Llama config's identity (its
        saved states' fingerprint) stays what it was before those fields existed."""
        default = ModelConfig.__dataclass_fields__
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k not in FAMILY_FIELDS or v != default[k].default}

    def __repr__(self) -> str:  # the dataclass's form, leaving out fields at their Llama default
        shown = [k for k in self.identity() if self.compressed_attention or k not in CSA_FIELDS]
        return f"ModelConfig({', '.join(f'{n}={getattr(self, n)!r}' for n in shown)})"

    @property
    def compressed_attention(self) -> bool:
        """Whether the attention layers are compressed sparse attention (`labkit.model.compressed`)."""
        return self.csa_block > 0

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA): 9 / 3 = 3 for SmolLM2."""
        return self.n_heads // self.n_kv_heads

    @property
    def index_width(self) -> int:
        """Outputs of the indexer's projection: its query heads, a weight per head, one key."""
        return self.csa_index_heads * self.csa_index_dim + self.csa_index_heads + self.csa_index_dim

    def replace(self, **changes) -> "ModelConfig":
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_name(cls, name: str) -> "ModelConfig":
        """A preset: `ModelConfig.from_name("smollm2-135m")`. See `PRESETS` for the names."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
        return cls(name=name, **PRESETS[name])

    # ---- sizes, from the shapes alone -------------------------------------------------

    def param_counts(self) -> dict[str, int]:
        """Parameters by part: embedding, attention, mlp, norms, lm_head (0 when tied)."""
        d, hd = self.d_model, self.head_dim
        q_out, kv_out = self.n_heads * hd, self.n_kv_heads * hd
        attention = d * q_out + 2 * d * kv_out + q_out * d  # Wq, Wk, Wv, Wo
        if self.compressed_attention:  # the compression's gate and slot bias, the indexer (`labkit.model.compressed`)
            attention += 2 * d * kv_out + self.csa_block * kv_out + d * self.index_width  # W_c, W_z, slot bias, indexer
        mlp = 3 * d * self.ffn_dim  # gate, up, down
        per_layer = (4 if self.norm_placement == "sandwich" else 2) * d + (2 * hd if self.qk_norm else 0)
        return {
            "embedding": self.vocab_size * d,
            "attention": self.n_layers * attention,
            "mlp": self.n_layers * mlp,
            "norms": self.n_layers * per_layer + d,
            "lm_head": 0 if self.tie_embeddings else self.vocab_size * d,
        }

    def n_params(self) -> int:
        """Total distinct parameters (a tied LM head is counted once)."""
        return sum(self.param_counts().values())

    def matmul_params(self) -> int:
        """Weights that multiply every token's activations: all linears plus the LM head.

        This is what one decode step reads (the embedding row lookup reads only one row).
        """
        counts = self.param_counts()
        return counts["attention"] + counts["mlp"] + self.vocab_size * self.d_model

    def flops_per_token(self, context_len: int = 0) -> int:
        """Forward FLOPs for one token that attends to `context_len` earlier tokens.

        2 FLOPs (multiply + add) per weight of every matmul, plus attention's
        `q·k` and `p·v`: 2 · 2 · n_layers · n_heads · head_dim per attended token.
        Norms, RoPE and softmax are left out (a fraction of a percent). For a compressed-attention config
        the attention term counts every earlier token, as a dense layer would (an upper bound).
        """
        attend = context_len + 1
        return 2 * self.matmul_params() + 4 * self.n_layers * self.n_heads * self.head_dim * attend

    def kv_bytes_per_token(self, bytes_per_value: float = 2, group_size: int | None = None) -> float:
        """KV cache bytes per token: 2 (K and V) · n_layers · n_kv_heads · head_dim values (`kv_bytes`).

        Below 2 bytes a value, `group_size` adds each group's float16 scale and minimum. A compressed-attention
        config has no fixed size per token (`labkit.kvcache.compressed.CompressedCache.bytes_at`): refused.
        """
        if self.compressed_attention:
            raise ValueError(f"{self.name!r} has compressed attention: its cache holds no fixed bytes per token; "
                             f"use its cache's bytes_at(n_tokens)")
        return kv_bytes(2 * self.n_layers * self.n_kv_heads * self.head_dim, 8 * bytes_per_value, group_size)

    def kv_bytes_at(self, n_tokens: int, bytes_per_value: float = 2) -> float:
        """KV cache bytes of one sequence of `n_tokens`, each sliding layer holding at most its window."""
        checks.integer("n_tokens", n_tokens, 0)
        windows = self.layer_windows or (0,) * self.n_layers
        held = sum(min(n_tokens, w) if w else n_tokens for w in windows)
        return kv_bytes(2 * held * self.n_kv_heads * self.head_dim, 8 * bytes_per_value)


def kv_bytes(n_values: float, bits: float = 16, group_size: int | None = None) -> float:
    """Bytes `n_values` cached keys and values take at `bits` each: the lab's one KV size formula.

    Below 16 bits with `group_size`, every group of that many values also stores a float16 scale and a
    float16 minimum, as labkit's quantized caches do (`labkit.kvcache.quantize`, KIVI): 4 bits in groups
    of 64 are 4.5 bits a value. The KV-cache chapter, the serving memory and the cost model all use it.

    >>> kv_bytes(1000, 16), kv_bytes(1000, 4, 64)
    (2000.0, 562.5)
    """
    checks.number("bits", bits, 1, 64, why="float64")
    checks.positive_int("group_size", group_size, none_ok=True)
    per_value = bits + (32 / group_size if group_size and bits < 16 else 0)
    return n_values * per_value / 8


PRESETS: dict[str, dict] = {
    "llama-2-7b": dict(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_dim=11008,
                       rope_base=10000.0, max_seq_len=4096),
    "llama-2-13b": dict(vocab_size=32000, d_model=5120, n_layers=40, n_heads=40, n_kv_heads=40, ffn_dim=13824,
                        rope_base=10000.0, max_seq_len=4096),
    "llama-2-70b": dict(vocab_size=32000, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672,
                        rope_base=10000.0, max_seq_len=4096),
    "llama-3-8b": dict(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336,
                       rope_base=500000.0, max_seq_len=8192),
    # Llama 3.2 stretches RoPE for its 128k context ("llama3" rope scaling); the presets keep
    # the shapes, which is what the calculators need, and leave the frequency scaling out.
    "llama-3.2-1b": dict(vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64,
                         ffn_dim=8192, rope_base=500000.0, max_seq_len=131072, tie_embeddings=True),
    "llama-3.2-3b": dict(vocab_size=128256, d_model=3072, n_layers=28, n_heads=24, n_kv_heads=8, head_dim=128,
                         ffn_dim=8192, rope_base=500000.0, max_seq_len=131072, tie_embeddings=True),
    # the GGUF file stores Q/K in the interleaved layout (see labkit.model.rope)
    "smollm2-135m": dict(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536,
                         rope_base=100000.0, rope_layout="interleaved", max_seq_len=8192, tie_embeddings=True),
    # the lab's own models (labkit.train), on the 4k Shakespeare BPE
    "shakespeare": dict(vocab_size=4096, d_model=384, n_layers=8, n_heads=6, n_kv_heads=2, ffn_dim=1024,
                        rope_base=10000.0, max_seq_len=512, tie_embeddings=True),
    # the target's shape with compressed sparse attention (labkit.model.compressed); the FFN is narrowed so the
    # compression and the indexer leave the parameter count within 1 % of the dense target's
    "shakespeare-csa": dict(vocab_size=4096, d_model=384, n_layers=8, n_heads=6, n_kv_heads=2, ffn_dim=880,
                            rope_base=10000.0, max_seq_len=1024, tie_embeddings=True, csa_block=4, csa_topk=16,
                            csa_window=64, csa_index_heads=4, csa_index_dim=32),
    "shakespeare-draft": dict(vocab_size=4096, d_model=192, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=512,
                              rope_base=10000.0, max_seq_len=512, tie_embeddings=True),
}
