"""Measured pass costs: the table's shape, the interpolation by hand, and the replay they drive."""
import pytest
import torch

from labkit.serving import Request, studies
from labkit.serving.studies import passcost
from tests.kvcache_shared import tiny


def test_step_time_interpolates_the_measured_passes_by_hand():
    table = [{"tokens": 1, "kind": "decode", "seconds": 0.010}, {"tokens": 5, "kind": "decode", "seconds": 0.018},
             {"tokens": 25, "kind": "prefill", "seconds": 0.058}]
    cost = passcost.step_time(table)
    assert cost([(None, 1)]) == pytest.approx(0.010)
    assert cost([(None, 2), (None, 1)]) == pytest.approx(0.014)        # 3 tokens: halfway from 1 to 5
    assert cost([(None, 15)]) == pytest.approx(0.038)                  # halfway from 5 to 25
    assert cost([(None, 35)]) == pytest.approx(0.078)                  # past the last: the last slope, 2 ms a token
    with pytest.raises(ValueError, match="table must hold"):
        passcost.step_time([])


@torch.inference_mode()
def test_measured_table_covers_every_size_and_drives_a_replay():
    model = tiny(n_layers=1)
    source = list(range(1, 61)) * 4
    table = passcost.measure_pass_costs(model, decode_rows=(1, 3), prefill_tokens=(8, 20), source=source, context=12,
                                        repeats=2, block_size=4)
    assert [(r["kind"], r["tokens"]) for r in table] == [("decode", 1), ("decode", 3), ("prefill", 8), ("prefill", 20)]
    assert all(r["seconds"] > 0 for r in table)
    replay = studies.simulate([Request(i, [1, 2, 3], 4) for i in range(3)], passcost.step_time(table), max_batch=3)
    assert all(r.finish is not None for r in replay.requests) and replay.steps[-1].end > 0
    for bad in ({"decode_rows": ()}, {"prefill_tokens": (0,)}, {"repeats": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            passcost.measure_pass_costs(model, source=source, **{"decode_rows": (1,), "prefill_tokens": (8,), **bad})


def test_verify_passes_are_measured_in_the_mode_asked_and_price_passes_with_drafts():
    """Passes of b rows verifying γ drafts each are measured (their rows named), and `step_time` prices a pass whose
    requests carry drafts on that curve, a plain pass on the plain one."""
    from types import SimpleNamespace

    from labkit.model import ModelConfig
    from labkit.model.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=32, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64,
                                    max_seq_len=128)).eval()
    source = list(range(1, 31)) * 3
    table = passcost.measure_pass_costs(model, decode_rows=(1, 2), prefill_tokens=(8,), source=source, context=12,
                                        repeats=2, verify_rows=(1, 2), gammas=(3,), batch_invariant=True)
    verify = [r for r in table if r["kind"] == "verify"]
    assert sorted((r["rows"], r["gamma"], r["tokens"]) for r in verify) == [(1, 3, 4), (2, 3, 8)]
    cost = passcost.step_time(table)
    plain, drafted = SimpleNamespace(draft=[]), SimpleNamespace(draft=[5, 6, 7])
    assert cost([(drafted, 4)]) == pytest.approx(next(r["seconds"] for r in verify if r["tokens"] == 4))
    assert cost([(plain, 1)]) == pytest.approx(next(r["seconds"] for r in table if r["kind"] == "decode" and r["tokens"] == 1))
    flat = passcost.step_time([r for r in table if r["kind"] != "verify"])  # the plain curve alone
    mixed = cost([(drafted, 4), (plain, 8)])  # a drafted row beside a prompt chunk: the chunk at the plain margin
    assert mixed == pytest.approx(cost([(drafted, 4)]) + flat([(plain, 12)]) - flat([(plain, 4)]))
    with pytest.raises(ValueError, match="verify_rows and gammas go together"):
        passcost.measure_pass_costs(model, source=source, decode_rows=(1,), prefill_tokens=(8,), verify_rows=(1,))
