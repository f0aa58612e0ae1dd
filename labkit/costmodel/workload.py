"""Work per phase: FLOPs and bytes of a prefill and of one decode step, from a model config.

Any object with the attributes n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff (the
SwiGLU hidden size; `ffn_dim` is accepted too), vocab_size and tie_embeddings works as a config
(duck typing); so does a preset name of `labkit.model.config.ModelConfig`.

Counting rules (Llama-style decoder, per sequence):
  - linear layers: 2 FLOPs per weight per token (multiply + add); in a prefill the LM head runs
    on the last position only (as `labkit.prefill` and serving engines do);
  - attention: QK^T and AV cost 4 * n_layers * (n_heads * head_dim) FLOPs per (query, key) pair;
    a causal prefill of L tokens has L(L+1)/2 pairs;
  - KV cache: 2 (K and V) * n_layers * n_kv_heads * head_dim elements per token;
  - activations: each linear layer reads its input and writes its output once
    (4 d + 2 n_heads head_dim + 3 d_ff elements per token and layer; elementwise ops fused).
Norm, softmax and RoPE arithmetic is left out (< 1 % of the FLOPs).

Source: the formulas of LLM-Viewer (hahnyuan/LLM-Viewer model_analyzer.py) and llm-analysis
(cli99/llm-analysis analysis.py), restated for Llama's GQA and SwiGLU.

    >>> shape = ModelShape.of(LLAMA_2_13B_LIKE)
    >>> round(shape.n_params / 1e9, 2), shape.kv_elems_per_token * 2   # 13B, and KV bytes/token in fp16
    (13.02, 819200)
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from labkit.model.config import kv_bytes

__all__ = ["ModelShape", "Work", "bits_per_element", "prefill_work", "decode_work", "kv_bytes_per_token", "resolve_config",
           "check_lengths"]

_FIELDS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size")
_ALIASES = {"d_ff": "ffn_dim"}

# Used in this module's doctest only.
LLAMA_2_13B_LIKE = SimpleNamespace(n_layers=40, d_model=5120, n_heads=40, n_kv_heads=40, head_dim=128,
                                   d_ff=13824, vocab_size=32000, tie_embeddings=False)


def resolve_config(config):
    """A config object, or a preset name looked up with `labkit.model.config.ModelConfig.from_name`."""
    if isinstance(config, str):
        from labkit.model.config import ModelConfig

        return ModelConfig.from_name(config)
    return config


def bits_per_element(bits: float, group_size: int = 64, scale_bits: int = 16, zero_bits: int = 0) -> float:
    """Storage bits per element of a group-quantized tensor: b + (scale + zero) / group.

    16- and 32-bit tensors carry no scales. INT4 with groups of 64, fp16 scale and fp16 zero
    point is 4.5 bits; INT8 with an fp16 scale per 64 is 8.25 bits.

    >>> bits_per_element(4, 64, 16, 16), bits_per_element(8, 64, 16), bits_per_element(16)
    (4.5, 8.25, 16.0)
    """
    if not (isinstance(bits, (int, float)) and 1 <= bits <= 32):
        raise ValueError(f"bits must be between 1 and 32, got {bits!r}")
    if bits >= 16:
        return float(bits)
    if not (isinstance(group_size, int) and group_size >= 1):
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    return bits + (scale_bits + zero_bits) / group_size


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a config that the cost model needs."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    tie_embeddings: bool

    @classmethod
    def of(cls, config) -> "ModelShape":
        config = resolve_config(config)
        if isinstance(config, cls):
            return config

        def get(f):
            return getattr(config, f) if hasattr(config, f) else getattr(config, _ALIASES.get(f, f), None)

        values = {f: get(f) for f in _FIELDS}
        missing = [f for f, v in values.items() if v is None]
        if missing:
            raise TypeError(f"config must have the attributes {_FIELDS} (+ head_dim, tie_embeddings); missing {missing}")
        head_dim = getattr(config, "head_dim", None) or values["d_model"] // values["n_heads"]
        values["head_dim"] = head_dim
        for name, value in values.items():
            if not (isinstance(value, (int, np.integer)) and value > 0):
                raise ValueError(f"config.{name} must be a positive integer, got {value!r}")
        if values["n_heads"] % values["n_kv_heads"]:
            raise ValueError(f"config.n_heads must be a multiple of n_kv_heads, got {values['n_heads']} and {values['n_kv_heads']}")
        return cls(tie_embeddings=bool(getattr(config, "tie_embeddings", False)), **{k: int(v) for k, v in values.items()})

    @property
    def attn_width(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        d = self.d_model
        return d * (self.attn_width + 2 * self.kv_width) + self.attn_width * d + 3 * d * self.d_ff

    @property
    def head_params(self) -> int:
        """The LM head's weights (vocab x d_model), tied to the embedding or not."""
        return self.vocab_size * self.d_model

    @property
    def matmul_params(self) -> int:
        """Weights multiplied per token: every layer's linears plus the LM head."""
        return self.n_layers * self.layer_matmul_params + self.head_params

    @property
    def n_params(self) -> int:
        norms = self.n_layers * 2 * self.d_model + self.d_model
        embed = self.vocab_size * self.d_model
        return self.n_layers * self.layer_matmul_params + norms + embed * (1 if self.tie_embeddings else 2)

    @property
    def streamed_params(self) -> int:
        """Weights read per forward pass: the input embedding is a lookup (one row), so not streamed."""
        return self.matmul_params + self.n_layers * 2 * self.d_model + self.d_model

    @property
    def kv_elems_per_token(self) -> int:
        return 2 * self.n_layers * self.kv_width

    def act_elems_per_token(self, tp: int = 1) -> float:
        """Activation elements written + read per token over all layers (model-parallel parts split by tp)."""
        per_layer = 4 * self.d_model + (2 * self.attn_width + 3 * self.d_ff) / tp
        return self.n_layers * per_layer


def kv_bytes_per_token(config, kv_bits: float = 16, kv_group: int = 64) -> float:
    """Bytes of KV cache per token: 2 * n_layers * n_kv_heads * head_dim * bytes per element.

    >>> kv_bytes_per_token(LLAMA_2_13B_LIKE)     # 0.82 MB, not the "1 MB" of the rule of thumb
    819200.0
    """
    shape = ModelShape.of(config)
    return kv_bytes(shape.kv_elems_per_token, kv_bits, kv_group)  # the config's formula (scale and minimum per group)


@dataclass
class Work:
    """FLOPs and bytes of one phase on one device, split into the linear and the attention part.

    Every field is a numpy array (or float) broadcast over the lengths asked for.
    """

    linear_flops: np.ndarray
    attn_flops: np.ndarray
    weight_bytes: float          # weights read (per device)
    act_bytes: np.ndarray        # activations written + read
    kv_read_bytes: np.ndarray    # KV cache read
    kv_write_bytes: np.ndarray   # KV cache appended
    kv_resident_bytes: np.ndarray  # KV held in memory after the phase (per device)
    comm_bytes: np.ndarray       # bytes all-reduced per tensor-parallel all-reduce
    n_allreduce: int             # all-reduces in the phase (0 without tensor parallelism)
    rows: np.ndarray = 1.0       # tokens that share each read of a block weight (the rows of its products)
    head_flops: np.ndarray = 0.0  # the LM head's part of linear_flops: it runs on head_rows rows only
    head_bytes: float = 0.0      # the LM head's part of weight_bytes
    head_rows: float = 1.0       # rows of the LM head's product (prefill: the last position of each sequence)

    @property
    def flops(self):
        return self.linear_flops + self.attn_flops

    @property
    def bytes(self):
        return self.weight_bytes + self.act_bytes + self.kv_read_bytes + self.kv_write_bytes


def _head_bytes(shape: ModelShape, weight_bits, tp, weight_group) -> float:
    return shape.head_params * bits_per_element(weight_bits, weight_group, 16, 16) / 8 / tp


def _device_parts(shape: ModelShape, weight_bits, kv_bits, act_bits, tp, weight_group, kv_group):
    w_bytes = shape.streamed_params * bits_per_element(weight_bits, weight_group, 16, 16) / 8 / tp
    kv_heads_dev = max(shape.n_kv_heads / tp, 1)
    kv_tok = kv_bytes(2 * shape.n_layers * kv_heads_dev * shape.head_dim, kv_bits, kv_group)
    a_bytes = max(act_bits, 8) / 8
    return w_bytes, kv_tok, a_bytes


def prefill_work(config, prompt_len, batch: int = 1, weight_bits=16, kv_bits=16, act_bits=16, tp: int = 1,
                 weight_group: int = 64, kv_group: int = 64) -> Work:
    """Work of a prefill of `prompt_len` tokens (array allowed) for `batch` sequences, per device."""
    shape = ModelShape.of(config)
    L = np.asarray(prompt_len, dtype=float)
    w_bytes, kv_tok, a_bytes = _device_parts(shape, weight_bits, kv_bits, act_bits, tp, weight_group, kv_group)
    tokens = batch * L
    lm_head = shape.head_params
    return Work(
        linear_flops=2.0 * ((shape.matmul_params - lm_head) * tokens + lm_head * batch) / tp,
        attn_flops=2.0 * shape.n_layers * shape.attn_width / tp * L * (L + 1) * batch,
        weight_bytes=w_bytes,
        act_bytes=shape.act_elems_per_token(tp) * tokens * a_bytes,
        kv_read_bytes=0.0 * L,
        kv_write_bytes=kv_tok * tokens,
        kv_resident_bytes=kv_tok * tokens,
        comm_bytes=tokens * shape.d_model * a_bytes,
        n_allreduce=2 * shape.n_layers if tp > 1 else 0,
        rows=tokens,
        head_flops=2.0 * lm_head * batch / tp + 0 * L,
        head_bytes=_head_bytes(shape, weight_bits, tp, weight_group),
        head_rows=float(batch),
    )


def decode_work(config, context, batch: int = 1, weight_bits=16, kv_bits=16, act_bits=16, tp: int = 1,
                weight_group: int = 64, kv_group: int = 64) -> Work:
    """Work of one decode step when the cache already holds `context` tokens (array allowed).

    The step reads the whole cache, appends one entry, and attends over context + 1 keys.
    """
    shape = ModelShape.of(config)
    c = np.asarray(context, dtype=float)
    w_bytes, kv_tok, a_bytes = _device_parts(shape, weight_bits, kv_bits, act_bits, tp, weight_group, kv_group)
    return Work(
        linear_flops=2.0 * shape.matmul_params * batch / tp + 0 * c,
        attn_flops=4.0 * shape.n_layers * shape.attn_width / tp * (c + 1) * batch,
        weight_bytes=w_bytes,
        act_bytes=shape.act_elems_per_token(tp) * batch * a_bytes + 0 * c,
        kv_read_bytes=kv_tok * c * batch,
        kv_write_bytes=kv_tok * batch + 0 * c,
        kv_resident_bytes=kv_tok * (c + 1) * batch,
        comm_bytes=batch * shape.d_model * a_bytes + 0 * c,
        n_allreduce=2 * shape.n_layers if tp > 1 else 0,
        rows=batch + 0 * c,
        head_flops=2.0 * shape.head_params * batch / tp + 0 * c,
        head_bytes=_head_bytes(shape, weight_bits, tp, weight_group),
        head_rows=float(batch),
    )


def check_lengths(**values) -> None:
    """Raise a ValueError naming the first length that is not an integer >= its minimum.

    Call as check_lengths(prompt_len=(512, 1), reply_len=(32, 1)).
    """
    for name, (value, minimum) in values.items():
        arr = np.asarray(value)
        if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))):
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if np.any(arr < minimum):
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return None

