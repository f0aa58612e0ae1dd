"""`make lab` serves the welcome chapter."""
import json
import os
import shutil
import urllib.request

import pytest

from tests import jupyter_server as js
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def test_make_lab_serves_the_welcome_chapter(tmp_path):
    port = js.free_port()
    extra = f"--no-browser --IdentityProvider.token={js.TOKEN}" + (" --allow-root" if os.geteuid() == 0 else "")
    cmd = ["make", "-s", "lab", f"PORT={port}", f"LAB_ARGS={extra}"]
    proc, log = js.start(cmd, port, tmp_path, ROOT)
    try:
        # the lab opens on the chapters' folder, with the welcome chapter as its first page
        url = f"http://127.0.0.1:{port}/api/contents/00_welcome.ipynb?token={js.TOKEN}"
        with urllib.request.urlopen(url, timeout=20) as r:
            model = json.load(r)
        assert model["type"] == "notebook"
        first = model["content"]["cells"][0]["source"]
        assert "Welcome" in first
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab/tree/00_welcome.ipynb?token={js.TOKEN}", timeout=20) as r:
            assert r.status == 200 and "JupyterLab" in r.read().decode()
    finally:
        js.stop(proc)
    assert proc.returncode is not None
