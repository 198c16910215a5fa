"""The notebook experience in a real browser: JupyterLab with headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by selenium) runs `step()`, `fit(3)` and `show_history` on the tiny model, and the rendered page
is checked: each group's images with reward and advantage labels and coloured bars, the live figure drawn in place
during `fit` with a short summary after it, and a history slider that changes the step shown. A screenshot of the page is
kept in the test's temporary folder when a check fails."""
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import clean_env

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver; .ci/run installs them)")

CELLS = [
    """import warnings; warnings.simplefilter("ignore")
from glm_grpo_nb.tiny import make_tiny_glm_image
from glm_grpo_nb.policy import GlmImagePolicy
from glm_grpo_nb.rewards import RednessReward
from glm_grpo_nb.trainer import GRPOTrainer
from glm_grpo_nb.widgets import show_history
policy = GlmImagePolicy.from_pretrained(make_tiny_glm_image("tiny"), ar_lora=4, dit_lora=4, verbose=False)
trainer = GRPOTrainer(policy, RednessReward(), ["a blue square on a white background", "a cyan field"], group_size=4,
                      prompts_per_step=2, height=64, width=64, num_inference_steps=4, sde_window=(0, 2), lr=3e-3)""",
    "res = trainer.step()\nres.show()",
    "trainer.fit(3)",
    "show_history(trainer)",
]

# what the page shows, read in the browser: per code cell, its output images, text, and the advantage bars' colours
READ_OUTPUTS = """
return Array.from(document.querySelectorAll('.jp-CodeCell')).map(cell => {
  const out = cell.querySelector('.jp-OutputArea');
  const bars = Array.from(cell.querySelectorAll('.jp-OutputArea div[style*="height:8px"] > div'))
    .map(d => getComputedStyle(d).backgroundColor);
  return {prompt: (cell.querySelector('.jp-InputPrompt') || {}).textContent || '',
          images: out ? out.querySelectorAll('img').length : 0,
          text: out ? out.innerText : '', bars: bars,
          sliders: out ? out.querySelectorAll('.widget-slider, .jupyter-widget-slider').length : 0};
});"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def notebook(path: Path):
    cells = [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
              "source": src} for i, src in enumerate(CELLS)]
    path.write_text(json.dumps({"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                           "language": "python"}},
                                "nbformat": 4, "nbformat_minor": 5}))


@pytest.fixture
def lab(tmp_path):
    "JupyterLab serving tmp_path on loopback, with the app exposed to scripts in the page."
    notebook(tmp_path / "steps.ipynb")
    port, token = free_port(), "glm-grpo-browser-test"
    log = open(tmp_path / "jupyter.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", f"--port={port}",
                             "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}", "--expose-app-in-browser",
                             f"--ServerApp.root_dir={tmp_path}", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
                             "jupyterlab.NeverCheckForUpdate"], stdout=log, stderr=subprocess.STDOUT,
                            env={**clean_env(), "MPLBACKEND": "module://matplotlib_inline.backend_inline"}, cwd=tmp_path)
    import requests
    for _ in range(600):
        try:
            if requests.get(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=1).ok: break
        except requests.ConnectionError: pass
        assert proc.poll() is None, (tmp_path / "jupyter.log").read_text()[-3000:]
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/lab/tree/steps.ipynb?token={token}"
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1400,2400"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()


def wait(driver, what, predicate, timeout, shot):
    "Poll `predicate()` until true; on timeout, save a screenshot and fail saying what was awaited."
    end = time.time() + timeout
    while time.time() < end:
        got = predicate()
        if got: return got
        time.sleep(0.5)
    driver.save_screenshot(str(shot))
    raise AssertionError(f"timed out waiting for {what}; screenshot {shot}")


def test_group_view_live_curves_and_history_slider(lab, browser, tmp_path):
    shot = tmp_path / "page.png"
    browser.get(lab)
    wait(browser, "JupyterLab with the notebook open", lambda: browser.execute_script(
        "return !!(window.jupyterapp && document.querySelector('.jp-Notebook .jp-CodeCell'))"), 120, shot)
    panel = "Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.sessionContext)"
    wait(browser, "the kernel", lambda: browser.execute_script(
        f"const w = {panel}; const k = w && w.sessionContext.session && w.sessionContext.session.kernel;"
        "return !!(k && k.status === 'idle');"), 180, shot)
    browser.find_element("css selector", ".jp-Notebook .jp-CodeCell .jp-InputArea-prompt").click()   # the notebook has focus
    browser.execute_script(f"window.jupyterapp.shell.activateById({panel}.id);"
                           "window.jupyterapp.commands.execute('notebook:run-all-cells'); return true;")
    seen_live_figure = []   # the fit cell shows its figure while it is still running

    def done():
        cells = browser.execute_script(READ_OUTPUTS)
        fit = cells[2]
        if "*" in fit["prompt"] and fit["images"]: seen_live_figure.append(True)
        if "Error" in " ".join(c["text"] for c in cells): return cells   # fail below with the error shown
        return cells if all(c["prompt"].strip() not in ("[ ]:", "[*]:") for c in cells) and cells[3]["sliders"] else None
    cells = wait(browser, "all four cells to run", done, 900, shot)
    try:
        assert not any("Error" in c["text"] for c in cells), [c["text"][-2000:] for c in cells]
        group = cells[1]
        assert group["images"] == 8, group                                  # 2 groups of G = 4
        assert group["text"].count("reward ") >= 8 and group["text"].count("advantage ") == 8, group["text"]
        colours = {"rgb(46, 125, 50)", "rgb(198, 40, 40)", "rgb(158, 158, 158)"}   # green up, red down, grey flat
        assert len([b for b in group["bars"] if b in colours]) == 8, group["bars"]
        fit = cells[2]
        assert fit["images"] == 1, fit                                      # one figure, redrawn in place
        assert seen_live_figure, "the live figure did not show while fit was running"
        summary = fit["text"][fit["text"].find("fit: steps"):]     # after the progress bar: a few lines, not a wall of dicts
        assert summary.startswith("fit: steps 1-3 (3 steps") and len(summary.strip().splitlines()) <= 3, fit["text"]
        hist = cells[3]
        assert "step 3" in hist["text"] and hist["images"] == 8, hist
        # move the slider one step back with the keyboard: the view shows the step before
        from selenium.webdriver.common.keys import Keys
        handle = browser.find_elements("css selector", ".jp-CodeCell:nth-child(4) .noUi-handle, .jp-Notebook .noUi-handle")[-1]
        handle.click()
        handle.send_keys(Keys.ARROW_LEFT)
        wait(browser, "the slider to show step 2", lambda: "step 2" in browser.execute_script(READ_OUTPUTS)[3]["text"], 30, shot)
    except AssertionError:
        browser.save_screenshot(str(shot))
        raise
