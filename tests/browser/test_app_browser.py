"""The dashboard in a real headless Chromium: launch a tiny run from the form and watch it live.

Real `python -m app` process, real worker, real SQLite file, tiny random-init model. Saves screenshots of the
main views into docs/screenshots/ (launch, values, training, samples, runs).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import playwright.sync_api as playwright
import pytest

from tests.browser import chromium, fill_form, open_page, open_tab, set_field, shoot, train_on_cpu
from tests.web.test_app_api import free_port, start_app, stop_app


@pytest.fixture(scope="module")
def app_url(tmp_path_factory, taught_model_dir) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("studio-browser")
    port = free_port()
    # Model paths are allowed only under the studio's model folders: the taught model's folder is one.
    proc = start_app(data_dir, port, "--model-root", str(Path(taught_model_dir).parent))
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop_app(proc)


@pytest.fixture(scope="module")
def page(app_url):
    with chromium() as browser:
        yield open_page(browser, app_url)


@pytest.fixture(scope="module")
def taught_model_dir(tmp_path_factory) -> str:
    """A tiny model taught the answers of every other prompt the run below will see (the form's arithmetic with
    12 + 4 prompts): stage 1 then keeps those prompts and filters the rest, whatever the random stream."""
    from a2po.data import arithmetic_dataset
    from a2po.runspec import preset_spec
    from a2po.testing import make_tiny_model, teach_answers

    model, tokenizer = make_tiny_model()
    prompts = arithmetic_dataset(16, operations="+", difficulty=preset_spec()["dataset"]["difficulty"], seed=0)
    taught = prompts.select(range(0, 16, 2))
    teach_answers(model, tokenizer, taught["prompt"], taught["ground_truth"])
    path = tmp_path_factory.mktemp("taught-tiny")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_launch_a_tiny_run_and_watch_it(page, taught_model_dir):
    # The form opens with offline defaults; the first screenshot shows them.
    expect = playwright.expect
    expect(page.locator("#field-model input")).to_have_value("SmolLM2-135M-Instruct")
    shoot(page, "launch")

    # Validation: an impossible value is reported next to its field, and nothing starts.
    outside = "/no/such/model is not under a model folder of this studio"
    for field, value, problem in [("beta1", "0", "must be > 0"), ("model", "/no/such/model", outside)]:
        set_field(page, f"field-{field}", value)
        page.locator("#check-form").click()
        expect(page.locator(f"#error-{field}")).to_contain_text(problem)

    # A tiny run: the taught tiny model, 12 + 4 arithmetic prompts, N = 8 reference samples, 2 steps on CPU.
    fill_form(page, beta1="0.5", model=taught_model_dir, name="browser-tiny", num_prompts="12", eval_size="4",
                  max_completion_length="8", max_steps="2", per_device_train_batch_size="4")
    train_on_cpu(page)
    page.locator("#check-form").click()
    expect(page.locator("#launch-status")).to_contain_text("The form is valid")
    expect(page.locator("#error-beta1")).to_be_hidden()
    page.locator("#show-command").click()
    expect(page.locator("#command")).to_contain_text("python -m a2po train --model")

    started = time.monotonic()
    page.locator("#action-train").click()
    # The run page opens by itself and fills in live.
    expect(page.locator("#run-header")).to_contain_text("browser-tiny")
    histogram = page.locator("#vstar-histogram")
    expect(histogram.get_by_text("kept (", exact=False).first).to_be_visible()
    first_values = time.monotonic() - started
    print(f"\nlaunch click -> first V* histogram: {first_values:.1f} s")

    expect(page.locator("#correct-bar").get_by_text("Correct reference samples", exact=False)).to_be_visible()
    expect(page.locator("#values-table")).to_contain_text("What is")

    open_tab(page, "Filtered")
    expect(page.locator("#filtered-table")).to_contain_text("0 of 8 reference samples correct")

    open_tab(page, "Training")
    expect(page.locator("#training-plot").get_by_text("Loss", exact=True)).to_be_visible()
    open_tab(page, "Samples")
    expect(page.locator("#samples-table")).to_contain_text("What is")
    expect(page.locator("#run-header")).to_contain_text("finished")
    print(f"launch click -> run finished and shown: {time.monotonic() - started:.1f} s")

    # Screenshots of the finished run's views.
    shoot(page, "samples")
    open_tab(page, "Training")
    expect(page.locator("#training-plot").get_by_text("Eval accuracy", exact=True)).to_be_visible()
    shoot(page, "training")
    open_tab(page, "V*")
    page.locator("#values-table").get_by_text("What is").filter(visible=True).first.click()
    expect(page.locator("#values-prompt")).to_contain_text("of 8 correct")
    expect(page.locator("#values-completions")).to_contain_text(re.compile(r"\b8\s+[01]\b"))  # 8th sample, reward
    shoot(page, "values")
    # Before and after: held-out accuracy at step 0 and at the end, in the header.
    expect(page.locator("#run-accuracy")).to_contain_text(re.compile(r"\d+% → \d+%"))
    expect(page.locator("#run-accuracy")).to_contain_text("step 0 → step 2")
    # The question, not the chat template: the column says so and holds no template markers.
    expect(page.locator("#values-table")).to_contain_text("question")
    first_cell = page.locator("#values-table").get_by_text("What is").filter(visible=True).first.inner_text()
    assert "<|" not in first_cell and "system" not in first_cell.lower(), first_cell

    # The Explain view: the calculator's k = 1 of N = 8 at beta1 = 0.5, then k = 2; the run's regression picture.
    open_tab(page, "Explain")
    expect(page.locator("#explain-value")).to_contain_text("V* = 0.2935")
    set_field(page, "explain-k", "2")
    expect(page.locator("#explain-value")).to_contain_text("0.4772")
    page.locator("#explain-run input").click()
    page.get_by_role("option", name=re.compile("browser-tiny")).first.click()
    expect(page.locator("#explain-pass-at-n")).to_contain_text("greedy accuracy")
    expect(page.locator("#explain-engine")).to_contain_text("Sampled by the native decoder")
    shoot(page, "explain")

    # Clone the run into the Launch form (through the allow-list).
    open_tab(page, "Run")
    page.locator("#run-clone").click()
    expect(page.locator("#field-name textarea, #field-name input").first).to_have_value("browser-tiny-clone")
    expect(page.locator("#launch-status")).to_contain_text("Cloned run #")

    open_tab(page, "Runs")
    expect(page.locator("#runs-table")).to_contain_text("browser-tiny")
    shoot(page, "runs")


def test_pick_a_reasoning_gym_task_preview_it_and_launch(page, taught_model_dir):
    """A reasoning-gym task on the Launch page: its prompts previewed (with the answer format the task states),
    then launched; stage 1 scores them with the task's own checker."""
    expect = playwright.expect
    open_tab(page, "Launch")
    page.get_by_label("Reasoning task (reasoning-gym, offline)").check()
    task = page.locator("#field-task input")
    task.click()
    page.get_by_role("option", name="chain_sum", exact=True).click()
    set_field(page, "field-task_settings", '{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}')
    page.locator("#preview-data").click()
    expect(page.locator("#preview")).to_contain_text("<answer>")
    fill_form(page, model=taught_model_dir, name="browser-chain-sum", num_prompts="6", eval_size="2",
                  num_value_samples="2", max_completion_length="4", max_steps="1")
    page.locator("#action-values").click()
    expect(page.locator("#run-header")).to_contain_text("browser-chain-sum")
    expect(page.locator("#run-header")).to_contain_text("finished")
    expect(page.locator("#values-table")).to_contain_text("<answer>")
