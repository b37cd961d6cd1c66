"""The Launch page in a real headless Chromium, on a studio started the way an operator might: in a folder that
holds data of its own, with `GRADIO_TEMP_DIR` pointing at a shared folder that holds other files. The form offers
the library's defaults (preset none), a hub name is never read as a folder of the studio's working directory, and a
file picked in the form is accepted (only such files leave the datasets folder). Real `python -m app`, real worker,
tiny model."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import playwright.sync_api as playwright
import pytest

from tests.browser import TIMEOUT_MS, fill_form, set_field
from tests.helpers import wait_for
from tests.web.test_app_api import free_port, start_app, stop_app

QA = "".join(f'{{"question": "What is {i} + 1?", "answer": "{i + 1}"}}\n' for i in range(12))


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir) -> Iterator[tuple[str, Path, str]]:
    root = tmp_path_factory.mktemp("studio-launch")
    data_dir, cwd, shared = root / "data", root / "operator-cwd", root / "shared-tmp"
    (cwd / "runs" / "run-3").mkdir(parents=True)
    (cwd / "runs" / "run-3" / "train.jsonl").write_text(QA)  # a local folder named like a hub id
    shared.mkdir()
    (shared / "someone-else.jsonl").write_text(QA)
    model = data_dir / "models" / "tiny"
    shutil.copytree(tiny_model_dir, model)
    proc = start_app(data_dir, port := free_port(), cwd=cwd, env={"GRADIO_TEMP_DIR": str(shared)})
    try:
        yield f"http://127.0.0.1:{port}/", data_dir, str(model)
    finally:
        stop_app(proc)


@pytest.fixture
def page(studio, browser) -> Iterator[playwright.Page]:
    """A fresh page of the studio for each test."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(studio[0], wait_until="load")
    page.wait_for_selector("#main-tabs")
    yield page
    context.close()


def pick_preset(page: playwright.Page, label: str) -> None:
    page.locator("#field-preset input").click()
    page.get_by_role("option", name=label, exact=True).click()


def test_preset_none_shows_the_library_defaults(page):
    expect = playwright.expect
    expect(page.locator("#field-max_completion_length input")).to_have_value("12")  # the teaching demo's
    pick_preset(page, "No preset")
    # A2POConfig's own defaults (TRL's): 256 completion tokens, lr 5e-5, gradient checkpointing on.
    expect(page.locator("#field-max_completion_length input")).to_have_value("256")
    expect(page.locator("#field-learning_rate input")).to_have_value("0.00005")
    page.get_by_text("Advanced", exact=True).click()
    expect(page.locator("#field-gradient_checkpointing input[type=checkbox]")).to_be_checked()
    expect(page.locator("#field-lr_scheduler_type input")).to_have_value("linear")
    page.locator("#check-form").click()
    expect(page.locator("#launch-status")).to_contain_text("The form is valid")
    pick_preset(page, "Teaching demo")
    expect(page.locator("#field-max_completion_length input")).to_have_value("12")


def test_sampling_with_vllm_is_shown_disabled_with_the_reason(page):
    # The main virtualenv has no vLLM: the form still offers the setting, so a user learns what the operator adds.
    expect = playwright.expect
    page.get_by_text("Advanced", exact=True).click()
    expect(page.locator("#field-use_vllm input[type=checkbox]")).to_be_disabled()
    expect(page.locator("#field-use_vllm")).to_contain_text(
        "Not available here: use_vllm needs vLLM, which is not installed beside this studio")
    expect(page.locator("#field-vllm_gpu_memory_utilization input")).to_be_disabled()
    page.locator("#check-form").click()
    expect(page.locator("#launch-status")).to_contain_text("The form is valid")


def test_a_hub_name_is_never_a_folder_of_the_studios_working_directory(page):
    # Workers run in an empty folder, where `runs/run-3` can only be a hub id; the preview (the studio's own
    # process) must read it the same way, not as the operator's local folder.
    expect = playwright.expect
    page.get_by_label("Hugging Face hub dataset").check()
    set_field(page, "field-hub_name", "runs/run-3")
    page.locator("#preview-data").click()
    expect(page.locator("#preview-info")).to_contain_text("Could not read this dataset")
    expect(page.locator("#preview-info")).not_to_contain_text("question")


def test_a_file_picked_in_the_form_is_accepted_and_kept(page, studio):
    expect = playwright.expect
    _, data_dir, model = studio
    upload = data_dir.parent / "my data.jsonl"
    upload.write_text(QA)
    page.get_by_label("Upload a file (jsonl / csv / parquet)").check()
    page.locator("#field-file_path input[type=file]").set_input_files(str(upload))
    # The uploaded file's row (its text splits the name into stem and extension; its cell's name is the whole name).
    expect(page.locator("#field-file_path").get_by_role("cell", name="my data.jsonl", exact=True)).to_be_visible()
    fill_form(page, model=model, name="picked-file", num_value_samples="2", max_completion_length="4", eval_size="2")
    page.locator("#check-form").click()
    expect(page.locator("#launch-status")).to_contain_text("The form is valid")
    page.locator("#action-values").click()
    expect(page.locator("#run-header")).to_contain_text("picked-file")
    from storage import Store

    run = wait_for(lambda: next((r for r in Store(data_dir / "studio.db").list_runs() if r["name"] == "picked-file"),
                                None), what="the run")
    kept = Path(run["config"]["dataset"]["path"])
    assert kept.parent == (data_dir / "datasets" / "uploads").resolve() and kept.read_text() == QA
