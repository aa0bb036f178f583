"""A real browser for the dashboard's tests: Debian's headless Chromium driven by Playwright.

Playwright's own browser download is never used: it drives /usr/bin/chromium (installed by
tests/install_test_deps.sh), with the flags this closed network needs (no background networking,
no component updates, no sync) and a fresh profile. Every page opened through `Browser.page()`
records console errors and uncaught exceptions; `check()` fails on any of them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.testhosts_fixture import REQUIRE_ENV, required

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS_ENV = "XCE_WEB_SCREENSHOTS"  # a directory to keep the screenshots in (default: the test's tmp_path)


def require_browser() -> None:
    """Skip (fail with XCE_REQUIRE_TESTHOSTS=1, as in CI) when Chromium or Playwright is missing."""
    problems = []
    if not os.access(CHROMIUM, os.X_OK):
        problems.append(f"{CHROMIUM} is missing (apt-get install chromium; tests/install_test_deps.sh does)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        problems.append("the playwright package is missing (pip install '.[test]')")
    if not problems:
        return
    reason = "no browser for the dashboard's tests: " + "; ".join(problems)
    if not required():  # a machine without them may skip; CI (XCE_REQUIRE_TESTHOSTS=1) may not
        pytest.skip(reason)
    pytest.fail(f"{reason} ({REQUIRE_ENV}=1 forbids skipping)", pytrace=False)


class Browser:
    def __init__(self, shots: Path):
        from playwright.sync_api import sync_playwright

        self.shots = shots
        self.shots.mkdir(parents=True, exist_ok=True)
        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        self.context = self._browser.new_context(viewport={"width": 1360, "height": 900})
        self.problems: list[str] = []

    def page(self):
        page = self.context.new_page()
        page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text} ({page.url})")
                if m.type == "error" else None)
        page.on("pageerror", lambda e: self.problems.append(f"uncaught: {e} ({page.url})"))
        # a load cut short by the next navigation (ERR_ABORTED) is no fault; a missing asset is a 404,
        # which Chromium reports as a console error
        page.on("requestfailed", lambda r: None if "ERR_ABORTED" in (r.failure or "") else
                self.problems.append(f"request failed: {r.url} {r.failure}"))
        return page

    def shot(self, page, name: str) -> Path:
        path = self.shots / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    def check(self) -> None:
        problems, self.problems = self.problems, []
        assert problems == [], "the browser saw errors:\n" + "\n".join(problems)

    def close(self) -> None:
        try:
            self.context.close()
            self._browser.close()
        finally:
            self._playwright.stop()


def shots_dir(tmp: Path) -> Path:
    chosen = os.environ.get(SHOTS_ENV)
    if chosen:
        return Path(chosen)
    return tmp / "screenshots"

