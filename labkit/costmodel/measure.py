"""Measure this machine: memory bandwidth (copy and streaming read) and matmul FLOP/s.

Decode speed is bounded by how fast the weights stream from memory, so the lab
measures that number instead of assuming it. Each measurement runs for about
the time asked and returns the median of its repeats.

    >>> bw = copy_bandwidth_gb_s(seconds=0.2)   # e.g. 9.8 (GB/s, reads + writes counted)
"""
from __future__ import annotations

from labkit import measure
from labkit.measure.clock import now as clock_now


def median_seconds(fn, seconds: float) -> float:
    """Median seconds of a call of `fn`, called for about `seconds` (`measure.run`, at least 3 rounds, after a
    warm-up call that pages in and allocates, and a second call that sizes the rounds)."""
    _check_seconds(seconds)
    fn()
    start = clock_now()
    fn()
    first = clock_now() - start
    rounds = max(3, min(100_000, int(seconds / max(first, 1e-9))))
    return measure.run({"call": fn}, rounds=rounds, warmup=0, machine=False)["call"].median


def _median_rate(fn, work: float, seconds: float) -> float:
    """`work` / the median seconds of a call of `fn` (`median_seconds`)."""
    return work / median_seconds(fn, seconds)


def _check_seconds(seconds: float) -> None:
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")


def cpu_threads() -> int:
    import torch

    return torch.get_num_threads()


def copy_bandwidth_gb_s(seconds: float = 1.0, megabytes: int = 128) -> float:
    """Copy bandwidth in GB/s: bytes read plus bytes written per second (STREAM 'copy' convention)."""
    import torch

    _check_seconds(seconds)
    n = megabytes * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    return _median_rate(lambda: dst.copy_(src), 2 * n * 4, seconds) / 1e9


def read_bandwidth_gb_s(seconds: float = 1.0, megabytes: int = 256) -> float:
    """Streaming-read bandwidth in GB/s: a `sum` over a large tensor (reads only).

    This is the roofline for batch-1 decode, which reads every weight once per token.
    """
    import torch

    _check_seconds(seconds)
    n = megabytes * 2**20 // 4
    x = torch.ones(n, dtype=torch.float32)
    return _median_rate(lambda: x.sum(), n * 4, seconds) / 1e9


def matmul_flops(seconds: float = 1.0, n: int = 1024, dtype: str = "float32") -> float:
    """Dense matmul throughput in FLOP/s (2·n³ per n×n product)."""
    import torch

    _check_seconds(seconds)
    a = torch.randn(n, n, dtype=getattr(torch, dtype))
    b = torch.randn(n, n, dtype=getattr(torch, dtype))
    return _median_rate(lambda: a @ b, 2.0 * n**3, seconds)


def operator_call_us(seconds: float = 0.5, calls: int = 2000) -> float:
    """Microseconds one small operator call costs from Python: dispatch and bookkeeping, almost no arithmetic.

    Times `calls` in-place adds on an 8-element tensor (one operator each, `torch.profiler` counts
    one); a decode step of a small model makes thousands of such calls besides its weight products.
    """
    import torch

    _check_seconds(seconds)
    a, b = torch.zeros(8), torch.ones(8)

    def loop():
        for _ in range(calls):
            a.add_(b)

    return 1e6 / _median_rate(loop, calls, seconds)


def cpu_flags(names=("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni", "avx_vnni", "amx_int8")) -> dict:
    """Which of these instruction-set flags the CPU reports (Linux `/proc/cpuinfo`); {} where it cannot be read.

    avx512_bf16 / amx_bf16: native bfloat16 dot products; avx512_vnni / avx_vnni / amx_int8: int8 dot products.
    What the CPU has, not what a process may use: `labkit.costmodel.cpu.emulated_isa` says when the
    environment caps the kernels below it.
    """
    from labkit.costmodel.cpu import read_cpuinfo

    have = read_cpuinfo()[1]
    return {n: n in have for n in names} if have else {}


def bf16_product_rates(seconds: float = 0.3, out_features: int | None = None, in_features: int = 2048) -> dict:
    """GB/s of weight read by a one-row product x Wᵀ (batch-1 decode's product) in float32 and in bfloat16.

    float32 W [N, K] and bfloat16 W [N, 2K] hold the same bytes: a product that streamed bfloat16 as
    fast as float32 would take the same time. By default N makes each matrix at least 4x this CPU's
    last-level cache (`cpu.last_level_cache_bytes`) and at least 64 MiB, at most 1 GiB, so that the
    weights stream from memory, as a model's do, rather than from the cache. Returns float32_gb_s,
    bfloat16_gb_s (equal bytes), their ratio `bf16_vs_f32` (near 1 where the bf16 product streams as
    fast per byte as float32, well below where it does not), `bytes` (of one matrix) and `llc_bytes`.
    """
    import torch

    from labkit.costmodel.cpu import last_level_cache_bytes

    _check_seconds(seconds)
    llc = last_level_cache_bytes()
    if out_features is None:
        want = min(max(64 * 2**20, 4 * (llc or 0)), 2**30)
        out_features = -(-want // (4 * in_features)) if isinstance(in_features, int) and in_features > 0 else 0
    for name, v in (("out_features", out_features), ("in_features", in_features)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    g = torch.Generator().manual_seed(0)
    w32 = torch.empty(out_features, in_features).uniform_(-1, 1, generator=g)  # uniform_: cheaper than randn
    w16 = torch.empty(out_features, 2 * in_features, dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
    x32, x16 = torch.randn(1, in_features, generator=g), torch.randn(1, 2 * in_features, generator=g).bfloat16()
    nbytes = w32.numel() * 4
    f32 = _median_rate(lambda: torch.mm(x32, w32.t()), nbytes, seconds) / 1e9
    b16 = _median_rate(lambda: torch.mm(x16, w16.t()), nbytes, seconds) / 1e9
    return {"float32_gb_s": f32, "bfloat16_gb_s": b16, "bf16_vs_f32": b16 / f32, "bytes": nbytes, "llc_bytes": llc}
