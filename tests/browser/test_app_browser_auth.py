"""Logins in a real browser: a user signs in on a studio started with `--auth`, launches a run, and an anonymous
page can watch that run but cannot stop it; the owner can. Real `python -m app`, real worker, tiny model."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import playwright.sync_api as playwright
import pytest

from tests.browser import open_page, set_field
from tests.helpers import busy_cpus
from tests.web.test_app_api import free_port, start_app, stop_app

CLICKS = int(os.environ.get("A2PO_CLICK_RUNS", "4"))  # `make stress` clicks 50 times


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir) -> Iterator[tuple[str, str]]:
    data_dir = tmp_path_factory.mktemp("studio-auth")
    model = data_dir / "models" / "tiny"
    shutil.copytree(tiny_model_dir, model)
    port = free_port()
    proc = start_app(data_dir, port, "--auth", "alice:wonderland")
    try:
        yield f"http://127.0.0.1:{port}/", str(model)
    finally:
        stop_app(proc)


def test_only_the_signed_in_owner_stops_a_run(studio, browser):
    url, model = studio
    expect = playwright.expect
    alice = open_page(browser, url)
    expect(alice.locator("#login-status")).to_contain_text("Browsing as a visitor")

    # A visitor cannot launch.
    alice.locator("#action-train").click()
    expect(alice.locator("#launch-status")).to_contain_text("Launching runs needs a login on this studio")

    # Alice signs in (a wrong password first) and launches a long tiny run.
    set_field(alice, "login-user", "alice")
    set_field(alice, "login-password", "nope")
    alice.locator("#login-button").click()
    expect(alice.locator("#login-status")).to_contain_text("Wrong user name or password")
    set_field(alice, "login-password", "wonderland")
    alice.locator("#login-button").click()
    expect(alice.locator("#login-status")).to_contain_text("Signed in as alice")
    alice.reload(wait_until="load")  # the sign-in survives a reload
    expect(alice.locator("#login-status")).to_contain_text("Signed in as alice")

    for field, value in (("field-model", model), ("field-name", "alices-run"), ("field-num_prompts", "8"),
                         ("field-eval_size", "0"), ("field-max_completion_length", "8"), ("field-max_steps", "100000"),
                         ("field-per_device_train_batch_size", "4"), ("field-num_value_samples", "2")):
        set_field(alice, field, value)
    alice.get_by_text("Advanced", exact=True).click()
    alice.locator("#field-filter_all_incorrect input[type=checkbox]").uncheck()
    alice.locator("#action-train").click()
    expect(alice.locator("#run-header")).to_contain_text("alices-run")
    expect(alice.locator("#run-header")).to_contain_text("running")

    # An anonymous page sees the run, and who launched it, but its Stop is refused.
    visitor = open_page(browser, url)
    visitor.get_by_role("tab", name="Runs", exact=True).first.click()
    expect(visitor.locator("#runs-table")).to_contain_text("alice")
    visitor.locator("#runs-table").get_by_text("alices-run").filter(visible=True).first.click()
    expect(visitor.locator("#run-header")).to_contain_text("alices-run")
    # A click on the Runs page opens the run every time, also on a busy machine: the Run page's own events, started
    # as its tab opened and before the picker had the run, once finished last and left it blank ("Pick a run").
    missed = []
    with busy_cpus():
        for attempt in range(CLICKS):
            page = open_page(browser, url)
            page.get_by_role("tab", name="Runs", exact=True).first.click()
            page.locator("#runs-table").get_by_text("alices-run").filter(visible=True).first.click()
            try:
                expect(page.locator("#run-header")).to_contain_text("alices-run", timeout=30_000)
            except AssertionError:
                missed.append(attempt)
            page.context.close()
    assert not missed, f"clicks {missed} of {CLICKS} left the Run page without the run"
    visitor.locator("#run-stop").click()
    expect(visitor.locator("#run-action")).to_contain_text("needs a login")
    expect(visitor.locator("#run-header")).to_contain_text("running")

    # The owner's Stop works.
    alice.locator("#run-stop").click()
    expect(alice.locator("#run-header")).to_contain_text("stopped")
    expect(visitor.locator("#run-header")).to_contain_text("stopped")
