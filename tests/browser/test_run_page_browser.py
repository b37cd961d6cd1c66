"""The Run page in a real headless Chromium on a simulated live run: it follows the run without a reload (V* tab
during stage 1, Training and Logs tabs during stage 2), a prompt's completions and the SQL search work, and the
page stops polling once the run has finished. The worker is `benchmarks/polling_cost.py`'s simulator (no model).
"""

from __future__ import annotations

import re
import time

import playwright.sync_api as playwright
import pytest

from benchmarks import polling_cost
from benchmarks.harness import studio as served
from storage import Store, lifecycle
from tests.browser import CHROMIUM, CHROMIUM_ARGS

TIMEOUT_MS = 30_000


@pytest.fixture
def studio(tmp_path):
    """(url, data folder, run ids, the simulated worker holder) of a studio with a finished and a live run."""
    ids = polling_cost.build(tmp_path, prompts=300, steps=20)
    with served(tmp_path, "--no-resume", env=polling_cost.APP_ENV) as app:
        workers = {"now": polling_cost.Worker(tmp_path / "studio.db", ids, "values", interval=1.0)}
        try:
            yield app.url, tmp_path, ids, workers
        finally:
            if workers["now"] is not None:
                workers["now"].stop()


def test_the_run_page_follows_a_live_run_and_stops_when_it_ends(studio):
    url, data_dir, ids, workers = studio
    expect = playwright.expect
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(TIMEOUT_MS)
        expect.set_options(timeout=TIMEOUT_MS)
        polls: list[float] = []
        page.on("request", lambda r: polls.append(time.monotonic()) if "run_version" in r.url else None)
        page.goto(url, wait_until="load")
        page.get_by_role("tab", name="Runs", exact=True).first.click()
        page.locator("#runs-table").get_by_text("live-run", exact=True).filter(visible=True).first.click()
        expect(page.locator("#run-header")).to_contain_text("running")  # the Run page opened by itself

        # Stage 1: the V* summary follows the stored prompts without a reload.
        summary = page.locator("#values-summary")
        expect(summary).to_contain_text("prompts with V*")
        first = summary.inner_text()
        expect(summary).not_to_have_text(first)
        expect(page.locator("#vstar-histogram").get_by_text("kept (", exact=False).first).to_be_visible()
        page.locator("#values-table").get_by_text("What is").filter(visible=True).first.click()
        expect(page.locator("#values-prompt")).to_contain_text("of 8 correct")
        expect(page.locator("#values-completions")).to_contain_text("is the answer")
        search = page.locator("#values-search input, #values-search textarea").first
        search.fill("q000001")
        search.press("Enter")
        expect(page.locator("#values-table-info")).to_contain_text("contain")

        # Stage 2: the training curves and the logs appear and move.
        old, workers["now"] = workers["now"], polling_cost.Worker(data_dir / "studio.db", ids, "train", interval=1.0)
        old.stop()
        page.get_by_role("tab", name="Training", exact=True).first.click()
        expect(page.locator("#training-plot").get_by_text("Loss", exact=True)).to_be_visible()
        page.get_by_role("tab", name="Logs", exact=True).first.click()
        logs = page.locator("#run-logs textarea")
        expect(logs).to_have_value(re.compile(r"step \d+: loss"))
        expect(logs).not_to_have_value(logs.input_value())

        # The run ends: the page shows it, then polls no more. As a real worker does, the end is recorded before the
        # process exits: the other order lets a scheduler pass in between fail the run as a worker that died.
        Store(data_dir / "studio.db").apply(ids["live"], lifecycle.FINISH)
        workers["now"].stop()
        workers["now"] = None
        expect(page.locator("#run-header")).to_contain_text("finished")
        time.sleep(1)
        seen = len(polls)
        time.sleep(4 * 2.5)
        assert len(polls) == seen, "the page kept polling a finished run"
        browser.close()
