"""The Run page's remaining-time estimate in a real headless Chromium, against the time that actually remained: a
real `python -m app`, a real worker and the tiny model train 640 steps (stage 1, evaluations every quarter of the
run, the final one). Once the clock has a steady step rate, the estimate covers the whole rest of the run from the
rates the run's clock measured, so it must be within 50% of what the run then took to finish."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import playwright.sync_api as playwright
import pytest
from gradio_client import Client

from app.web.pages.run.poller import POLL_SECONDS
from storage import Store
from tests.browser import TIMEOUT_MS
from tests.helpers import wait_status
from tests.web.test_app_api import free_port, start_app, stop_app, tiny_spec

pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir) -> Iterator[tuple[str, Path]]:
    data_dir = tmp_path_factory.mktemp("studio-remaining")
    # Timing tests run beside busy loops too, where the app takes longer to start.
    proc = start_app(data_dir, port := free_port(), "--model-root", tiny_model_dir, timeout=300)
    try:
        yield f"http://127.0.0.1:{port}/", data_dir
    finally:
        stop_app(proc)


def seconds_shown(text: str) -> float | None:
    """The seconds of "remaining ≈ 1m 05s" (`format_duration`), None for a lower bound or "–"."""
    found = re.fullmatch(r"remaining ≈ ((?:\d+[hms] ?)+)", text.strip())
    if not found:
        return None
    unit = {"h": 3600, "m": 60, "s": 1}
    return float(sum(int(n) * unit[u] for n, u in re.findall(r"(\d+)([hms])", found.group(1))))


def test_the_remaining_estimate_is_within_half_of_what_remained(studio, browser, tiny_model_dir):
    url, data_dir = studio
    # 1280 prompts, 1 a step, one epoch: 1280 steps, evaluated at each quarter of the run (640 prompts ended too soon
    # after the first estimate on a quiet machine to judge it). One
    # reference sample a prompt keeps stage 1 short beside training, so most of the run is left when the first
    # estimate shows. The random model writes every completion to its full length: steps of an even cost.
    spec = tiny_spec(tiny_model_dir, "time-left", max_steps=-1, num_train_epochs=1.0, per_device_train_batch_size=1,
                     num_value_samples=1, max_completion_length=96, eval_steps=0.25)
    spec["dataset"].update(num_prompts=1280, eval_size=8)
    run_id = Client(url, verbose=False).predict(spec=spec, api_name="/launch")["run_id"]

    page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url, wait_until="load")
    page.get_by_role("tab", name="Runs", exact=True).first.click()
    page.locator("#runs-table").get_by_text("time-left", exact=True).filter(visible=True).first.click()
    remaining = page.locator("#run-remaining")
    playwright.expect(remaining).to_be_attached()

    # The first estimate of the whole rest of the run made from the steady step rate (`step_seconds`, logged from
    # the second step on; before the first step a part has no measured rate and the page shows a lower bound,
    # "≥ …", or "–"), read from the page's next redraw after that rate is stored.
    store = Store(data_dir / "studio.db")
    deadline = time.monotonic() + 300
    while "step_seconds" not in store.latest_metrics(run_id):
        assert time.monotonic() < deadline, f"no step rate; the header says {remaining.inner_text()!r}"
        assert store.get_run(run_id)["status"] in ("queued", "running"), store.get_run(run_id)
        time.sleep(0.1)
    time.sleep(POLL_SECONDS + 0.5)
    while not (estimate := seconds_shown(shown := remaining.inner_text())):
        assert time.monotonic() < deadline, f"no estimate; the header says {shown!r}"
        assert store.get_run(run_id)["status"] in ("queued", "running"), store.get_run(run_id)
        time.sleep(0.1)
    read_at = time.time()
    stage = store.get_run(run_id)["stage"]
    assert stage in ("train", "eval"), (stage, shown)

    run = wait_status(store, run_id, ("finished", "failed"), timeout=300)
    assert run["status"] == "finished", run["error"]
    actual = run["finished_at"] - read_at
    print(f"estimate {estimate:.1f} s ({shown!r}, stage {stage}), then the run took {actual:.1f} s")
    assert actual > 15, f"the run finished {actual:.1f} s after the estimate was read: too soon to judge it"
    assert 0.5 * actual <= estimate <= 1.5 * actual, (
        f"estimated {estimate:.1f} s ({shown!r}), the run took {actual:.1f} s more")
    playwright.expect(remaining).to_have_text("remaining ≈ 0s")
    page.context.close()
