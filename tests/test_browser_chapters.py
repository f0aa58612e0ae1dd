"""Every chapter in JupyterLab in headless Chromium: Run All, no error output, no page error, a control moved
redraws its figure. Several minutes for all of them, so it runs with `make test-browser-all`
(LABKIT_BROWSER_ALL=1); `make test` runs the welcome chapter's browser test (test_browser.py)."""
import os

import pytest

from tests import jupyter_server as js
from tests.test_browser import _require_browser, copy_without_outputs, open_and_run_all
from tests.test_notebooks import NOTEBOOKS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# the figure that sits in the same output as the first control of the chapter's first widget
FIGURE_STATE = """() => {
  const box = document.querySelector('.jp-OutputArea-output .widget-vbox');
  const fig = box && box.querySelector('.js-plotly-plot .main-svg');
  return fig ? fig.innerHTML.length + ':' + fig.innerHTML.slice(0, 20000) : null;
}"""


def _move_first_control(page) -> None:
    box = page.locator(".jp-OutputArea-output .widget-vbox").first
    box.scroll_into_view_if_needed()
    sliders = box.locator(".widget-slider .noUi-handle")
    if sliders.count():
        sliders.first.focus()
        page.keyboard.press("ArrowRight")
        return
    box.locator(".widget-toggle-button:not(.mod-active)").first.click()  # a choice other than the current one


@pytest.mark.skipif(not os.environ.get("LABKIT_BROWSER_ALL"), reason="all chapters in the browser: make test-browser-all")
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_runs_in_the_browser_and_its_first_widget_redraws(path, tmp_path):
    _require_browser()
    from playwright.sync_api import sync_playwright

    root_dir = tmp_path / "nb"
    root_dir.mkdir()
    n_code = copy_without_outputs(path, root_dir / path.name)
    port = js.free_port()
    proc, _ = js.start(js.lab_command(port, root_dir), port, tmp_path, root_dir)
    errors = []
    try:
        with sync_playwright() as p:
            browser, page = open_and_run_all(p, port, path.name, errors)
            # all cells have run when the last code cell shows an execution count and the kernel is idle
            page.wait_for_function(
                f"""() => {{ const p = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
                 return p.length === {n_code} && p[p.length - 1].textContent.match(/\\[\\d+\\]/); }}""",
                timeout=300_000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
            failed = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'] "
                                  ":text-matches('Traceback|Error', 'i')")
            tracebacks = page.locator(".jp-RenderedText[data-mime-type='application/vnd.jupyter.error']")
            assert tracebacks.count() == 0, tracebacks.first.text_content()[:2000]
            assert failed.count() == 0
            if page.locator(".jp-OutputArea-output .widget-vbox").count():
                page.locator(".jp-OutputArea-output .widget-vbox").first.scroll_into_view_if_needed()
                page.wait_for_function(FIGURE_STATE, timeout=60_000)
                before = page.evaluate(FIGURE_STATE)
                _move_first_control(page)
                page.wait_for_function(f"(before) => ({FIGURE_STATE})() !== before", arg=before, timeout=90_000)
            page.screenshot(path=str(tmp_path / f"{path.stem}.png"), full_page=False)
            browser.close()
    finally:
        js.stop(proc)
    assert errors == []
