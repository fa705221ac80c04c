"""The report in a real browser: Debian's headless chromium driven by selenium.

Opens a report drawn from the committed smoke bundle plus synthetic perf rows (so every kind of
chart is on the page) and asserts what a reviewer relies on: no console error (a CSP violation
is one), no network request other than the page's own file (read from chromium's performance
log), the verdict and every chart visible, sorting works. A screenshot is saved; set
FASTPATH_REPORT_SCREENSHOT=PATH to keep it (docs/report-screenshot.png is made that way).

Needs `chromium` and `chromium-driver` (apt) and selenium (the `test` extra); nothing here
downloads a browser. Without them the test is skipped and says which is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from fastpath.report import render
from tests.test_report import SMOKE, perf_rows

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
try:
    import selenium  # noqa: F401

    SELENIUM = True
except ImportError:
    SELENIUM = False

missing = [what for what, ok in (("chromium (apt: chromium)", CHROMIUM), ("chromedriver (apt: chromium-driver)", DRIVER),
                                 ("selenium (pip: the test extra)", SELENIUM)) if not ok]
pytestmark = pytest.mark.skipif(bool(missing), reason="report browser test needs " + ", ".join(missing))


def _page(tmp_path: Path) -> Path:
    """The smoke bundle's report, with the perf rows a full-tier run would add."""
    import pandas as pd

    from fastpath.results import rows_frame

    with tarfile.open(SMOKE) as tar:
        tar.extractall(tmp_path, filter="data")
    d = next(tmp_path.glob("*.fastpath"))
    rows = pd.read_parquet(d / "results" / "rows.parquet").astype(object)
    rows = rows.where(rows.notna(), None).to_dict("records")
    rows_frame(rows + perf_rows()).to_parquet(d / "results" / "rows.parquet", index=False)
    summary = json.loads((d / "summary.json").read_text())
    summary["suites"]["perf"] = "done"
    (d / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "report.html"
    out.write_text(render(d), encoding="utf-8")
    return out


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,2200",
                "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_report_in_headless_chromium(tmp_path, browser):
    from selenium.webdriver.common.by import By

    page = _page(tmp_path)
    browser.get(page.as_uri())
    assert browser.find_element(By.ID, "verdict").is_displayed()
    assert browser.find_element(By.ID, "verdict").text == "PASS"
    charts = browser.find_elements(By.TAG_NAME, "svg")
    assert len(charts) >= 3  # kernel errors, a speedup heatmap, the roofline
    for svg in charts:
        browser.execute_script("arguments[0].scrollIntoView()", svg)
        assert svg.is_displayed() and svg.size["width"] > 100 and svg.size["height"] > 50, svg.get_attribute("outerHTML")[:200]
    # the inline script runs (CSP allows it by hash): a click sorts the gate table
    header = browser.find_element(By.CSS_SELECTOR, "#gate-table thead th")
    header.click()
    assert header.get_attribute("aria-sort") == "ascending"

    errors = [e for e in browser.get_log("browser") if e.get("level") in ("SEVERE", "ERROR")]
    assert errors == [], errors
    requests = set()
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            requests.add(message["params"]["request"]["url"])
    assert requests <= {page.as_uri()}, requests

    shot = tmp_path / "report.png"
    browser.find_element(By.TAG_NAME, "body")
    browser.execute_script("window.scrollTo(0, 0)")
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    keep = os.environ.get("FASTPATH_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
