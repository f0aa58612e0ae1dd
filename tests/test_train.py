"""Training the lab's models: the loop learns, is deterministic, and its checkpoints load back exactly."""
import json
import math
import subprocess
import sys

import pytest
import torch

import labkit
from labkit.model import ModelConfig, Transformer
from labkit.model.checkpoint import load_model, read_header, save_model
from labkit.train import TrainSettings, loss_fn, lr_at, recipe, train_model, val_metrics
from labkit.train.batches import Batches, eval_windows
from tests.conftest import ROOT, python_env


@pytest.fixture(scope="module")
def quick_dir(tmp_path_factory):
    """`labkit train --quick` for the target, then the draft distilled from it, as the CLI runs them."""
    out = tmp_path_factory.mktemp("train")
    for name in ("shakespeare", "shakespeare-draft"):
        done = subprocess.run([sys.executable, "-m", "labkit", "train", "--model", name, "--quick", "--out", str(out)],
                              capture_output=True, text=True, env=python_env(), cwd=ROOT, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "validation loss" in done.stdout and "bits/byte" in done.stdout
    return out


def test_quick_training_learns_and_records_everything(quick_dir):
    record = json.loads((quick_dir / "shakespeare-quick.json").read_text())["record"]
    first, last = record["curve"][0]["ce"], record["final_train_loss"]
    assert first > math.log(4096) - 0.5  # starts near a uniform guess over 4096 ids
    assert last < first - 1.0 and record["val"][-1]["val_loss"] < first - 1.0
    for key in ("seed", "steps", "wall_s", "final_train_loss", "val_loss", "val_bits_per_byte", "labkit_version", "data"):
        assert key in record
    assert len(record["data"]["train_sha256"]) == 64


def test_training_is_deterministic_for_a_seed(quick_dir, tmp_path):
    again = train_model("shakespeare", quick=True, out_dir=tmp_path, progress=False)
    before = json.loads((quick_dir / "shakespeare-quick.json").read_text())["record"]
    assert [c["ce"] for c in again["curve"]] == [c["ce"] for c in before["curve"]]
    a, _ = load_model(tmp_path / "shakespeare-quick.safetensors")
    b, _ = load_model(quick_dir / "shakespeare-quick.safetensors")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_the_draft_is_distilled_and_shares_the_vocabulary(quick_dir):
    target, t_head = load_model(quick_dir / "shakespeare-quick.safetensors")
    draft, d_head = load_model(quick_dir / "shakespeare-draft-quick.safetensors")
    assert d_head["record"]["teacher"] == "shakespeare-quick" and d_head["record"]["settings"]["distill"] > 0
    assert target.config.vocab_size == draft.config.vocab_size == 4096
    assert draft.config.n_params() < target.config.n_params()


def test_the_stored_model_reproduces_its_recorded_validation_loss(quick_dir):
    model, header = load_model(quick_dir / "shakespeare-quick.safetensors")
    _check_recorded_val_loss(model, header["record"])


def _check_recorded_val_loss(model, record):
    from labkit.data import corpus
    from labkit.train.batches import encode_split

    tok = labkit.tokenizer.get_tokenizer("shakespeare")
    s = record["settings"]
    got = val_metrics(model, tok, encode_split(tok, corpus.load_text("val")), s["seq_len"], s["eval_windows"])
    assert got["val_loss"] == pytest.approx(record["val_loss"], abs=1e-4)
    assert got["val_bits_per_byte"] == pytest.approx(record["val_bits_per_byte"], abs=1e-4)


@pytest.mark.parametrize("name", ["shakespeare", "shakespeare-csa", "shakespeare-draft"])
def test_committed_checkpoints_load_and_match_their_record(name):
    model, tok = labkit.load(name)
    header = read_header(ROOT / "data" / f"{name}.safetensors")
    assert model.config == ModelConfig(**header["config"]) and model.config.name == name
    assert tok.vocab_size == model.config.vocab_size == 4096
    assert model.config.n_heads % 2 == 0 and model.config.n_kv_heads % 2 == 0 or name.endswith("draft")
    _check_recorded_val_loss(model, header["record"])


def test_save_then_load_gives_identical_logits(tmp_path):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64))
    x = torch.randint(0, 300, (2, 9))
    save_model(model, tmp_path / "m.safetensors", dtype="float32", record={"note": "test"})
    back, header = load_model(tmp_path / "m.safetensors")
    assert header["record"] == {"note": "test"}
    assert torch.equal(model.eval()(x), back(x))


def test_bad_checkpoints_and_names_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="unknown model 'gpt-5' to train"):
        recipe("gpt-5")
    with pytest.raises(ValueError, match="unknown model 'shakespear'"):
        labkit.load("shakespear")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 40)
    with pytest.raises(ValueError, match="junk.safetensors is not a labkit model file"):
        load_model(junk)
    cfg = ModelConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64)
    path = save_model(Transformer(cfg), tmp_path / "m.safetensors")
    header = read_header(path)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    wrong = dict(header, config=dict(header["config"], ffn_dim=96))  # a config that does not match the weights
    save_file(tensors, str(tmp_path / "wrong.safetensors"), metadata={"labkit": json.dumps(wrong)})
    with pytest.raises(ValueError, match=r"wrong.safetensors: layers.0.mlp.w_gate_up.weight has shape \(128, 32\), "
                                         r"the config needs \(192, 32\)"):
        load_model(tmp_path / "wrong.safetensors")
    del tensors["norm.weight"]
    save_file(tensors, str(tmp_path / "short.safetensors"), metadata={"labkit": json.dumps(header)})
    with pytest.raises(ValueError, match=r"short.safetensors: the weights do not match the config: missing \['norm.weight'\]"):
        load_model(tmp_path / "short.safetensors")


def test_learning_rate_warms_up_then_follows_a_cosine():
    s = TrainSettings(steps=100, warmup=10, lr=1e-3, min_lr=1e-4)
    lrs = [lr_at(i, s) for i in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] == pytest.approx(1e-4)
    assert lrs[9 + 45] == pytest.approx(1e-4 + 0.5 * 9e-4, rel=0.05)  # half-way down the cosine
    with pytest.raises(ValueError, match="min_lr"):
        TrainSettings(lr=1e-4, min_lr=1e-3)
    with pytest.raises(ValueError, match="distill must be in"):
        TrainSettings(distill=2)


def test_distillation_loss():
    g = torch.Generator().manual_seed(0)
    logits, other = torch.randn(2, 5, 11, generator=g), torch.randn(2, 5, 11, generator=g)
    y = torch.randint(0, 11, (2, 5), generator=g)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), y.reshape(-1))
    assert loss_fn(logits, y)[0] == pytest.approx(float(ce))
    same, _ = loss_fn(logits, y, logits, distill=0.5)
    assert float(same) == pytest.approx(0.5 * float(ce), abs=1e-6)  # KL to itself is 0
    mixed, _ = loss_fn(logits, y, other, distill=0.5)
    p, q = other.softmax(-1), logits.log_softmax(-1)
    kl = float((p * (p.log() - q)).sum(-1).mean())
    assert float(mixed) == pytest.approx(0.5 * float(ce) + 0.5 * kl, rel=1e-5)


def test_batches_are_seeded_windows():
    ids = torch.arange(1000)
    a, b = Batches(ids, 4, 16, seed=3), Batches(ids, 4, 16, seed=3)
    x, y = a.next()
    assert torch.equal(x, b.next()[0]) and torch.equal(y, x + 1)  # targets are the inputs shifted by one
    vx, vy = eval_windows(ids, 16, 5)
    assert vx.shape == (5, 16) and int(vx[0, 0]) == 0 and int(vy[-1, -1]) >= 1000 - 16  # spread over the whole text
    assert all(int(vy[i, -1]) < int(vx[i + 1, 0]) for i in range(4))  # no window overlaps the next
    with pytest.raises(ValueError, match="need more than"):
        Batches(torch.arange(10), 2, 16)


def test_models_bench_quality_measures():
    import math

    from labkit.benchmarks.models import quality
    from labkit.tokenizer import get_tokenizer

    tok = get_tokenizer("shakespeare")
    cfg = ModelConfig(vocab_size=4096, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64)
    torch.manual_seed(0)
    a, b = Transformer(cfg).eval(), Transformer(cfg).eval()
    x = torch.tensor([tok.encode("To be, or not to be, that is the question:")[:8]] * 2)
    y = torch.roll(x, -1, dims=1)
    q = quality({"a": a, "same": a, "other": b}, tok, x, y)
    assert q["same"]["top1_agreement"] == 1.0 and q["same"]["kl_to_target"] == pytest.approx(0.0, abs=1e-6)
    assert q["other"]["kl_to_target"] > 0 and q["a"]["val_loss"] == pytest.approx(q["same"]["val_loss"])
    n_bytes = sum(len(tok.token_bytes(int(i))) for i in y.reshape(-1))
    assert q["a"]["bits_per_byte"] == pytest.approx(q["a"]["val_loss"] * y.numel() / n_bytes / math.log(2))
