"""Loading a benchmark's model, or saying why the benchmark is skipped; writing its report."""
from __future__ import annotations

__all__ = ["load_or_skip", "source_ids", "write_report"]


def load_or_skip(name: str, **kwargs):
    """(model, tokenizer, None), or (None, None, report) with the reason printed when the model is not installed."""
    import labkit

    try:
        model, tok = labkit.load(name, **kwargs)
    except FileNotFoundError as exc:
        print(f"  skipped: {exc}")
        return None, None, {"skipped": str(exc)}
    return model, tok, None


def source_ids(tok, chars: int = 60_000) -> list[int]:
    """The first `chars` characters of the held-out plays as `tok`'s ids: the text serving prompts are cut from."""
    from labkit.data import data_path

    return tok.encode(data_path("shakespeare_val.txt").read_text()[:chars])


def write_report(path: str | None, report: dict) -> None:
    """Write a bench's report (figures and the machine) as JSON to `path` with its provenance record
    (`labkit.benchmarks.evidence.stamp`: the command, the code, the peers), and say so; nothing without a path."""
    import json

    from labkit.benchmarks.evidence import stamp

    if path:
        report = stamp(report, path)
        with open(path, "w") as f:
            json.dump(report, f, default=float)
        print(f"wrote {path}")
