"""A session's own draws of the Run page (`refresh`: a run picked, a tab opened, a filter changed): the views on
screen whose version moved since the session's state."""

from __future__ import annotations

from typing import Any

import gradio as gr

from app.access.gate import Services
from app.web import charts, live
from app.web.common import run_choices
from app.web.pages import completions
from app.web.pages.run.builders import button_updates, filtered_view, plot_data, table_view, values_view
from app.web.pages.run.frame import ChartOptions, Frame
from app.web.pages.run.poller import POLL_SECONDS
from app.web.pages.run.views import ON_TAB, OUTPUTS
from storage import Store
from storage.lifecycle import UNFINISHED


def new_state(run_id: int | None, tab: str = "values") -> dict[str, Any]:
    """What a session shows for `run_id`: nothing yet (one version per view, set once drawn; `polling`: whether
    the page's timer is on, None while unknown, so the first refresh sets it either way)."""
    return {"run_id": run_id, "tab": tab, "polling": None, "shown": {}}


def refresh(services: Services, run_id: int | None, state: dict[str, Any] | None, chart: ChartOptions, split: str,
            order: str, search: str | None, correct: str, text: str | None, step: float | None,
            sort: str | None = None, latest: bool | None = True, sample_split: str | None = None,
            tab: str | None = None) -> list[Any]:
    """Draw what moved since `state` (a tab switch, a filter change, a new run picked): updates for the
    `OUTPUTS`, where only the views on screen (`ON_TAB`: above the tabs and the selected tab's) whose version moved
    since `state` are sent, everything else `gr.skip()`."""
    if state is None or state.get("run_id") != run_id:
        state = new_state(run_id, (state or {}).get("tab", "values"))
    if tab is not None:
        state["tab"] = tab
    out: dict[str, Any] = {"state": state}
    snap = live.snapshot(services.store, run_id) if run_id is not None else None
    if snap is None:
        _set_timer(state, out, False)
        if not state["shown"].get("empty"):
            state["shown"] = {"empty": True}
            out.update(_no_run(services.store, split or "train"))
        return _updates(out)

    frame = Frame.of(services, snap, chart, split, order, search, correct, text, step, sort, latest, sample_split)
    shown = state["shown"]
    for view in ON_TAB[state["tab"]]:
        version = view.version(frame)
        if shown.get(view.name) != version:
            built = view.build(frame)
            out.update({name: built[name] for name in view.outputs})
            shown[view.name] = version
    shown.pop("empty", None)
    _set_timer(state, out, frame.run["status"] in UNFINISHED, rearm=True)
    return _updates(out)


def _no_run(store: Store, split: str) -> dict[str, Any]:
    """The page with no run picked."""
    return {"header": "Pick a run above, launch one, or open one from the Runs page.", "progress": "",
            "error": gr.Textbox(visible=False, value=""), "logs": "",
            "plot": plot_data(charts.empty_spec("No run selected")), "evaluations": None, "samples": None,
            "samples_info": "", "samples_step": completions.step_slider([], None), "samples_latest": True,
            "samples_split": gr.Radio(choices=["train"], value="train"),
            "picker": gr.Dropdown(choices=run_choices(store)),
            **values_view(store, {}, None, split), **table_view(store, None, "", "", None),
            **filtered_view(store, None, ""),
            **dict(zip(("stop", "resume", "delete"), button_updates(None), strict=True))}


def _set_timer(state: dict[str, Any], out: dict[str, Any], active: bool, rearm: bool = False) -> None:
    """Switch the page's timer on or off when the run's activity changed; with `rearm` (a click of the user on a
    live run) send its state again, so a timer the browser dropped comes back (we saw that once, after a quick
    succession of tab clicks; an update that repeats its state costs the page nothing)."""
    if state["polling"] != active or (active and rearm):
        state["polling"] = active
        out["timer"] = gr.Timer(POLL_SECONDS, active=active)


def _updates(out: dict[str, Any]) -> list[Any]:
    return [out.get(name, gr.skip()) for name in OUTPUTS]
