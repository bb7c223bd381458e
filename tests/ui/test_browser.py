"""``tcc ui`` in a real browser: Debian's headless Chromium, driven by Selenium through
Debian's chromium-driver.

One story, as an operator lives it: open the URL ``tcc ui`` printed, find the run that
waits for an approval, look at its frozen stack (a local's value, and a local holding
``<script>`` shown as text, not run), approve it, resume it, and watch it complete on
the open page, without a reload.  Screenshots go to ``$TCC_ARTIFACTS`` (default
``test-artifacts/`` at the repository root).

Skipped when the browser or its driver is missing, unless ``TCC_REQUIRE_BROWSER=1``
(``.ci/run`` sets it and installs them).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from typing import Any, Iterator

import pytest

from tests._support.ui import parked_run, running_ui, tcc

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
ARTIFACTS = pathlib.Path(os.environ.get("TCC_ARTIFACTS") or
                         pathlib.Path(__file__).resolve().parents[2] / "test-artifacts")

if not (CHROMIUM and DRIVER):
    if os.environ.get("TCC_REQUIRE_BROWSER") == "1":
        raise RuntimeError("TCC_REQUIRE_BROWSER=1 but chromium/chromedriver are missing: "
                           "apt-get install chromium chromium-driver")
    pytest.skip("no chromium and chromium-driver (apt-get install chromium chromium-driver)",
                allow_module_level=True)

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver: Any, name: str) -> pathlib.Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"ui-{name}.png"
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def _click(driver: Any, wait: Any, selector: str) -> None:
    """Click what ``selector`` finds, again if the live page replaced it meanwhile."""
    for _ in range(20):
        try:
            wait.until(EC.element_to_be_clickable((By.CSS_SELECTOR, selector))).click()
            return
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{selector} kept being replaced")


def _row(driver: Any, wait: Any, selector: str) -> tuple[str, str]:
    """The class and text of what ``selector`` finds, read again if the live page replaced it."""
    for _ in range(20):
        try:
            element = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, selector)))
            return element.get_attribute("class") or "", element.text
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{selector} kept being replaced")


def _confirm(driver: Any, wait: Any) -> None:
    wait.until(EC.visibility_of_element_located((By.ID, "confirm")))
    driver.find_element(By.ID, "confirm-yes").click()


def test_approve_a_parked_run_and_watch_it_complete(tmp_path: pathlib.Path, browser: Any) -> None:
    store = str(tmp_path / "store")
    run_id = parked_run(store, args=("launch",))
    other = parked_run(store, func="quick")  # a finished run is listed too, but needs nobody
    wait = WebDriverWait(browser, 30)
    with running_ui(store) as ui:
        # 1. the tokenized URL: the token moves into a cookie and out of the address bar
        browser.get(ui.url)
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "a.run-link")))
        assert "token=" not in browser.current_url

        # 2. the parked run is in the list, marked as needing a person; the finished one is not
        #    (the list refreshes every second, its ages change, so rows are read afresh)
        classes, text = _row(browser, wait, f'tr[data-run="{run_id}"]')
        assert "needs-human" in classes
        assert "waiting" in text and "needs you" in text
        classes, text = _row(browser, wait, f'tr[data-run="{other}"]')
        assert "completed" in text and "needs-human" not in classes
        _shot(browser, "runs")

        # 3. its frozen stack shows the locals' values; a <script> value is text, not code
        _click(browser, wait, f'tr[data-run="{run_id}"] a.run-link')
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#run-status")))
        _click(browser, wait, '#run a[href$="/stack"]')  # the run page refreshes itself
        frames = wait.until(EC.presence_of_element_located((By.ID, "frames")))
        locals_ = {r.find_elements(By.TAG_NAME, "td")[0].text: r.find_elements(By.TAG_NAME, "td")[1].text
                   for r in frames.find_elements(By.CSS_SELECTOR, "table.locals tbody tr")}
        assert locals_["topic"] == "'launch'"
        assert locals_["steps"] == "['step 0 of launch', 'step 1 of launch', 'step 2 of launch']"
        assert locals_["note"] == "'<script>window.pwned = 1</script>'"
        assert browser.execute_script("return window.pwned") is None
        assert "ok = await tcc.approval" in frames.text  # the source line it waits at
        _shot(browser, "stack")

        # 4. approve it, from the run's page (with the confirmation step)
        browser.find_element(By.PARTIAL_LINK_TEXT, "run ").click()
        wait.until(EC.element_to_be_clickable((By.CSS_SELECTOR, 'button[data-action="approve"]')))
        browser.execute_script("window.tccMarker = 'same page'")  # gone if the page reloads
        # typing in the comment holds the live refresh off, so the card stays put
        # Enter in the comment asks to approve (with the confirmation), as the button does
        comment = browser.find_element(By.CSS_SELECTOR, '.wait-card input[name="comment"]')
        comment.send_keys("looks good")
        comment.send_keys(Keys.ENTER)
        _shot(browser, "confirm")
        _confirm(browser, wait)
        assert "comment=" not in browser.current_url  # never submitted as a GET form
        wait.until(EC.text_to_be_present_in_element((By.ID, "flash"), "approve: done"))

        # 5. the page now says the approval is answered and offers to resume; resume it, and
        #    watch it complete on the open page (it polls; no reload)
        wait.until(EC.text_to_be_present_in_element((By.CSS_SELECTOR, ".wait-card.answered"), "answered"))
        _click(browser, wait, '.wait-card.answered button[data-action="resume"]')
        _confirm(browser, wait)
        WebDriverWait(browser, 60).until(
            EC.text_to_be_present_in_element((By.ID, "run-status"), "completed"))
        assert browser.execute_script("return window.tccMarker") == "same page"
        result = wait.until(EC.presence_of_element_located((By.ID, "run-result")))
        assert json.loads(result.text)["ok"] is True
        assert "deployed 3 steps" in result.text
        timeline = browser.find_element(By.CSS_SELECTOR, "table.timeline").text
        assert "approved" in timeline and "resume_requested" in timeline and "completed" in timeline
        _shot(browser, "completed")

    # what the page showed is what the store holds
    doc = json.loads(tcc("show", "--json", "--store", store, run_id).stdout)
    assert doc["status"] == "completed" and doc["result"]["done"] == "deployed 3 steps"
    approved = [e for e in doc["events"] if e["kind"] == "approved"]
    assert approved and approved[0]["data"]["comment"] == "looks good"


def test_the_demo_run_in_the_browser(tmp_path: pathlib.Path, browser: Any) -> None:
    """The quick start's store (``scripts/demo.sh`` runs examples/crash_and_resume.py): the
    crashed and resumed demo run, its timeline and its frozen stack."""
    store = str(tmp_path / "store")
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "crash_and_resume.py"
    import subprocess
    import sys

    scratch = tmp_path / "tmp"  # the demo's own scratch files go here, and are removed
    scratch.mkdir()
    demo = subprocess.run([sys.executable, str(example)],
                          env=dict(os.environ, TCC_STORE=store, TMPDIR=str(scratch)),
                          capture_output=True, text=True, timeout=300)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert list(scratch.iterdir()) == []
    runs = json.loads(tcc("ls", "--json", "--store", store).stdout)
    (demo_id,) = [r["id"] for r in runs if r["id"].startswith("demo-")]
    wait = WebDriverWait(browser, 30)
    with running_ui(store) as ui:
        browser.get(ui.url)
        _click(browser, wait, f'tr[data-run="{demo_id}"] a.run-link')
        wait.until(EC.text_to_be_present_in_element((By.ID, "run-status"), "completed"))
        timeline = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "table.timeline"))).text
        for kind in ("started", "taken_over", "resumed", "completed"):  # killed, then resumed
            assert kind in timeline, kind
        assert "search(" in timeline and "llm(" in timeline  # its effect calls
        _shot(browser, "demo-run")
        _click(browser, wait, '#run a[href$="/stack"]')  # the run page refreshes itself
        frames = wait.until(EC.presence_of_element_located((By.ID, "frames"))).text
        assert "research_agent.py" in frames and "notes" in frames
        _shot(browser, "demo-stack")
