""""A*-PO vs GRPO" in a real headless Chromium: the pair launched from the Launch page with the tiny model, both
runs finished, and the Compare page's plotted series read back from the page (Plotly's own `data` of the drawn
figure): each run's held-out accuracy against wall time has points, in increasing time. Real `python -m app`,
real workers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import playwright.sync_api as playwright
import pytest

from storage import Store
from tests.browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, open_tab, set_field, shoot
from tests.helpers import wait_for
from tests.test_app_api import free_port, start_app, stop_app

READ_SERIES = """(id) => {
    const plot = document.querySelector(`#${id} .js-plotly-plot`);
    return plot ? plot.data.map(t => ({name: t.name, x: Array.from(t.x), y: Array.from(t.y)})) : null;
}"""


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir) -> Iterator[tuple[str, Path]]:
    data_dir = tmp_path_factory.mktemp("studio-pair")
    proc = start_app(data_dir, port := free_port(), "--model-root", str(Path(tiny_model_dir).parent))
    try:
        yield f"http://127.0.0.1:{port}/", data_dir
    finally:
        stop_app(proc)


def test_launch_the_pair_and_read_the_compare_curves_back(studio, tiny_model_dir):
    url, data_dir = studio
    expect = playwright.expect
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)
            page.goto(url, wait_until="load")
            page.wait_for_selector("#main-tabs")

            # Switching the method shows that method's settings only.
            expect(page.locator("#field-num_generations")).to_be_hidden()
            page.locator("#field-method").get_by_text("GRPO (G samples", exact=False).click()
            expect(page.locator("#field-num_generations")).to_be_visible()
            expect(page.locator("#field-num_value_samples")).to_be_hidden()
            page.locator("#field-method").get_by_text("A*-PO (stage 1", exact=False).click()
            expect(page.locator("#field-num_value_samples")).to_be_visible()

            # A tiny pair: 12 + 4 prompts, N = G = 2, 4 steps of 2 prompts, held-out accuracy at every step.
            set_field(page, "field-model", tiny_model_dir)
            set_field(page, "field-name", "duel")
            set_field(page, "field-num_prompts", "12")
            set_field(page, "field-eval_size", "4")
            set_field(page, "field-num_value_samples", "2")
            set_field(page, "field-max_completion_length", "6")
            set_field(page, "field-max_steps", "4")
            set_field(page, "field-per_device_train_batch_size", "2")
            page.get_by_text("Advanced", exact=True).click()
            page.locator("#field-use_cpu input[type=checkbox]").check()
            # A random-init model solves nothing: keep every prompt instead of filtering them all out.
            page.locator("#field-filter_all_incorrect input[type=checkbox]").uncheck()
            page.locator("#action-pair").click()
            expect(page.locator("#launch-status")).to_contain_text("Started A*-PO vs GRPO")
            status = page.locator("#launch-status").inner_text()
            store = Store(data_dir / "studio.db")
            runs = {(r["config"].get("method") or "a2po"): r for r in store.list_runs() if r["name"].startswith("duel")}
            assert set(runs) == {"a2po", "grpo"} and f"#{runs['grpo']['id']}" in status, status
            grpo_config = runs["grpo"]["config"]["config"]
            assert grpo_config["num_generations"] == 2 and grpo_config["per_device_train_batch_size"] == 4

            def finished() -> bool:
                states = [store.get_run(r["id"])["status"] for r in runs.values()]
                assert "failed" not in states, [store.get_run(r["id"])["error"] for r in runs.values()]
                return all(s == "finished" for s in states)

            wait_for(finished, 300, "both runs of the pair to finish")

            open_tab(page, "Compare")
            page.locator("#compare-refresh").click()
            # A random tiny model learns nothing: the verdict says so rather than "reached 0% in 0s".
            expect(page.locator("#compare-verdict")).to_contain_text(re.compile("GRPO took|did not rise"))
            wait_for(lambda: page.evaluate(READ_SERIES, "compare-time"), 60, "the accuracy-against-time plot")
            traces = page.evaluate(READ_SERIES, "compare-time")
            by_name = {t["name"]: t for t in traces}
            a2po = next(t for n, t in by_name.items() if "duel-a2po" in n and n.endswith("with stage 1"))
            grpo = next(t for n, t in by_name.items() if "duel-grpo" in n)
            for trace in (a2po, grpo):
                # Step 0 and steps 1-4 (eval_steps set by the pair: every 1/5 of the run).
                assert len(trace["x"]) == 5 and len(trace["y"]) == 5, trace
                assert all(b > a for a, b in zip(trace["x"], trace["x"][1:], strict=False)), trace
                assert all(0.0 <= y <= 1.0 for y in trace["y"]), trace
            # Tokens: GRPO samples G = 2 completions per prompt per step, A*-PO one.
            tokens = {t["name"]: t for t in page.evaluate(READ_SERIES, "compare-tokens")}
            a2po_tokens = next(t for n, t in tokens.items() if "duel-a2po" in n and n.endswith("without stage 1"))
            grpo_tokens = next(t for n, t in tokens.items() if "duel-grpo" in n)
            assert a2po_tokens["x"][0] == grpo_tokens["x"][0] == 0 and grpo_tokens["x"][-1] > a2po_tokens["x"][-1]
            memory = page.evaluate(READ_SERIES, "compare-memory")
            assert len(memory) == 1 and len(memory[0]["y"]) == 2 and all(y > 0 for y in memory[0]["y"])
            shoot(page, "compare")

            open_tab(page, "Explain")
            expect(page.locator("#explain-costs")).to_contain_text("Why the costs differ")
            expect(page.locator("#explain-costs")).to_contain_text("G = 2")
            page.locator("#explain-costs").scroll_into_view_if_needed()
            shoot(page, "explain-costs")
        finally:
            browser.close()
