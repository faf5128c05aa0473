"""``trainfit ui`` in a real browser (headless Chromium driven by Selenium), served by a real
``trainfit ui`` process: a searched knob's choices edited and validated live, ``tune --quick`` of
the bundled tiny model double-clicked (one job), watched through a restart of the UI to its report,
``train --max-steps 10`` found still running after a reload. Skips
where Selenium or chromedriver is absent (.ci/run installs chromium-driver; selenium is in dev)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import EXAMPLES

webdriver = pytest.importorskip("selenium.webdriver")
pytest.importorskip("flask")
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as seen  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

DRIVER = shutil.which("chromedriver")
BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
DOCS_SHOT = Path(__file__).resolve().parent.parent / "docs" / "ui.png"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(DRIVER is None or BROWSER is None,
                                 reason="no chromedriver or Chromium here (.ci/run installs chromium chromium-driver)")]


class Served:
    """A ``trainfit ui`` process over a root holding the examples, which a test may restart on its port."""

    def __init__(self, root: Path) -> None:
        self.root, self.url = root, ""
        self.server: subprocess.Popen[str] | None = None

    def start(self, port: int = 0) -> None:
        self.server = subprocess.Popen([sys.executable, "-m", "trainfit", "ui", "--root", str(self.root), "--port",
                                        str(port), "--no-browser"], stderr=subprocess.PIPE, text=True,
                                       start_new_session=True)
        assert self.server.stderr is not None
        line = self.server.stderr.readline()
        url = re.search(r"at (http://\S+)", line)
        assert url, line
        self.url = url.group(1)

    def stop(self) -> None:
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=30)

    def restart(self) -> None:
        """Stop the UI and start another on the same port: its jobs and its token outlive it."""
        port = int(self.url.rsplit(":", 1)[1].split("/")[0])
        self.stop()
        self.start(port)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    root = tmp_path / "root"
    shutil.copytree(EXAMPLES, root / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    ui = Served(root)
    ui.start()
    try:
        yield ui
    finally:
        ui.stop()
        for record in (root / ".trainfit-ui" / "jobs").glob("*/job.json"):  # jobs outlive the UI: end ours
            pid = int(re.search(r'"pid": (\d+)', record.read_text()).group(1))  # type: ignore[union-attr]
            if pid <= 0:
                continue  # never recorded: killpg(0) would end this test's own process group
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which(BROWSER or "") or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def status_is(driver: Any, *words: str) -> Any:
    return lambda _: driver.find_element(By.ID, "status").text.split(" ")[0] in words


def test_edit_a_searched_knob_tune_and_train_in_the_browser(served: Served, browser: Any, tmp_path: Path) -> None:
    """Issue 50's done-when: a searched knob's choices edited in the form, a double-clicked tune
    that starts one job, the space asked for in its first lines, its report live on the job page
    trial by trial, the page through a restart of the UI."""
    url, root = served.url, served.root
    shots = tmp_path / "shots"
    shots.mkdir()
    browser.get(url)
    browser.find_element(By.LINK_TEXT, "examples/tiny-llama.yaml").click()

    checkpointing = browser.find_element(By.ID, "knob-gradient_checkpointing")
    assert not checkpointing.is_enabled()  # searched by the spec: no fixed value to tick
    choices = browser.find_element(By.ID, "search-batch_size")
    assert choices.get_attribute("value") == "[1, 2, 4, 8, 16, 32]"
    choices.clear()
    choices.send_keys("1, 2")  # validated live, shown as the override it adds
    WebDriverWait(browser, 15).until(seen.text_to_be_present_in_element(
        (By.ID, "overrides"), "--set search={batch_size: [1, 2], gradient_checkpointing: [false, true], lora_r: [null, 8]}"))
    assert "changed" in choices.find_element(By.XPATH, "./ancestor::tr").get_attribute("class")
    browser.find_element(By.ID, "search-on-lora_r").click()  # lora_r fixed: at the spec's value
    WebDriverWait(browser, 15).until(seen.text_to_be_present_in_element(
        (By.ID, "overrides"), "--set search={batch_size: [1, 2], gradient_checkpointing: [false, true]}"))
    browser.save_screenshot(str(shots / "spec.png"))
    if os.environ.get("TRAINFIT_UI_SCREENSHOT"):  # docs/ui.png taken anew only when asked (CI's checkout stays clean)
        shutil.copyfile(shots / "spec.png", DOCS_SHOT)

    assert browser.find_element(By.ID, "tune-quick").is_selected()
    ActionChains(browser).double_click(browser.find_element(By.ID, "run-tune")).perform()
    WebDriverWait(browser, 60).until(seen.text_to_be_present_in_element((By.ID, "log"), "space: "))
    assert "space: batch_size [1, 2], gradient_checkpointing [False, True];" in browser.find_element(By.ID, "log").text
    assert len(list((root / ".trainfit-ui" / "jobs").iterdir())) == 1  # the double click started one job
    WebDriverWait(browser, 300).until(seen.text_to_be_present_in_element((By.ID, "log"), "[1/"))  # a probe's line, live
    live = browser.find_element(By.ID, "live-report")  # the report, redrawn as each trial finishes
    WebDriverWait(browser, 120).until(lambda _: live.is_displayed() and live.get_attribute("data-version"))
    first = live.get_attribute("data-version")
    WebDriverWait(browser, 300).until(lambda _: live.get_attribute("data-version") != first)  # a later trial's
    assert " probed (" in browser.find_element(By.ID, "live-line").text
    browser.save_screenshot(str(shots / "tune-running.png"))
    if os.environ.get("TRAINFIT_UI_SCREENSHOT"):
        shutil.copyfile(shots / "tune-running.png", DOCS_SHOT.with_name("ui-tune-live.png"))
    served.restart()  # the page survives it: the same token, the job goes on
    WebDriverWait(browser, 600).until(status_is(browser, "finished", "failed", "interrupted"))
    assert browser.find_element(By.ID, "status").text == "finished (exit 0)", browser.find_element(By.ID, "log").text
    browser.refresh()
    WebDriverWait(browser, 10).until(seen.presence_of_element_located((By.LINK_TEXT, "report.html")))
    browser.save_screenshot(str(shots / "tune-finished.png"))
    browser.find_element(By.PARTIAL_LINK_TEXT, "run folder").click()

    browser.find_element(By.ID, "train-max-steps").send_keys("10")
    browser.find_element(By.ID, "run-train").click()
    WebDriverWait(browser, 30).until(status_is(browser, "running"))
    job_url = browser.current_url
    browser.refresh()  # mid-run: the job goes on, the page finds it
    assert browser.current_url == job_url
    WebDriverWait(browser, 10).until(status_is(browser, "running", "finished"))
    was = browser.find_element(By.ID, "status").text
    browser.save_screenshot(str(shots / "train-after-reload.png"))
    WebDriverWait(browser, 300).until(status_is(browser, "finished", "failed", "interrupted"))
    assert browser.find_element(By.ID, "status").text == "finished (exit 0)", browser.find_element(By.ID, "log").text
    assert was == "running", "train ended before the reload: nothing was shown of a running job"
    assert browser.find_element(By.ID, "live-line").text.startswith("step 10 of 10 (100%)")  # its progress, read live
    assert (root / "trainfit-runs" / "tiny-llama").is_dir()


def test_each_kind_of_run_page_in_the_browser(tmp_path: Path, browser: Any) -> None:
    """Issue 50 item 5: a training, a probe, an ablation and a plan, each summarised as itself; their
    screenshots are docs/ui-run-KIND.png (taken anew with TRAINFIT_UI_SCREENSHOT=1)."""
    from test_ui_run_pages import write_runs

    root = tmp_path / "root"
    write_runs(root)
    ui = Served(root)
    ui.start()
    try:
        browser.get(ui.url)  # the token's cookie
        base = ui.url.split("?")[0].rstrip("/")
        for kind in ("train", "probe", "ablate", "plan", "compare", "analyze"):
            browser.get(f"{base}/run?path=runs/{kind}")
            table = browser.find_element(By.ID, "figures")
            assert table.is_displayed() and "error" not in table.text, table.text
            shot = tmp_path / f"ui-run-{kind}.png"
            browser.save_screenshot(str(shot))
            if os.environ.get("TRAINFIT_UI_SCREENSHOT"):
                shutil.copyfile(shot, DOCS_SHOT.with_name(shot.name))
    finally:
        ui.stop()
