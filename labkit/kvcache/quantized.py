"""The quantized KV cache: int8 or int4 codes, with a full-precision residual window (KIVI).

Follows Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache"
(jy-yuan/KIVI, `models/llama_kivi.py`), at 8 and 4 bits (`labkit.kvcache.quantize` has the maths):

- keys (after RoPE) are quantized per channel, in groups of `group_size` tokens: the
  newest keys wait in a full-precision tail until it holds `residual` tokens, then the
  whole chunk is quantized at once;
- values are quantized per token, in groups of `group_size` channels: the latest
  `residual` values stay in full precision and the oldest one is quantized when a new
  one arrives.

A forward pass attends over the cached (dequantized) tokens plus its own new keys and
values at full precision; what it stores for later is quantized.

    >>> from labkit.model import ModelConfig
    >>> cfg = ModelConfig(d_model=64, n_layers=1, n_heads=2, vocab_size=10, ffn_dim=8)   # head_dim 32
    >>> cache = QuantizedCache(cfg, max_len=1024, bits=4, group_size=32, residual=32)
    >>> k = v = torch.randn(1, 2, 1000, 32)                            # [B, n_kv_heads, T, head_dim]
    >>> _ = cache.begin(1000); _ = cache.update(0, k, v, lambda x, positions: x); cache.end()
    >>> cache.counts                 # keys: 31 chunks of 32 as codes, 8 in the tail; values: latest 32 kept
    {'qk': 992, 'kt': 8, 'qv': 968, 'vt': 32}
    >>> round(cache.bytes_used() / (2 * 2 * 1000 * 32 * 4), 3)        # share of a float32 cache: 5/32 + tails
    0.173
"""
from __future__ import annotations

import torch

from labkit.kvcache.base import KVCache, causal_mask
from labkit.kvcache.quantize import SCALE_DTYPE, check_bits, dequantize_keys, dequantize_values, quantize_keys, quantize_values

__all__ = ["QuantizedCache"]


class QuantizedCache(KVCache):
    """KIVI-style cache: `bits` (8 or 4), `group_size` (divides head_dim), `residual`
    full-precision tokens (a multiple of group_size)."""

    kind = "quantized"

    def __init__(self, config, *, bits: int = 8, group_size: int = 32, residual: int = 128, **opts):
        super().__init__(config, **opts)
        check_bits(bits)
        D = config.head_dim
        if not isinstance(group_size, int) or group_size < 1 or D % group_size:
            raise ValueError(f"group_size must be a positive divisor of head_dim={D}, got {group_size!r}")
        if not isinstance(residual, int) or residual < group_size or residual % group_size:
            raise ValueError(f"residual must be a positive multiple of group_size={group_size}, got {residual!r}")
        self.bits, self.group_size, self.residual = bits, group_size, residual
        lead = (config.n_layers, self.batch_size, config.n_kv_heads)
        code_dim = D * bits // 8
        new = lambda *shape, dtype=SCALE_DTYPE: torch.zeros(*lead, *shape, dtype=dtype, device=self.device)  # noqa: E731
        n_groups = -(-self.max_len // group_size)
        self.k_codes, self.v_codes = new(self.max_len, code_dim, dtype=torch.uint8), new(self.max_len, code_dim, dtype=torch.uint8)
        self.k_scale, self.k_min = new(n_groups, D), new(n_groups, D)  # per channel per group of tokens
        self.v_scale, self.v_min = new(self.max_len, D // group_size), new(self.max_len, D // group_size)  # per token
        self.k_tail, self.v_tail = new(residual, D, dtype=self.dtype), new(residual, D, dtype=self.dtype)
        # tokens held as codes / in the full-precision tails; n_qk + n_kt == n_qv + n_vt == seq_len
        self._n = dict(qk=0, kt=0, qv=0, vt=0)
        self._next = None
        self._mask = None
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> (keys, values) of this pass

    @property
    def seq_len(self) -> int:
        return self._n["qk"] + self._n["kt"]

    @property
    def counts(self) -> dict[str, int]:
        """Tokens held as key codes (qk), in the key tail (kt), as value codes (qv), in the value tail (vt)."""
        return dict(self._n)

    def begin(self, n_new: int) -> torch.Tensor:
        self.check_new(n_new)
        n, R = self._n, self.residual
        t = n["kt"] + n_new  # key tail after the append; whole chunks of R tokens get quantized
        u = n["vt"] + n_new  # value tail after the append; all but the latest R get quantized
        self._next = dict(qk=n["qk"] + t // R * R, kt=t % R, qv=n["qv"] + max(0, u - R), vt=min(u, R))
        self._n_new = n_new
        self._mask = causal_mask(n_new, self.seq_len + n_new, self.device)
        return self.new_positions(self.seq_len, n_new)

    def _cached(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The committed tokens, dequantized: keys and values [B, H, seq_len, D]."""
        n, G, b = self._n, self.group_size, self.bits
        keys = dequantize_keys(self.k_codes[layer, :, :, :n["qk"]], self.k_scale[layer, :, :, :n["qk"] // G],
                               self.k_min[layer, :, :, :n["qk"] // G], b, G, self.dtype)
        values = dequantize_values(self.v_codes[layer, :, :, :n["qv"]], self.v_scale[layer, :, :, :n["qv"]],
                                   self.v_min[layer, :, :, :n["qv"]], b, G, self.dtype)
        return (torch.cat([keys, self.k_tail[layer, :, :, :n["kt"]]], dim=2),
                torch.cat([values, self.v_tail[layer, :, :, :n["vt"]]], dim=2))

    def update(self, layer, k, v, rope):
        if layer == 0:
            self.check_kv(layer, k, v)
        # KIVI quantizes keys post-RoPE: they arrive rotated (rotate_new_keys)
        old_k, old_v = self._cached(layer)
        self._pending[layer] = (k, v)  # stored at end(), so a failed pass leaves the cache as it was
        return torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2), self._mask

    def _store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        n, nxt, G, b = self._n, self._next, self.group_size, self.bits
        # keys: whole chunks of the tail (old tail + new) as codes, the rest as the new tail
        tail = torch.cat([self.k_tail[layer, :, :, :n["kt"]], k], dim=2)  # [B, H, kt + n_new, D]
        nq = nxt["qk"] - n["qk"]
        if nq:
            codes, scale, lo = quantize_keys(tail[:, :, :nq], b, G)
            self.k_codes[layer, :, :, n["qk"]:nxt["qk"]] = codes
            self.k_scale[layer, :, :, n["qk"] // G:nxt["qk"] // G] = scale
            self.k_min[layer, :, :, n["qk"] // G:nxt["qk"] // G] = lo
        self.k_tail[layer, :, :, :nxt["kt"]] = tail[:, :, nq:]
        # values: everything but the latest `residual` tokens as codes
        tail = torch.cat([self.v_tail[layer, :, :, :n["vt"]], v], dim=2)  # [B, H, vt + n_new, D]
        nq = nxt["qv"] - n["qv"]
        if nq:
            codes, scale, lo = quantize_values(tail[:, :, :nq], b, G)
            self.v_codes[layer, :, :, n["qv"]:nxt["qv"]] = codes
            self.v_scale[layer, :, :, n["qv"]:nxt["qv"]] = scale
            self.v_min[layer, :, :, n["qv"]:nxt["qv"]] = lo
        self.v_tail[layer, :, :, :nxt["vt"]] = tail[:, :, nq:]

    def end(self) -> None:
        if self._n_new is None:
            raise RuntimeError("end() called without begin()")
        for layer, (k, v) in self._pending.items():
            self._store(layer, k, v)
        self._n, self._next = self._next, None
        self.abort()

    def abort(self) -> None:
        self._next = self._n_new = self._mask = None
        self._pending = {}

    def reset(self) -> None:
        self._n = dict(qk=0, kt=0, qv=0, vt=0)
        self.abort()

    def layer_kv(self, layer: int, rope=None) -> tuple[torch.Tensor, torch.Tensor]:
        """What `layer` attends over next step: dequantized keys (rotated) and values [B, H, seq_len, D]."""
        return self._cached(layer)

    def bytes_allocated(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._buffers().values())

    def bytes_used(self) -> int:
        n, G, c = self._n, self.group_size, self.config
        per_head = ((n["qk"] + n["qv"]) * c.head_dim * self.bits // 8  # codes
                    + (n["qk"] // G * c.head_dim + n["qv"] * c.head_dim // G) * 2 * self.k_scale.element_size()  # scales, mins
                    + (n["kt"] + n["vt"]) * c.head_dim * self.k_tail.element_size())  # full-precision tails
        return c.n_layers * self.batch_size * c.n_kv_heads * per_head

    # ---- checkpoints (labkit.generation.state) ----------------------------------------------

    def _buffers(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in
                ("k_codes", "k_scale", "k_min", "v_codes", "v_scale", "v_min", "k_tail", "v_tail")}

    def options(self) -> dict:
        return {"max_len": self.max_len, "batch_size": self.batch_size, "bits": self.bits,
                "group_size": self.group_size, "residual": self.residual}

    def _used(self) -> dict[str, int]:
        n, G = self._n, self.group_size
        return {"k_codes": n["qk"], "k_scale": n["qk"] // G, "k_min": n["qk"] // G, "v_codes": n["qv"],
                "v_scale": n["qv"], "v_min": n["qv"], "k_tail": n["kt"], "v_tail": n["vt"]}

    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict]:
        used = self._used()
        return {name: t[:, :, :, :used[name]] for name, t in self._buffers().items()}, {"counts": dict(self._n)}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        self._n = {k: int(v) for k, v in meta["counts"].items()}
        used = self._used()
        for name, buffer in self._buffers().items():
            buffer[:, :, :, :used[name]] = tensors[name]
