"""KV caches: one interface (`KVCache` in `base.py`), one module per kind, KV quantization, memory arithmetic.

A kind registers itself by subclassing `KVCache` with a class attribute `kind`;
`new_cache(kind, config, ...)` (and `model.new_cache(kind=...)`) finds it, importing
the kind modules on first use. `quantize.py` holds KIVI's integer codes, `memory.py`
the bytes a cache takes, `sizing.py` the option each kind needs to hold the same bytes,
`evaluate.py` what a lossy kind costs in quality, `longcontext.py` a long text through any kind.

    >>> from labkit.model import ModelConfig
    >>> cache = new_cache("contiguous", ModelConfig.from_name("smollm2-135m"), max_len=16)
    >>> cache.seq_len, cache.bytes_allocated()
    (0, 737280)
"""
from labkit.kvcache.base import KINDS, KVCache, kinds, new_cache
from labkit.kvcache.longcontext import long_perplexity
from labkit.kvcache.memory import (contiguous_fragmentation, kv_bytes_per_token, memory_rows, paged_fragmentation,
                                   paged_slots)
from labkit.kvcache.sizing import equal_bytes_options

__all__ = ["KVCache", "KINDS", "kinds", "new_cache", "kv_bytes_per_token", "memory_rows", "paged_slots",
           "paged_fragmentation", "contiguous_fragmentation", "equal_bytes_options", "long_perplexity"]
