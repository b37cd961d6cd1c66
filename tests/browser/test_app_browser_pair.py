""""A*-PO vs GRPO" in a real headless Chromium: a 2-seed study with the paper's protocol launched from the Launch page
with the tiny model, its four runs finished, and the Compare page read back: the plotted series (Plotly's own `data`
of the drawn figure: each run's and each method's median held-out accuracy against training time, with the seeds'
range), the per-seed table and the verdict on the medians. Real `python -m app`, real workers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import playwright.sync_api as playwright
import pytest

from storage import Store
from tests.browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, open_tab, set_field, shoot
from tests.helpers import wait_for
from tests.web.test_app_api import free_port, start_app, stop_app

READ_SERIES = """(id) => {
    const plot = document.querySelector(`#${id} .js-plotly-plot`);
    return plot ? plot.data.map(t => ({name: t.name, x: Array.from(t.x), y: Array.from(t.y), meta: t.meta || {}}))
                : null;
}"""
# Gradio's Dataframe is a virtual table: its rows are the elements with an aria-rowindex (1: the header).
READ_TABLE = """(id) => Array.from(document.querySelectorAll(`#${id} [role=row][aria-rowindex]`))
    .map(row => Array.from(row.querySelectorAll('[role=gridcell], [role=columnheader]'))
        .map(cell => cell.innerText.trim()))"""


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir) -> Iterator[tuple[str, Path]]:
    data_dir = tmp_path_factory.mktemp("studio-pair")
    proc = start_app(data_dir, port := free_port(), "--model-root", str(Path(tiny_model_dir).parent))
    try:
        yield f"http://127.0.0.1:{port}/", data_dir
    finally:
        stop_app(proc)


def test_launch_a_two_seed_pair_and_read_the_medians_back(studio, tiny_model_dir):
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
            # Before any click, the page plans the pair the form would start: the teaching demo's, at first.
            expect(page.locator("#pair-plan")).to_contain_text("This pair:")

            # Switching the method shows that method's settings only.
            expect(page.locator("#field-num_generations")).to_be_hidden()
            page.locator("#field-method").get_by_text("GRPO (G samples", exact=False).click()
            expect(page.locator("#field-num_generations")).to_be_visible()
            expect(page.locator("#field-num_value_samples")).to_be_hidden()
            page.locator("#field-method").get_by_text("A*-PO (stage 1", exact=False).click()
            expect(page.locator("#field-num_value_samples")).to_be_visible()

            # A tiny pair: 12 + 4 prompts, N = G = 2, 4 steps of 2 prompts; two run seeds.
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
            set_field(page, "field-seeds", "0, 1")
            # The paper's protocol is the default, and the page says what it does.
            expect(page.locator("#pair-protocol-note")).to_contain_text("filter_all_incorrect off")
            expect(page.locator("#pair-grpo-prompts")).to_be_hidden()
            # Equal compute gives GRPO its own learning rate and prompts per step, the teaching demo's measured best.
            page.locator("#pair-protocol").get_by_text("Equal compute", exact=False).click()
            expect(page.locator("#pair-grpo-prompts input")).to_have_value("16")
            expect(page.locator("#pair-grpo-lr input")).to_have_value("0.00003")
            expect(page.locator("#pair-flops-budget input")).to_have_value("40000000000000")
            expect(page.locator("#pair-plan")).to_contain_text("GRPO 3e-05")
            page.locator("#pair-protocol").get_by_text("The paper's", exact=False).click()
            expect(page.locator("#pair-grpo-prompts")).to_be_hidden()
            expect(page.locator("#pair-plan")).to_contain_text(
                "4 runs (2 seeds x A*-PO and GRPO), one after another: 4 optimizer steps each; 5 evaluations of 4 "
                "held-out prompts each")
            page.locator("#action-pair").click()
            expect(page.locator("#launch-status")).to_contain_text("Started A*-PO vs GRPO")
            status = page.locator("#launch-status").inner_text()
            store = Store(data_dir / "studio.db")
            runs = [r for r in store.list_runs() if r["name"].startswith("duel")]
            assert sorted(r["name"] for r in runs) == ["duel-a2po-s0", "duel-a2po-s1", "duel-grpo-s0", "duel-grpo-s1"]
            assert all(f"#{r['id']}" in status for r in runs), status
            assert len({r["config"]["study"]["id"] for r in runs}) == 1
            for run in runs:
                config = run["config"]["config"]
                assert config["eval_steps"] == 1 and config["seed"] == run["config"]["study"]["seed"]
                if run["config"].get("method") == "grpo":
                    assert config["num_generations"] == 2 and config["per_device_train_batch_size"] == 4
                else:
                    assert config["filter_all_incorrect"] is False  # the paper's protocol

            def finished() -> bool:
                states = [store.get_run(r["id"])["status"] for r in runs]
                assert "failed" not in states, [store.get_run(r["id"])["error"] for r in runs]
                return all(s == "finished" for s in states)

            wait_for(finished, 400, "the study's four runs to finish")

            open_tab(page, "Compare")
            page.locator("#compare-refresh").click()
            expect(page.locator("#compare-protocol")).to_contain_text("The paper's protocol")
            # A random tiny model learns little: whatever it says, the verdict reads the medians of the 2 seeds.
            expect(page.locator("#compare-verdict")).to_contain_text("Medians of 2 seeds")
            wait_for(lambda: page.evaluate(READ_SERIES, "compare-time"), 60, "the accuracy-against-time plot")
            traces = page.evaluate(READ_SERIES, "compare-time")
            curves = [t for t in traces if "band" not in t["meta"]]
            medians = {t["name"]: t for t in curves if t["meta"].get("median")}
            assert set(medians) == {"A*-PO median of 2 with stage 1", "A*-PO median of 2 without stage 1",
                                    "GRPO median of 2"}, list(medians)
            per_run = [t for t in curves if not t["meta"].get("median") and t["meta"].get("stage1")]
            assert len(per_run) == 4
            for trace in [*medians.values(), *per_run]:
                # Step 0 and steps 1-4: one evaluation grid, every step.
                assert len(trace["x"]) == 5 and len(trace["y"]) == 5, trace
                assert all(b >= a for a, b in zip(trace["x"], trace["x"][1:], strict=False)), trace
                assert all(0.0 <= y <= 1.0 for y in trace["y"]), trace
            # The median of two seeds is their mean, point by point; the band spans them.
            grpo_runs = [t for t in per_run if t["meta"]["method"] == "grpo"]
            for i, y in enumerate(medians["GRPO median of 2"]["y"]):
                assert y == pytest.approx((grpo_runs[0]["y"][i] + grpo_runs[1]["y"][i]) / 2)
            assert len([t for t in traces if t["meta"].get("band")]) == 4  # low and high per method
            # Tokens: GRPO samples G = 2 completions per prompt per step, A*-PO one.
            tokens = {t["name"]: t for t in page.evaluate(READ_SERIES, "compare-tokens")}
            assert (tokens["GRPO median of 2"]["x"][-1] > tokens["A*-PO median of 2 without stage 1"]["x"][-1] > 0)
            steps = page.evaluate(READ_SERIES, "compare-steps")
            assert any(t["x"] == [0, 1, 2, 3, 4] for t in steps)
            # The table: one row per run with its seed, and a median row per method with the seeds' range.
            table = page.evaluate(READ_TABLE, "compare-seeds")
            header, body = table[0], table[1:]
            assert header[:4] == ["method", "seed", "run", "status"] and "final accuracy" in header
            assert [(r[0], r[1]) for r in body] == [("A*-PO", "0"), ("A*-PO", "1"), ("A*-PO", "median"),
                                                    ("GRPO", "0"), ("GRPO", "1"), ("GRPO", "median")]
            final = header.index("final accuracy")
            assert re.fullmatch(r"\d+% \(\d+%–\d+%\)", body[2][final]), body[2]
            shoot(page, "compare")

            open_tab(page, "Explain")
            expect(page.locator("#explain-costs")).to_contain_text("Why the costs differ")
            expect(page.locator("#explain-costs")).to_contain_text("G = 2")
            page.locator("#explain-costs").scroll_into_view_if_needed()
            shoot(page, "explain-costs")
        finally:
            browser.close()
