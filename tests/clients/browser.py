"""Debian's Chromium (scripts/ensure_apt.sh) driven by playwright, for the page tests.

Playwright never downloads a browser here: it launches /usr/bin/chromium with the flags
these closed-network machines need. The page's Content-Security-Policy stays on (no
`bypass_csp`), so a test that passes also shows the page runs under it; waits are
locator waits or Python-side polling, since the CSP forbids the eval that
`page.wait_for_function` uses.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, Page, sync_playwright

from tests.servers import ROOT

CHROMIUM = Path(os.environ.get("SLUICE_CHROMIUM", "/usr/bin/chromium"))
# Without the background-networking flags Chromium keeps dialling hosts this machine cannot reach.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(os.environ.get("SLUICE_TEST_ARTIFACTS", ROOT / "tests" / "artifacts"))
DESKTOP: dict[str, Any] = {"viewport": {"width": 1280, "height": 800}}
PHONE: dict[str, Any] = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True,
                         "has_touch": True}


@contextmanager
def chromium() -> Iterator[Browser]:
    """One headless Chromium; playwright gives it a fresh, empty profile directory.

    Hold it for one test module at most, never for the session: while playwright's sync API
    is open it keeps its own event loop set as the running one, and pytest-asyncio's tests
    in other packages then cannot start theirs."""
    if not CHROMIUM.exists():
        raise RuntimeError(f"{CHROMIUM} is missing: run scripts/ensure_apt.sh (make apt) first")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


class Tab:
    """A page in its own browser context, with the page's errors and console errors kept."""

    def __init__(self, browser: Browser, url: str, **context: Any) -> None:
        self.context = browser.new_context(**(context or DESKTOP))
        self.page: Page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        self.page.goto(url)

    def until(self, js: str, timeout_s: float = 60.0, arg: Any = None) -> Any:
        """Polls `js` (a function expression) until it returns a truthy value; bounded."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.page.evaluate(js, arg)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not true after {timeout_s}s: {js}")
            self.page.wait_for_timeout(50)

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / name
        self.page.screenshot(path=str(path))
        return path

    def close(self) -> None:
        self.context.close()


# The chat tab, as a person drives it.
def settings(tab: Tab, *, system: str = "", temperature: float = 0, max_tokens: int = 16,
             ignore_eos: bool = False) -> None:
    page = tab.page
    page.locator("#model option").first.wait_for(state="attached")
    page.fill("#system", system)
    page.fill("#temperature", str(temperature))
    page.fill("#max-tokens", str(max_tokens))
    page.set_checked("#ignore-eos", ignore_eos)


def send(tab: Tab, text: str) -> None:
    tab.page.fill("#prompt", text)
    tab.page.click("#send")


def wait_reply(tab: Tab, n: int, timeout_s: float = 180) -> str:
    """Waits for the n-th reply (1-based) to end; returns its stats line."""
    ended = tab.page.locator(".message.assistant.done, .message.assistant.failed, .message.assistant.stopped")
    ended.nth(n - 1).wait_for(timeout=timeout_s * 1000)
    return ended.nth(n - 1).locator(".stats").inner_text()
