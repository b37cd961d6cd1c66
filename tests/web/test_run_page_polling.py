"""The Run page's polling (`app.web.pages.run.session.refresh`) against a real Store wrapped to count its reads: a
finished run stops the timer and costs nothing, an unchanged active run costs at most the shared snapshot, only the
views on screen are sent, and many sessions on one run share one computation per new data version."""

from __future__ import annotations

import collections
from pathlib import Path

import gradio as gr
import pytest

from app.access.gate import Services
from app.web import live
from app.web.pages import values
from app.web.pages.run.frame import ChartOptions
from app.web.pages.run.poller import GROUPS, POLLER_JS, draw_group, run_version
from app.web.pages.run.session import new_state, refresh
from app.web.pages.run.views import OUTPUTS
from storage import Store, lifecycle
from tests.helpers import put_in

SPEC = {"name": "poll", "action": "train", "model": "tiny", "dataset": {"source": "arithmetic", "num_prompts": 4}}
INPUTS = (ChartOptions(), "train", "stage-1 order", "", "all", "", "")


class CountingStore:
    """A Store whose every method call is counted (reads and writes alike)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str):
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attr(*args, **kwargs)
        return counted


@pytest.fixture
def page(tmp_path, monkeypatch):
    """(services with a counting store, the run id, the underlying store); a clean shared cache."""
    monkeypatch.setattr(live, "SHARED", live.Shared())
    store = Store(tmp_path / "studio.db")
    run_id = store.create_run("poll", "train", SPEC)
    vs = store.get_or_create_value_set("fp", {})
    put_in(store, run_id, "running", value_set_id=vs, stage="train", started_at=1.0)
    records = [{"prompt_id": f"p{i}", "prompt": f"What is {i}?", "v_star": i / 4,
                "rewards": [1.0] * i + [0.0] * (4 - i), "completions": ["x"] * 4,
                "num_correct": i, "filtered": i == 0} for i in range(5)]
    store.add_values(vs, "train", records)
    store.set_run_values(run_id, "train", records)
    store.add_metrics(run_id, 1, {"loss": 1.0})
    counting = CountingStore(store)
    return Services(store=counting, scheduler=None, data_dir=Path(tmp_path)), run_id, store


def outputs(result: list) -> dict:
    """The non-skipped outputs of one refresh, by name."""
    skip = gr.skip()
    return {name: value for name, value in zip(OUTPUTS, result, strict=True)
            if not (isinstance(value, dict) and value == skip)}


def timer_active(result: list) -> bool | None:
    timer = outputs(result).get("timer")
    return None if timer is None else timer.active


def test_a_finished_run_switches_the_timer_off_and_a_late_poll_reads_nothing(page, monkeypatch):
    services, run_id, store = page
    monkeypatch.setattr(live, "SNAPSHOT_SECONDS", 3600.0)  # no new snapshot second during the test
    store.apply(run_id, lifecycle.FINISH, progress=1.0)
    first = refresh(services, run_id, None, *INPUTS)
    assert timer_active(first) is False
    assert "header" in outputs(first) and "finished" in outputs(first)["header"]
    state = first[0]
    services.store.calls.clear()
    version = run_version(services.store, run_id)  # a poll already on its way when the timer stopped
    assert version["status"] == "finished" and run_version(services.store, run_id) == version
    again = refresh(services, run_id, state, *INPUTS)  # and a redraw that finds nothing new
    assert set(outputs(again)) == {"state"}
    assert services.store.calls == {}  # no store work at all


def test_an_active_run_switches_the_timer_on_and_an_unchanged_poll_reads_only_the_snapshot(page, monkeypatch):
    services, run_id, store = page
    monkeypatch.setattr(live, "SNAPSHOT_SECONDS", 3600.0)
    first = refresh(services, run_id, None, *INPUTS)
    assert timer_active(first) is True
    assert {"header", "histogram", "table", "summary"} <= set(outputs(first))
    assert f'data-run="{run_id}"' in outputs(first)["progress"]  # what the page's poller asks about
    state = first[0]
    services.store.calls.clear()
    version = run_version(services.store, run_id)
    assert services.store.calls == {}  # within the snapshot's second: the shared snapshot, no read
    monkeypatch.setattr(live, "SNAPSHOT_SECONDS", 1e-9)  # every poll reads a fresh snapshot
    assert run_version(services.store, run_id) == version
    assert set(services.store.calls) <= {"get_run", "last_ids", "get_value_set"}  # the snapshot only
    store.add_metrics(run_id, 2, {"loss": 0.5})
    moved = run_version(services.store, run_id)
    assert [g for g in moved if moved[g] != version[g]] == ["training"]  # only that group is redrawn

    store.apply(run_id, lifecycle.FINISH)
    assert run_version(services.store, run_id)["status"] == "finished"
    last = refresh(services, run_id, state, *INPUTS)
    assert timer_active(last) is False and "finished" in outputs(last)["header"]


def test_only_the_visible_tab_is_sent_and_a_tab_catches_up_when_opened(page, monkeypatch):
    services, run_id, store = page
    monkeypatch.setattr(live, "SNAPSHOT_SECONDS", 1e-9)
    state = refresh(services, run_id, None, *INPUTS)[0]  # the V* tab is open
    store.add_metrics(run_id, 2, {"loss": 0.5})
    store.add_log(run_id, "step 2")
    moved = outputs(refresh(services, run_id, state, *INPUTS))
    assert "plot" not in moved and "logs" not in moved  # their tabs are hidden
    training = outputs(refresh(services, run_id, state, *INPUTS, tab="training"))
    assert "plot" in training and "evaluations" in training and "table" not in training
    assert "Loss" in training["plot"].plot
    logs = outputs(refresh(services, run_id, state, *INPUTS, tab="logs"))
    assert "step 2" in logs["logs"]


def test_many_sessions_share_one_computation_per_stage1_batch(page, monkeypatch):
    services, run_id, store = page
    monkeypatch.setattr(live, "SNAPSHOT_SECONDS", 1e-9)
    states = [refresh(services, run_id, None, *INPUTS)[0] for _ in range(30)]
    assert services.store.calls["value_stats"] == 1 and services.store.calls["get_values"] == 0
    services.store.calls.clear()
    batch = [{"prompt_id": "new", "prompt": "What is new?", "v_star": 1.0, "rewards": [1.0] * 4,
              "completions": ["y"] * 4, "num_correct": 4}]
    store.add_values(store.get_run(run_id)["value_set_id"], "train", batch)
    store.set_run_values(run_id, "train", batch)
    for state in states:
        moved = outputs(refresh(services, run_id, state, *INPUTS))
        assert "**6 prompts**" in moved["summary"] and "kept (5)" in moved["histogram"].plot and "table" in moved
    assert services.store.calls["value_stats"] == 1
    # The first page in stage-1 order was not full: only the rows stored since were read, once.
    assert services.store.calls["values_after"] == 1 and services.store.calls["values_page"] == 0
    assert services.store.calls["get_values"] == 0


def test_picking_another_run_sets_the_timer_for_it(page):
    services, run_id, store = page
    other = store.create_run("done", "train", SPEC)
    put_in(store, other, "failed", error="boom")
    state = refresh(services, run_id, None, *INPUTS)[0]
    assert state["polling"] is True
    switched = refresh(services, other, new_state(other, state["tab"]), *INPUTS)
    assert timer_active(switched) is False and "boom" in outputs(switched)["error"].value
    nothing = refresh(services, None, None, *INPUTS)
    assert timer_active(nothing) is False and "Pick a run" in outputs(nothing)["header"]
    assert run_version(services.store, 999) == {"status": "gone"}


def test_the_poller_redraws_a_group_with_its_outputs_only(page, monkeypatch):
    services, run_id, store = page
    monkeypatch.setattr(live, "SNAPSHOT_SECONDS", 1e-9)
    refresh(services, run_id, None, *INPUTS)
    store.add_metrics(run_id, 2, {"loss": 0.25})
    header, progress, plot, evaluations = draw_group(services, "training", run_id, *INPUTS)
    assert "Loss" in plot.plot and list(evaluations.columns) == ["step", "split"] and "poll" in header
    header, progress = draw_group(services, "head", run_id, *INPUTS)
    assert "poll" in header and f'data-run="{run_id}"' in progress
    store.apply(run_id, lifecycle.FINISH)
    controls = dict(zip(GROUPS["controls"][1], draw_group(services, "controls", run_id, *INPUTS), strict=True))
    assert controls["resume"].interactive is False
    # Only the "idle" draw, which the poller asks for once it has seen the end twice, switches the timer off, and it
    # draws the header from the same snapshot: polls never stop on a page whose header misses the end.
    assert [group for group, (_, names) in GROUPS.items() if "timer" in names] == ["idle"]
    header, _, timer = draw_group(services, "idle", run_id, *INPUTS)
    assert timer.active is False and "finished" in header
    assert "run-draw-idle" in POLLER_JS and '"stopping"' in POLLER_JS
    assert draw_group(services, "logs", 999, *INPUTS) == [gr.skip()] * 3


def test_a_rewrite_of_the_run_rows_redraws_even_a_full_first_page(page, monkeypatch):
    """Rows added after the last leave a full first page alone; a rewrite of the run's own V* (its stage 1 ending
    with its beta1 over rows it was first given another run's values for) moves every V* view, that page too."""
    services, run_id, store = page
    monkeypatch.setattr(live, "SNAPSHOT_SECONDS", 1e-9)
    monkeypatch.setattr(values, "PAGE_ROWS", 3)
    before = run_version(services.store, run_id)
    batch = [{"prompt_id": "new", "prompt": "What is new?", "v_star": 1.0, "rewards": [1.0] * 4,
              "completions": ["y"] * 4, "num_correct": 4}]
    store.add_values(store.get_run(run_id)["value_set_id"], "train", batch)
    store.set_run_values(run_id, "train", batch)
    added = run_version(services.store, run_id)
    assert added["table_first"] == before["table_first"] and added["table"] != before["table"]
    state = refresh(services, run_id, None, *INPUTS)[0]
    store.set_run_values(run_id, "train", [{"prompt_id": "p1", "v_star": 0.9, "num_correct": 1, "filtered": False}])
    rewritten = run_version(services.store, run_id)
    assert all(rewritten[g] != added[g] for g in ("table_first", "table", "values", "filtered"))
    moved = outputs(refresh(services, run_id, state, *INPUTS))
    assert list(moved["table"]["V*"])[:2] == [0.0, 0.9]
