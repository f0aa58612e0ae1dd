"""Hardware profiles: every field sourced, bad tables rejected, this machine measured once."""
import math

import pytest

from labkit.costmodel import profiles as hwmod
from labkit.costmodel.dvfs import PowerState, VFTable, leakage_scale
from labkit.costmodel.profiles import CONFIDENCE, HARDWARE, hardware

REQUIRED = ["phone-sd8gen3", "apple-m4-max", "raspberry-pi-5", "laptop-core-ultra-258v", "a100-sxm", "h100-sxm",
            "h200-sxm", "mi300x", "this-machine"]
STATIC = [k for k in REQUIRED if k != "this-machine"]


def test_all_required_profiles_are_listed():
    assert set(REQUIRED) <= set(HARDWARE)


@pytest.mark.parametrize("key", STATIC)
def test_every_field_has_a_confidence_and_a_source(key):
    hw = HARDWARE[key]
    fields = {f for f in hw.__dataclass_fields__ if f not in ("key", "provenance")}
    assert fields <= set(hw.provenance), fields - set(hw.provenance)
    for name, (conf, src) in hw.provenance.items():
        assert conf in CONFIDENCE, (name, conf)
        assert src.strip(), name


@pytest.mark.parametrize("key", STATIC)
def test_profiles_are_physically_sane(key):
    hw = HARDWARE[key]
    # decode at batch 1 in fp16 must be memory-bound on every device: ridge intensity >> 1 FLOP/byte
    assert hw.ridge_intensity("fp16") > 5
    # an awake chip draws more than an idle one, and less than its peak budget
    from labkit.power import awake_power

    assert hw.p_idle_w <= awake_power(hw) < hw.tdp_w
    # voltage rises with frequency, leakage falls with voltage
    assert hw.vf.voltage(hw.vf.fmax) == pytest.approx(hw.vf.vmax)
    assert leakage_scale(hw.vf.vmax, hw.vf.vmax) == pytest.approx(1.0)


def test_datasheet_numbers_are_the_published_ones():
    # values checked against the vendor datasheets cited in data/hardware.yaml
    assert hardware("h100-sxm").peak_flops("fp16") == 989e12     # dense, not the 1979 sparse figure
    assert hardware("a100-sxm").mem_bw_gbs == 2039
    assert hardware("h200-sxm").mem_bw_gbs == 4800
    assert hardware("mi300x").peak_flops("fp16") == 1307e12
    assert hardware("phone-sd8gen3").mem_bw_gbs == pytest.approx(4800e6 * 2 * 64 / 8 / 1e9)  # derived LPDDR5X bound


def test_precision_falls_back_to_a_wider_one():
    h100 = hardware("h100-sxm")          # lists no int4 peak
    assert h100.peak_flops("int4") == h100.peak_flops("int8")
    with pytest.raises(ValueError, match="precision must be one of"):
        h100.peak_flops("fp8")


def test_unknown_hardware_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        hardware("tpu-v9")
    msg = str(err.value)
    assert "'tpu-v9'" in msg and all(k in msg for k in REQUIRED)


def test_names_are_case_and_separator_insensitive():
    assert hardware("H100_SXM") is hardware("h100-sxm")


@pytest.mark.parametrize("field, value", [("mem_bw_gbs", 0), ("mem_bw_gbs", -5.0), ("offload_bw_gbs", 0),
                                          ("compute_eff", 1.5), ("mem_eff", 0), ("p_idle_w", -1)])
def test_bad_fields_name_the_field_and_the_value(field, value):
    with pytest.raises(ValueError, match=rf"{field} must .* got {value}"):
        hardware("phone-sd8gen3").replace(**{field: value})


def test_vf_table_must_be_monotone():
    with pytest.raises(ValueError, match="core_vf voltages must not decrease.*0.8 V at 1000 MHz then 0.7 V at 1500 MHz"):
        VFTable([(500, 0.6), (1000, 0.8), (1500, 0.7)])
    with pytest.raises(ValueError, match="core_vf frequencies must be strictly increasing"):
        VFTable([(1000, 0.8), (1000, 0.9)])
    with pytest.raises(ValueError, match="core_vf"):
        hardware("h100-sxm").replace(core_vf=((1980, 1.0), (990, 0.7)))


def test_vf_table_interpolates_and_clamps():
    vf = VFTable([(1200, 0.675), (2400, 1.0)])
    assert vf.voltage(1800) == pytest.approx(0.8375)
    assert vf.voltage(600) == pytest.approx(0.675)                 # below the table: minimum voltage
    assert vf.dynamic_scale(2400) == pytest.approx(1.0)
    # P ~ V^2 f: halving f at the minimum voltage saves more than half of the dynamic power
    assert vf.dynamic_scale(1200) == pytest.approx(0.675**2 * 0.5)
    with pytest.raises(ValueError, match="core_mhz must be at most the top of the V-f table"):
        vf.voltage(3000)


def test_power_state_rejects_negative_latencies():
    with pytest.raises(ValueError, match="exit_us must be a number >= 0"):
        PowerState("x", 1.0, -1.0, 10.0, 0.1)


def test_this_machine_is_measured_once_and_cached(monkeypatch):
    calls = []

    def fake(value):
        def f(seconds=1.0, **kw):
            calls.append(value)
            return value
        return f

    monkeypatch.setattr("labkit.costmodel.measure.read_bandwidth_gb_s", fake(12.5))
    monkeypatch.setattr("labkit.costmodel.measure.copy_bandwidth_gb_s", fake(9.0))
    monkeypatch.setattr("labkit.costmodel.measure.matmul_flops", fake(2.0e11))
    monkeypatch.setattr(hwmod, "_MEASURED", {})
    hw = hardware("this-machine")
    assert hw.mem_bw_gbs == 12.5 and hw.peak_flops("fp32") == 2.0e11
    assert hw.peak_flops("fp16") == 2.0e11                         # falls back to the measured fp32 rate
    assert hw.provenance["mem_bw_gbs"][0] == "measured"
    n = len(calls)
    assert hardware("this-machine") is hw and len(calls) == n      # cached: no second measurement
    assert hwmod.this_machine(refresh=True) is not hw and len(calls) == 2 * n
    assert math.isfinite(hw.ridge_intensity("fp32"))
