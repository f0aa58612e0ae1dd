"""KV caches: one interface (`KVCache` in `base.py`), one module per kind, KV quantization, memory arithmetic.

A kind registers itself by subclassing `KVCache` with a class attribute `kind`;
`new_cache(kind, config, ...)` (and `model.new_cache(kind=...)`) finds it, importing
the kind modules on first use. `quantize.py` holds KIVI's integer codes, `memory.py`
the bytes a cache takes, `evaluate.py` what a lossy kind costs in quality.

    >>> from labkit.model import ModelConfig
    >>> cache = new_cache("contiguous", ModelConfig.from_name("smollm2-135m"), max_len=16)
    >>> cache.seq_len, cache.bytes_allocated()
    (0, 737280)
"""
from labkit.kvcache.base import KINDS, KVCache, kinds, new_cache
from labkit.kvcache.memory import (contiguous_fragmentation, kv_bytes_per_token, memory_rows, paged_fragmentation,
                                   paged_slots)

__all__ = ["KVCache", "KINDS", "kinds", "new_cache", "kv_bytes_per_token", "memory_rows", "paged_slots",
           "paged_fragmentation", "contiguous_fragmentation"]
