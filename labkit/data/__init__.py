"""Data: where the lab's files live, the Shakespeare corpus, the checksums of everything in `data/`."""
from labkit.data.paths import DATA_DIR, ROOT, data_path, smollm2_gguf_path

__all__ = ["DATA_DIR", "ROOT", "data_path", "smollm2_gguf_path"]
