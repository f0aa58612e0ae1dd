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
