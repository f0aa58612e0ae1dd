"""The lab's committed data files and their checksums (`data/SHA256SUMS`).

Every file under `data/` except its README is listed in `data/SHA256SUMS`, in
`sha256sum` format, so `labkit doctor` (and `sha256sum -c`) can prove that the
corpus, tokenizers, checkpoints and hardware profiles are the ones the chapters
were executed with.

    python -m labkit.data.files write     # after rebuilding a data file
    python -m labkit.data.files check
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from labkit.data.paths import DATA_DIR

SUMS_NAME = "SHA256SUMS"
UNLISTED = frozenset({SUMS_NAME, "README.md"})


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def data_files(data_dir: Path = DATA_DIR) -> list[Path]:
    """Files under `data_dir` that must carry a checksum (sorted, relative paths)."""
    return sorted(
        p.relative_to(data_dir)
        for p in Path(data_dir).rglob("*")
        if p.is_file() and p.name not in UNLISTED and "__pycache__" not in p.parts
    )


def read_sums(data_dir: Path = DATA_DIR) -> dict[str, str]:
    path = Path(data_dir) / SUMS_NAME
    if not path.is_file():
        return {}
    sums = {}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64:
            raise ValueError(f"{path}:{lineno}: not a sha256sum line: {line!r}")
        sums[name] = digest
    return sums


def write_sums(data_dir: Path = DATA_DIR) -> Path:
    path = Path(data_dir) / SUMS_NAME
    lines = [f"{sha256(Path(data_dir) / rel)}  {rel.as_posix()}" for rel in data_files(data_dir)]
    path.write_text("\n".join(lines) + "\n")
    return path


def check(data_dir: Path = DATA_DIR) -> list[tuple[str, bool, str]]:
    """(name, ok, detail) for every listed or present data file."""
    sums = read_sums(data_dir)
    present = {p.as_posix() for p in data_files(data_dir)}
    results = []
    for name in sorted(set(sums) | present):
        path = Path(data_dir) / name
        if name not in sums:
            results.append((name, False, f"not listed in data/{SUMS_NAME}"))
        elif not path.is_file():
            results.append((name, False, "missing"))
        else:
            digest = sha256(path)
            ok = digest == sums[name]
            detail = f"sha256 {digest[:12]}, {path.stat().st_size:,} bytes"
            results.append((name, ok, detail if ok else f"checksum mismatch ({detail}, expected {sums[name][:12]})"))
    return results


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["write"]:
        print(f"wrote {write_sums()}")
        return 0
    bad = 0
    for name, ok, detail in check():
        print(f"[{'OK' if ok else 'FAIL'}] data/{name}: {detail}")
        bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
