"""JupyterLab in headless Chromium: run the welcome chapter, move a slider, see the figure follow."""
import os
import shutil
from pathlib import Path

import nbformat
import pytest

from tests import jupyter_server as js
from tests.conftest import ROOT

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _require_browser():
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        reason = "playwright is not installed"
    else:
        if Path(CHROMIUM).exists():
            return
        reason = "Debian's chromium is not installed (apt-get install chromium)"
    if os.environ.get("CI"):
        pytest.fail(reason + " - CI must run the browser test")
    pytest.skip(reason)


LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]


def copy_without_outputs(src: Path, dest: Path) -> int:
    """Write `src` to `dest` with no stored outputs (every output a test waits for comes from its run);
    return the number of code cells."""
    nb = nbformat.read(src, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, dest)
    return sum(c.cell_type == "code" for c in nb.cells)


def open_and_run_all(p, port: int, name: str, errors: list):
    """Launch Chromium, open notebook `name` in the JupyterLab on `port`, start Run All; (browser, page).
    Page errors are appended to `errors`."""
    browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"http://127.0.0.1:{port}/lab/tree/{name}?token={js.TOKEN}&reset", timeout=90_000)
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook", timeout=90_000)
    # JupyterLab may ask which kernel to start; accept its preselected Python 3
    try:
        page.locator(".jp-Dialog .jp-mod-accept").click(timeout=8_000)
    except Exception:
        pass
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
    page.click(".lm-MenuBar-itemLabel:text-is('Run')")
    page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
    return browser, page


def test_welcome_slider_redraws_the_figure(tmp_path):
    _require_browser()
    from playwright.sync_api import sync_playwright

    root_dir = tmp_path / "nb"
    root_dir.mkdir()
    copy_without_outputs(ROOT / "notebooks" / "00_welcome.ipynb", root_dir / "welcome.ipynb")
    port = js.free_port()
    proc, log = js.start(js.lab_command(port, root_dir), port, tmp_path, root_dir)
    errors = []
    try:
        with sync_playwright() as p:
            browser, page = open_and_run_all(p, port, "welcome.ipynb", errors)
            # the last cell checks the exercise: all cells have run when its line appears
            page.wait_for_selector(".jp-OutputArea-output:has-text('[PASS] decode_tokens_per_s')", timeout=180_000)
            # JupyterLab renders only the cells in view: bring the widget on screen
            page.locator(".widget-slider").first.scroll_into_view_if_needed()
            title = page.locator(".js-plotly-plot .gtitle").first
            title.wait_for(timeout=60_000)
            assert "135M params" in title.text_content()
            handle = page.locator(".widget-slider .noUi-handle").first
            handle.focus()
            page.keyboard.press("ArrowRight")
            page.keyboard.press("ArrowRight")
            # two steps right: 135M -> 360M -> 1.7B; wait for the final state, not the first change
            page.wait_for_function(
                "() => { const t = document.querySelector('.js-plotly-plot .gtitle');"
                " return t && t.textContent.includes('1.7B params'); }",
                timeout=60_000,
            )
            assert page.locator(".widget-readout").first.text_content().strip() == "1.7B"
            page.screenshot(path=str(tmp_path / "welcome_after.png"))
            browser.close()
    finally:
        js.stop(proc)
    assert errors == []
