"""A reward registered with `--reward-module`, in the Launch page of a real headless Chromium: shown in the picker
with its docstring's first line, tried on the dataset's prompts ("Try the reward"), picked and launched; the run
of a tiny model is scored by it in a real worker, and the studio's own process never imports it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import playwright.sync_api as playwright
import pytest

from storage import Store
from tests.a2po.test_registered_rewards import REWARDS, marker_pids, write
from tests.browser import chromium, fill_form, open_page, train_on_cpu
from tests.helpers import wait_for
from tests.web.test_app_api import free_port, start_app, stop_app


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir) -> Iterator[tuple[str, Path, Path, Path]]:
    root = tmp_path_factory.mktemp("rewards-browser")
    marker = root / "imported-by.txt"
    rewards = write(root / "my_rewards.py", REWARDS)
    data_dir = root / "data"
    proc = start_app(data_dir, port := free_port(), "--model-root", tiny_model_dir, "--reward-module", str(rewards),
                     env={"MARKER": str(marker)})
    try:
        yield f"http://127.0.0.1:{port}/", data_dir, marker, rewards
    finally:
        stop_app(proc)
    assert proc.pid not in marker_pids(marker), "the studio's own process imported the registered module"


@pytest.fixture
def page(studio) -> Iterator[playwright.Page]:
    with chromium() as browser:
        yield open_page(browser, studio[0], height=1000)


def test_pick_a_registered_reward_try_it_and_launch(page, studio, tiny_model_dir):
    expect = playwright.expect
    _, data_dir, marker, rewards = studio
    picker = page.locator("#field-use-my_check")
    expect(picker).to_contain_text("1.0 where the completion is the answer, else 0.0. (registered: my_rewards.py)")
    page.locator("#field-use-exact_match input[type=checkbox]").uncheck()
    picker.locator("input[type=checkbox]").check()
    fill_form(page, model=tiny_model_dir, name="registered-in-the-form", num_prompts="8", eval_size="2",
                  num_value_samples="2", max_completion_length="4", max_steps="1", per_device_train_batch_size="4")
    train_on_cpu(page)
    page.locator("#field-filter_all_incorrect input[type=checkbox]").uncheck()  # a random tiny model solves nothing

    page.locator("#try-reward").click()
    expect(page.locator("#try-verdict")).to_contain_text("The reward tells right from wrong: the answer column "
                                                         "scores 1 on 8 of 8 prompts, a wrong answer 0 on 8 of 8.")
    table = page.locator("#try-table")
    expect(table).to_contain_text("answer column")
    expect(table).to_contain_text("wrong answer")
    expect(table).to_contain_text("model sample")

    page.locator("#action-train").click()
    expect(page.locator("#launch-status")).to_contain_text("Started run #")
    store = Store(data_dir / "studio.db")
    run = wait_for(lambda: next((r for r in store.list_runs() if r["name"] == "registered-in-the-form"
                                 and r["status"] in ("finished", "failed")), None), 300, "the run to end")
    assert run["status"] == "finished", run["error"]
    assert [r["name"] for r in run["config"]["rewards"]] == ["my_check"]
    assert run["config"]["rewards"][0]["source"]["file"] == str(rewards.resolve())
    assert "rewards/my_check" in store.latest_metrics(run["id"])
    assert marker_pids(marker)  # imported by the playground's process (the try) and the worker
