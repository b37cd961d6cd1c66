"""What the browser tests share: Debian's chromium driven by playwright, a page of the studio, its form fields."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import playwright.sync_api as playwright

# Debian's chromium, which `make test` installs; a missing browser fails the test rather than skipping it.
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"]
SCREENSHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"
TIMEOUT_MS = 90_000


@contextmanager
def chromium() -> Iterator[playwright.Browser]:
    """A headless chromium, with `expect` waiting up to `TIMEOUT_MS`."""
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        playwright.expect.set_options(timeout=TIMEOUT_MS)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser: playwright.Browser, url: str, height: int = 900) -> playwright.Page:
    """The studio at `url` in a fresh context (its own cookies), once its tabs are drawn."""
    page = browser.new_context(viewport={"width": 1400, "height": height}).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url, wait_until="load")
    page.wait_for_selector("#main-tabs")
    return page


def set_field(page: playwright.Page, elem_id: str, value: str) -> None:
    """Type into a Gradio textbox / number / dropdown and leave it, so the value is committed."""
    box = page.locator(f"#{elem_id} input, #{elem_id} textarea").first
    box.fill(value)
    box.press("Tab")


def fill_form(page: playwright.Page, **fields: Any) -> None:
    """Set Launch form fields by name (`num_prompts=12` types into `#field-num_prompts`)."""
    for name, value in fields.items():
        set_field(page, f"field-{name}", str(value))


def train_on_cpu(page: playwright.Page) -> None:
    """Open the form's advanced settings and tick "Force CPU"."""
    page.get_by_text("Advanced", exact=True).click()
    page.locator("#field-use_cpu input[type=checkbox]").check()


def open_tab(page: playwright.Page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).first.click()


def shoot(page: playwright.Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    time.sleep(0.5)  # let Plotly finish its transitions
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
