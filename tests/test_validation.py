"""The model against published measurements: every target within its stated tolerance (+/-30 %)."""
import pytest

from labkit.power.validation import TARGETS, run_validation, validation_table


@pytest.fixture(scope="module")
def checks():
    return {c.target.key: c for c in run_validation()}


@pytest.mark.parametrize("key", [k for k, t in TARGETS.items() if not t.known_gap])
def test_model_is_within_tolerance_of_the_target(checks, key):
    c = checks[key]
    assert c.target.tolerance == 0.30
    assert c.ok, f"{c.target.label}: model {c.model:.4g} {c.target.unit} vs {c.target.value} ({c.error:+.0%})"


def test_known_gaps_are_still_there_in_the_direction_their_note_gives(checks):
    # an "up to" claim is a bound the realistic model falls short of
    assert checks["phone_7b_int4"].error < -0.30
    # the model charges bytes only, so it over-predicts the int4 kernel, and the gap grows as the bits fall
    errors = [checks[f"gptfast_7b_{q}"].error for q in ("bf16", "int8", "int4")]
    assert errors[2] > 0.30 and errors[0] < errors[1] < errors[2]


def test_rows_say_whether_they_are_independent_checks():
    independent = [t for t in TARGETS.values() if t.independent]
    assert len(independent) >= 5 and sum(t.source.startswith("gpt-fast") for t in independent) == 3
    assert not TARGETS["mlenergy_7b_a100"].independent and not TARGETS["70b_h100_decode"].independent
    assert "shares inputs" in validation_table() and "independent" in validation_table()


def test_power_cap_leaves_decode_exactly_unchanged(checks):
    # decode draws less than the cap, so the governor keeps its top clock
    assert checks["70b_h100_cap_decode"].model == 1.0


def test_same_inputs_as_llm_analysis_give_its_numbers_closely(checks):
    # a parity check with another roofline model fed the same efficiencies: within 3 %
    assert abs(checks["13b_a100_prefill"].error) < 0.03 and abs(checks["13b_a100_decode"].error) < 0.03


def test_table_lists_every_target():
    table = validation_table()
    assert all(t.label[:40] in table for t in TARGETS.values())
