"""The tokenizer commands: `labkit tokenize` and `labkit train-tokenizer` (which reproduces data/shakespeare-bpe-4k.json)."""
import json

import pytest

from labkit import cli
from labkit.data import corpus
from labkit.data import paths
from labkit.tokenizer import SHAKESPEARE_BPE, get_tokenizer
from labkit.tokenizer import BPETokenizer


def test_tokenize_prints_ids_and_count(capsys):
    assert cli.main(["tokenize", "--tokenizer", "smollm2", "Hello 2024<|im_end|>"]) == 0
    out = capsys.readouterr().out
    assert "b'<|im_end|>'" in out and "b'2'" in out and out.strip().endswith("bytes per token")
    assert cli.main(["tokenize", "--ids", "--tokenizer", "smollm2", "<|im_end|>"]) == 0
    assert capsys.readouterr().out.split() == ["2"]


def test_train_tokenizer_writes_what_train_makes(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text(corpus.load_text("val")[:20_000], encoding="utf-8")
    out = tmp_path / "tok.json"
    assert cli.main(["train-tokenizer", "--input", str(src), "--vocab-size", "400", "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    saved = BPETokenizer.load(out)
    fresh = BPETokenizer.train(src.read_text(encoding="utf-8"), 400, special_tokens=["<|endoftext|>"])
    assert saved.merges == fresh.merges and saved.eos_id == 399 and saved.vocab_size == 400


@pytest.mark.slow
def test_committed_shakespeare_tokenizer_is_reproduced_by_the_command(tmp_path, capsys):
    committed = paths.data_path(SHAKESPEARE_BPE)
    if not committed.is_file():
        pytest.skip("data/shakespeare-bpe-4k.json is not built")
    out = tmp_path / SHAKESPEARE_BPE
    assert cli.main(["train-tokenizer", "--out", str(out)]) == 0
    assert json.loads(out.read_text(encoding="utf-8")) == json.loads(committed.read_text(encoding="utf-8"))
    tok = get_tokenizer("shakespeare")
    assert tok.vocab_size == 4096 and tok.eos_id == 4095


def test_get_tokenizer_rejects_unknown_names():
    with pytest.raises(ValueError, match="smollm2"):
        get_tokenizer("gpt5")


def test_tokenize_runs_gemmas_sentencepiece_tokenizer(capsys):
    """`labkit tokenize --tokenizer gemma3`: Gemma 3's tokenizer from its GGUF file, <bos> first and shown as text,
    the same ids as the tokenizer's own encode."""
    try:
        tok = get_tokenizer("gemma3")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    assert cli.main(["tokenize", "--ids", "--tokenizer", "gemma3", "Hello world"]) == 0
    ids = [int(x) for x in capsys.readouterr().out.split()]
    assert ids == tok.encode("Hello world", allowed_special="all") and ids[0] == tok.bos_id
    assert cli.main(["tokenize", "--tokenizer", "gemma3", "Hello world"]) == 0
    out = capsys.readouterr().out
    assert "b'<bos>'" in out and "b'Hello'" in out and out.strip().endswith("bytes per token")
