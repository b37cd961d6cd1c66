"""The Run page's views as declared (`app.web.pages.run.views.VIEWS`), called directly on a real Store without a
browser: each builds the outputs it declares, the page's outputs, tabs and poller groups follow the declarations, a
view's version moves with its own data only, the poller is the packaged script with one config object, and the header
says which engine sampled the run."""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import gradio as gr
import pytest

from app.access.gate import Services
from app.web import live
from app.web.api import run_summary
from app.web.pages.run.frame import ChartOptions, Frame
from app.web.pages.run.page import build_run_page
from app.web.pages.run.poller import GROUP_OWN, GROUP_VIEWS, GROUPS, IDLE, POLLER_CONFIG, POLLER_JS, run_version
from app.web.pages.run.session import refresh
from app.web.pages.run.views import HEADER, ON_TAB, OUTPUTS, TABS, VIEWS
from storage import Store, lifecycle
from tests.helpers import put_in

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"name": "views", "action": "train", "model": "tiny", "dataset": {"source": "arithmetic", "num_prompts": 4}}
INPUTS = (ChartOptions(), "train", "stage-1 order", "", "all", "", "")


@pytest.fixture
def page(tmp_path, monkeypatch):
    """(services, run id, store): a running run with V* rows, a metric, a sample and a log line."""
    monkeypatch.setattr(live, "SHARED", live.Shared())
    monkeypatch.setattr(live, "SNAPSHOT_SECONDS", 1e-9)  # every draw reads the store as it is now
    store = Store(tmp_path / "studio.db")
    run_id = store.create_run("views", "train", SPEC)
    value_set = store.get_or_create_value_set("fp", {})
    put_in(store, run_id, "running", value_set_id=value_set, stage="train", started_at=1.0)
    records = [{"prompt_id": f"p{i}", "prompt": f"What is {i}?", "v_star": i / 4, "completions": ["x"] * 4,
                "rewards": [1.0] * i + [0.0] * (4 - i), "num_correct": i, "filtered": i == 0} for i in range(5)]
    store.add_values(value_set, "train", records)
    store.set_run_values(run_id, "train", records)
    store.add_metrics(run_id, 1, {"loss": 1.0})
    store.add_log(run_id, "step 1")
    return Services(store=store, scheduler=None, data_dir=tmp_path), run_id, store


def frame(services: Services, run_id: int) -> Frame:
    return Frame.of(services, live.snapshot(services.store, run_id), *INPUTS)


def test_every_view_builds_the_outputs_it_declares(page):
    services, run_id, _ = page
    drawn = frame(services, run_id)
    for view in VIEWS.values():
        built = view.build(drawn)
        assert set(view.outputs) <= set(built), view.name
        assert view.version(drawn) == view.version(frame(services, run_id)), view.name  # a version is stable


def test_the_outputs_tabs_and_poller_groups_follow_the_declarations():
    views = list(VIEWS.values())
    declared = [name for view in views for name in view.outputs]
    assert len(declared) == len(set(declared)), "an output belongs to one view"
    assert OUTPUTS == ("state", "timer", *declared)
    assert TABS == ("values", "filtered", "training", "samples", "logs")
    for tab in TABS:
        assert [v.name for v in ON_TAB[tab]] == [v.name for v in views if v.tab in (None, tab)]
    for group, (tab, outputs) in GROUPS.items():
        own = [v for v in views if v.group == group]
        assert {v.tab for v in own} <= {tab}, group
        drawn = [name for v in GROUP_VIEWS[group] for name in v.outputs]
        assert list(outputs) == drawn + (["timer"] if group == IDLE else []), group
    # A tab's group draws the header too, but for the table (it moves only with the V* summary, which does).
    assert [g for g, vs in GROUP_VIEWS.items() if HEADER in vs and g != "head"] == [
        "values", "filtered", "training", "samples", "logs", "idle"]
    assert POLLER_CONFIG["group_tabs"] == {g: tab for g, (tab, _) in GROUPS.items() if g != IDLE}


def test_a_view_moves_with_its_own_data_only(page):
    services, run_id, store = page
    store.apply(run_id, lifecycle.FINISH)  # no clock in the header's version: it moves every 10 s while active
    before = {name: view.version(frame(services, run_id)) for name, view in VIEWS.items()}
    polled = run_version(store, run_id)
    assert set(polled) == {"status", *GROUP_OWN, "table_first"}

    def moved() -> list[str]:
        now = {name: view.version(frame(services, run_id)) for name, view in VIEWS.items()}
        return [name for name in now if now[name] != before[name]]

    store.add_metrics(run_id, 2, {"loss": 0.5})
    assert moved() == ["training"]
    store.add_log(run_id, "step 2")
    assert moved() == ["training", "logs"]
    after = run_version(store, run_id)
    assert [g for g in after if after[g] != polled[g]] == ["training", "logs"]


def test_the_page_has_a_component_for_every_output_and_a_button_per_group(page):
    services, _, _ = page
    with gr.Blocks() as demo:
        build_run_page(services)
    ids = {block.elem_id for block in demo.blocks.values()}
    assert {f"run-draw-{group}" for group in GROUPS} <= ids
    api = demo.get_api_info()["named_endpoints"]  # undocumented endpoints are callable, not listed
    assert "/run_version" not in api and all(f"/run_draw_{g}" not in api for g in GROUPS)


def test_the_poller_is_the_packaged_script_given_one_config():
    script = (ROOT / "app" / "web" / "static" / "run_poller.js").read_text()
    assert script.strip() in POLLER_JS and json.dumps(POLLER_CONFIG) in POLLER_JS
    assert "LIVE_REDRAW" not in script and "config.redraw_ms" in script  # no text replaced into the script
    assert POLLER_CONFIG["first_page_groups"] == ["table"] and "stopping" in POLLER_CONFIG["active_statuses"]
    # The wheel ships what pyproject's package-data names (`"app.web" = [...]`).
    shipped = re.findall(r'"([^"]+)"', re.search(r'^"app\.web" = \[(.*)\]', (ROOT / "pyproject.toml").read_text(),
                                                 re.MULTILINE).group(1))
    for path in (ROOT / "app" / "web" / "static").iterdir():
        assert any(fnmatch.fnmatch(f"static/{path.name}", pattern) for pattern in shipped), path.name


@pytest.mark.parametrize(("config", "engine"), [({}, "the native decoder"),
                                                ({"use_vllm": True}, "vLLM (colocated)"),
                                                ({"use_vllm": False, "vllm_mode": "colocate"}, "the native decoder")])
def test_the_header_says_which_engine_sampled_the_run(tmp_path, monkeypatch, config, engine):
    monkeypatch.setattr(live, "SHARED", live.Shared())  # run ids repeat across this test's stores
    store = Store(tmp_path / "studio.db")
    run_id = store.create_run("engine", "train", {**SPEC, "config": config})
    put_in(store, run_id, "finished")
    services = Services(store=store, scheduler=None, data_dir=tmp_path)
    result = dict(zip(OUTPUTS, refresh(services, run_id, None, *INPUTS), strict=True))
    assert f'sampled by <span id="run-sampler">{engine}</span>' in result["header"]


def test_the_error_box_reads_like_the_api(page):
    """One scrubber (`Services.public_text`): the run's own files are named as /status names them, a database URL
    with its password is hidden on both."""
    services, run_id, store = page
    output = services.data_dir / "runs" / str(run_id) / "checkpoint-2"
    error = f"Failed to save {output}: disk full (--db postgresql://admin:hunter2@db.internal:5432/studio)"
    store.apply(run_id, lifecycle.FAIL, error=error)
    shown = dict(zip(OUTPUTS, refresh(services, run_id, None, *INPUTS), strict=True))["error"].value
    assert shown == run_summary(store.get_run(run_id), services.public_text)["error"]
    assert str(output) in shown and "hunter2" not in shown
