"""The completions table in a real headless Chromium: the Run page's Samples tab reads every logged step (the slider
moved, the rows change; a row opens its prompt across steps), and Compare sets an A*-PO run's and a GRPO run's
completions of one prompt side by side. Real `python -m app` on a real SQLite file filled beforehand with the rows
a finished pair writes. Saves docs/screenshots/completions-table.png and compare-completions.png."""

from __future__ import annotations

import time

import pytest

from benchmarks.harness import studio as served
from storage import Store, lifecycle
from tests.browser import chromium, open_page, open_tab, set_field, shoot

APP_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
# The steps each method logged its completions at: Compare matches them (each run's latest at or before the step).
STEPS = {"a2po": (4, 8, 12, 16, 20), "grpo": (5, 10, 15, 20)}
G = 4
QUESTIONS = [f"What is {10 + i} + {20 + i}?" for i in range(4)]
# A dataset's prompt that tries to close the code block a page shows it in (issue 45): its markup must stay text.
INJECTION = ("\n```\n~~~\n<img class='injected' src='http://127.0.0.1:9/pixel.png'>"
             "<form class='injected' action='http://127.0.0.1:9/'><input type='password'></form>\n````")
INJECTED = ".injected, img, form, input[type=password]"


def fill(data_dir) -> dict[str, int]:
    """A finished A*-PO run (one completion per prompt) and a finished GRPO run (G per prompt) that logged their
    completions every few steps, with a reward function's value and a `log_extra` column."""
    store = Store(data_dir / "studio.db")
    ids = {}
    for method in ("a2po", "grpo"):
        name = f"pair-{method}"
        run_id = ids[method] = store.create_run(name, "train", {"name": name, "method": method}, model="tiny",
                                                dataset="arithmetic")
        for step in STEPS[method]:
            rows = []
            for i, question in enumerate(QUESTIONS):
                answer = 30 + 2 * i
                for j in range(G if method == "grpo" else 1):
                    right = (step + i + j) % 3 != 0
                    rows.append({"step": step, "split": "train", "prompt_id": f"q{i}", "sample_index": j,
                                 "prompt_text": question + (INJECTION if i in (0, 2) else ""), "reward": float(right),
                                 "completion": f"{method} step {step} #{j}: {answer if right else answer + 1}",
                                 "v_star": 0.25 * i if method == "a2po" else None,
                                 "advantage": float(right) - 0.5, "completion_length": 6 + j,
                                 "rewards": {"accuracy": float(right)}, "extra": {"format": "ok"}})
            store.add_samples(run_id, rows)
        store.apply(run_id, lifecycle.CLAIM, pid=1, started_at=time.time() - 600)
        store.apply(run_id, lifecycle.FINISH, stage=None, progress=1.0)
    store.close()
    return ids


@pytest.fixture
def studio(tmp_path):
    fill(tmp_path)
    with served(tmp_path, "--no-resume", env=APP_ENV) as app:
        yield app.url


def set_step(page, elem_id: str, value: str, shown, text: str) -> None:
    """Type a step into a slider's box until `shown` says it took: an update of the slider still on its way (the
    runs just picked) can re-render the box under the typing on a loaded machine, as a user would see and retype."""
    from playwright.sync_api import expect

    for _ in range(3):
        set_field(page, elem_id, value)
        try:
            expect(shown).to_contain_text(text, timeout=30_000)
            return
        except AssertionError:
            continue
    expect(shown).to_contain_text(text)


def cell_widths(page, elem_id: str) -> dict[str, tuple[float, float]]:
    """Each column of a table, by its heading: the rendered width of its first row's cell, and that of six
    characters in the cells' font."""
    return page.evaluate("""(id) => {
        const table = document.getElementById(id);
        const cells = [...table.querySelector('.virtual-row').querySelectorAll('.body-cell')];
        const probe = document.createElement('span');
        probe.style.font = getComputedStyle(cells[0]).font;
        probe.style.cssText += 'position: absolute; visibility: hidden; white-space: pre';
        probe.textContent = '000000';
        document.body.appendChild(probe);
        const six = probe.getBoundingClientRect().width;
        probe.remove();
        const headings = [...table.querySelectorAll('thead th')].map(th => th.innerText.trim());
        return Object.fromEntries(headings.map((name, i) => [name, [cells[i].getBoundingClientRect().width, six]]));
    }""", elem_id)


def test_the_samples_tab_reads_every_step_and_compare_sets_two_runs_side_by_side(studio):
    from playwright.sync_api import expect

    with chromium() as browser:
        page = open_page(browser, studio, height=1100)
        open_tab(page, "Runs")
        page.locator("#runs-table").get_by_text("pair-a2po", exact=True).filter(visible=True).first.click()
        expect(page.locator("#run-header")).to_contain_text("pair-a2po")
        open_tab(page, "Samples")
        table, info = page.locator("#samples-table"), page.locator("#samples-info")
        # The latest logged step by default, with the extra columns.
        expect(info).to_contain_text("Step 20 (the latest; 5 logged steps, 4 to 20)")
        expect(table).to_contain_text("a2po step 20")
        expect(table).to_contain_text("format")
        # The reward columns keep room for a few characters at 1400 px (a long question squeezed them to a letter
        # per line): the completion's reward, the implicit one and a reward function's own ("accuracy").
        reward_columns = ("reward", "implicit reward", "accuracy")
        for _ in range(20):  # the table sets its columns' widths once drawn
            widths = cell_widths(page, "samples-table")
            if all(widths[c][0] >= widths[c][1] for c in reward_columns):
                break
            time.sleep(0.25)
        for column in reward_columns:
            width, six_characters = widths[column]
            assert width >= six_characters, (column, widths)
        # The slider moved to step 8: that step's rows, and the page stops following the latest.
        set_step(page, "samples-step", "8", info, "Step 8 (5 logged steps")
        expect(table).to_contain_text("a2po step 8")
        expect(table).not_to_contain_text("a2po step 20")
        expect(page.locator("#samples-latest input")).not_to_be_checked()
        # Sorted by reward, lowest first: step 8's one wrong answer (prompt q1) on top.
        expect(table.locator("tbody tr").first).to_contain_text("q0")
        page.locator("#samples-sort input").click()
        page.get_by_role("option", name="reward, lowest first").click()
        expect(table.locator("tbody tr").first).to_contain_text("q1")
        # A row opens its prompt across the steps.
        table.get_by_text(QUESTIONS[2]).first.click()
        history = page.locator("#samples-history")
        expect(page.locator("#samples-prompt")).to_contain_text("Prompt q2 · sampled at 5 step(s), 4 to 20")
        expect(page.locator("#samples-prompt")).to_contain_text(QUESTIONS[2])
        for step in STEPS["a2po"]:
            expect(history).to_contain_text(f"a2po step {step}")
        expect(page.locator("#samples-prompt")).to_contain_text("<img class='injected'")  # shown as text
        assert page.locator(f"#samples-prompt :is({INJECTED})").count() == 0
        shoot(page, "completions-table")

        open_tab(page, "Compare")
        page.locator("#compare-runs input").click()
        for name in ("pair-grpo", "pair-a2po"):
            page.get_by_role("option", name=name).first.click()
        page.keyboard.press("Escape")
        left, right = page.locator("#compare-left-head"), page.locator("#compare-right-head")
        expect(left).to_contain_text("pair-a2po (A*-PO)")
        expect(right).to_contain_text("pair-grpo (GRPO)")
        expect(left).to_contain_text("step 20 · 1 completion")
        expect(right).to_contain_text(f"step 20 · {G} completions")
        # Step 12: each run's latest logged step at or before it (GRPO's is step 10).
        set_step(page, "compare-step", "12", left, "step 12 · 1 completion")
        expect(right).to_contain_text(f"step 10 (its latest at or before 12) · {G} completions")
        expect(page.locator("#compare-left-table")).to_contain_text("a2po step 12")
        expect(page.locator("#compare-right-table")).to_contain_text("grpo step 10")
        for j in range(G):
            expect(page.locator("#compare-right-table")).to_contain_text(f"grpo step 10 #{j}")
        expect(page.locator("#compare-prompt-text")).to_contain_text(QUESTIONS[0])
        expect(page.locator("#compare-prompt-text")).to_contain_text("<form class='injected'")  # shown as text
        assert page.locator(f"#compare-prompt-text :is({INJECTED})").count() == 0
        page.locator("#compare-left-table").scroll_into_view_if_needed()
        shoot(page, "compare-completions")
