import json
import subprocess
import sys

import pytest

import labkit
from labkit.viz.welcome import WEIGHT_FORMATS, decode_speed_bound, decode_speed_figure, format_params
from tests.conftest import ROOT, python_env


def test_cli_lists_its_commands():
    run = subprocess.run([sys.executable, "-m", "labkit", "--help"], capture_output=True, text=True, env=python_env())
    assert run.returncode == 0
    for cmd in ["doctor", "bench"]:
        assert cmd in run.stdout


def test_bench_machine_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "-m", "labkit", "bench", "--quick", "--only", "machine", "--json", str(out)],
                         capture_output=True, text=True, env=python_env(), cwd=ROOT)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    machine = report["results"]["machine"]
    assert machine["read_gb_s"] > 0 and machine["copy_gb_s"] > 0 and machine["matmul_flops"] > 0
    from labkit.costmodel.cpu import FLAGS, differences

    cpu = report["cpu"]  # where the figures were measured: CPU, instruction sets, libraries, threads
    assert set(cpu["flags"]) == set(FLAGS) and cpu["aten_capability"] and cpu["torch"] and cpu["threads"] >= 1
    assert differences(cpu) == [] and "labkit bench on" in run.stdout


def test_bench_under_an_emulated_isa_says_so(tmp_path):
    from labkit.costmodel.cpu import ISA_EMULATION, cpu_info, differences

    out = tmp_path / "bench.json"
    env = {**python_env(), **ISA_EMULATION["avx2"]}
    run = subprocess.run([sys.executable, "-m", "labkit", "bench", "--quick", "--only", "machine", "--json", str(out)],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    cpu = json.loads(out.read_text())["cpu"]
    assert cpu["aten_capability"] == "AVX2" and cpu["emulated_isa"] == "avx2" and "emulated: avx2" in run.stdout
    if cpu_info()["aten_capability"] != "AVX2":  # on a bigger CPU the stored figure is flagged as another machine's
        assert any("ATen capability" in d for d in differences(cpu))


def test_bench_rejects_unknown_names():
    run = subprocess.run([sys.executable, "-m", "labkit", "bench", "--only", "nope"], capture_output=True, text=True, env=python_env())
    assert run.returncode != 0 and "unknown benchmark" in run.stderr


def test_decode_bound_is_bandwidth_over_bytes():
    assert decode_speed_bound(135e6, 4.0, 10.0) == pytest.approx(10e9 / 540e6)
    # halving the bytes doubles the bound; doubling the bandwidth doubles it too
    assert decode_speed_bound(7e9, 1.0, 50.0) == pytest.approx(2 * decode_speed_bound(7e9, 2.0, 50.0))
    assert decode_speed_bound(7e9, 2.0, 100.0) == pytest.approx(2 * decode_speed_bound(7e9, 2.0, 50.0))


@pytest.mark.parametrize("kwargs", [dict(n_params=0), dict(bytes_per_weight=-1), dict(bandwidth_gb_s=float("nan"))])
def test_decode_bound_rejects_bad_input(kwargs):
    args = dict(n_params=1e9, bytes_per_weight=2.0, bandwidth_gb_s=10.0) | kwargs
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        decode_speed_bound(**args)


def test_decode_figure_marks_the_chosen_point():
    fig = decode_speed_figure(20.0, 7e9, 2.0)
    assert len(fig.data) == len(WEIGHT_FORMATS) + 1
    chosen = fig.data[-1]
    assert chosen.x[0] == 7e9 and chosen.y[0] == pytest.approx(20e9 / 14e9)
    assert "7B params" in fig.layout.title.text.replace("<br>", " ") and "1.4 tokens/s" in fig.layout.title.text.replace("<br>", " ")
    # every format line is the bound along the x axis
    bf16 = fig.data[list(WEIGHT_FORMATS).index("bf16")]
    assert bf16.y[10] == pytest.approx(decode_speed_bound(bf16.x[10], 2.0, 20.0))


def test_format_params():
    assert format_params(135e6) == "135M" and format_params(7e9) == "7B" and format_params(1.7e9) == "1.7B"


def test_decode_widget_redraws_when_the_slider_moves():
    box = labkit.widgets.decode_speed(bandwidth_gb_s=10.0)
    size_slider = box.children[0].children[0]
    fig = box.children[1]
    assert "135M params" in fig.layout.title.text.replace("<br>", " ")
    size_slider.value = "7B"
    assert "7B params" in fig.layout.title.text.replace("<br>", " ")
    assert fig.data[-1].x[0] == 7e9


def test_lazy_package_attributes():
    assert "decode_speed_figure" in dir(labkit.viz)
    with pytest.raises(AttributeError):
        labkit.viz.no_such_figure
    with pytest.raises(AttributeError):
        labkit.no_such_module
