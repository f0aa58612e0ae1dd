"""The stored KV-compression runs chapter 04 reads: `python -m labkit.benchmarks.kv_compression --json data/kv_compression.json`.

Two parts, both printed as `labkit bench --only kvcache` prints them:

- **eviction at equal bytes** on SmolLM2-135M (float32): every cache kind at 10, 25 and 50 % of the
  full cache's bytes at L = 4,096 tokens (perplexity of held-out Shakespeare, passkey accuracy over
  3 seeded trials, ITL with every step's time), the two swapped feedings (`compression.PROTOCOLS`: SnapKV
  fed in chunks, H2O in one pass) at every budget, and the ITL against position up to 8,176 tokens for the
  first budget;
- **compressed attention** trained by the lab: the Shakespeare target against `shakespeare-csa`
  (`labkit.train.compare`).

The file names the CPU, the torch version and the thread count it was measured on
(`labkit.costmodel.cpu.cpu_info`); a chapter compares them with the reader's. About 15 minutes on 2 cores.
"""
from __future__ import annotations

import argparse

from labkit.measure.clock import now as clock_now

STORED = dict(length=4096, fractions=(0.1, 0.25, 0.5), trials=3, positions=[512, 2048, 4096, 8176], steps=7,
              passkey_lengths=[1024, 2048, 4096], protocols=True)


def run_stored(plan: dict | None = None) -> dict:
    import torch

    from labkit.benchmarks.loading import load_or_skip
    from labkit.benchmarks.kvcache import compression_tables, csa_section
    from labkit.costmodel.cpu import cpu_info

    model, tok, skipped = load_or_skip("smollm2-135m")
    if skipped:
        raise SystemExit(f"SmolLM2 is not available: {skipped}")
    start = clock_now()
    eviction = compression_tables(model, tok, plan or STORED)
    csa = csa_section(quick=False)
    return {"cpu": cpu_info(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "eviction": eviction, "compressed_attention": csa, "wall_s": clock_now() - start}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, metavar="FILE", help="where to write the runs")
    args = p.parse_args(argv)
    from labkit.benchmarks.loading import write_report

    out = run_stored()
    write_report(args.json, out)
    print(f"({out['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
