"""Start and stop a JupyterLab server on 127.0.0.1 for the tests (stopped by its own PID)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.conftest import python_env

TOKEN = "labkit-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(port: int, proc: subprocess.Popen, log: Path, timeout: float = 90.0) -> None:
    url = f"http://127.0.0.1:{port}/api/status?token={TOKEN}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"jupyter did not answer on port {port} within {timeout} s:\n{log.read_text()[-3000:]}")


def jupyter_env(tmp: Path) -> dict:
    env = python_env()
    for var, sub in [("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython")]:
        env[var] = str(tmp / sub)
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    return env


def start(cmd: list[str], port: int, tmp: Path, cwd: Path) -> tuple[subprocess.Popen, Path]:
    """Start `cmd` in its own process group; return it once the server answers."""
    log = tmp / "jupyter.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=jupyter_env(tmp), start_new_session=True)
    try:
        wait_until_up(port, proc, log)
    except Exception:
        stop(proc)
        raise
    return proc, log


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group we started (the server and its kernels), then wait."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def lab_command(port: int, root_dir: Path) -> list[str]:
    args = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
            f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root_dir}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-root")
    return args
