"""Loading a benchmark's model, or saying why the benchmark is skipped."""
from __future__ import annotations

__all__ = ["load_or_skip"]


def load_or_skip(name: str, **kwargs):
    """(model, tokenizer, None), or (None, None, report) with the reason printed when the model is not installed."""
    import labkit

    try:
        model, tok = labkit.load(name, **kwargs)
    except FileNotFoundError as exc:
        print(f"  skipped: {exc}")
        return None, None, {"skipped": str(exc)}
    return model, tok, None
