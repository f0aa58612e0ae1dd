"""Which CPU a figure was measured on: moved to `labkit.measure.cpu` (the measurement core records it
with every run); this name is kept so that `labkit.costmodel.cpu` still imports."""
from __future__ import annotations

from labkit.measure.cpu import (FLAGS, ISA_EMULATION, cpu_info, describe, differences, emulated_isa,  # noqa: F401
                                last_level_cache_bytes, provenance, read_cpuinfo)

__all__ = ["read_cpuinfo", "last_level_cache_bytes", "cpu_info", "describe", "differences", "provenance", "FLAGS",
           "ISA_EMULATION", "emulated_isa"]
