import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))  # core lessons and deep dives (09a_...)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


def python_env() -> dict:
    """Environment for subprocesses: this interpreter's venv first on PATH."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def assert_checker_separates(name: str, right, wrong, capsys) -> None:
    """`labkit.exercises.<name>` passes `right` with a [PASS] line and fails `wrong` with a [FAIL] line."""
    from labkit import exercises

    checker = getattr(exercises, name)
    assert checker(right)
    assert "[PASS]" in capsys.readouterr().out
    assert not checker(wrong)
    assert "[FAIL]" in capsys.readouterr().out


def pytest_report_header(config):
    """Every run names the CPU and the instruction set its kernels ran with (an emulated one included)."""
    from labkit.costmodel.cpu import describe

    return f"labkit: {describe()}"
