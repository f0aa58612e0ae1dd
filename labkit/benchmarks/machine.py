"""This machine: CPU threads, copy and streaming-read bandwidth, matmul FLOP/s."""
from __future__ import annotations

TITLE = "this machine: memory bandwidth and matmul throughput"


def run(quick: bool = False) -> dict:
    from labkit.costmodel import measure as hwmeasure

    copy_gb_s = hwmeasure.copy_bandwidth_gb_s(seconds=0.5 if quick else 1.0)
    read_gb_s = hwmeasure.read_bandwidth_gb_s(seconds=0.5 if quick else 1.0)
    flops = hwmeasure.matmul_flops(seconds=0.5 if quick else 1.0)
    threads = hwmeasure.cpu_threads()
    print(f"  CPU threads (torch):           {threads}")
    print(f"  copy bandwidth (read+write):   {copy_gb_s:8.2f} GB/s")
    print(f"  streaming-read bandwidth:      {read_gb_s:8.2f} GB/s   (the decode roofline)")
    print(f"  float32 matmul:                {flops / 1e9:8.1f} GFLOP/s")
    return {"cpu_threads": threads, "copy_gb_s": copy_gb_s, "read_gb_s": read_gb_s, "matmul_flops": flops}
