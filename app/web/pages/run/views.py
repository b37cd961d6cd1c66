"""The Run page's views, declared once (`VIEWS`): each one's tab, poller group, outputs, what moves it and its
builder (`builders`). The page's outputs and tabs are derived here, the poller's groups in `poller`."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.web import live
from app.web.pages import values
from app.web.pages.run.builders import (
    controls_view,
    eval_pass_rates,
    filtered_view,
    header_view,
    logs_view,
    samples_view,
    table_view,
    training_view,
    values_view,
)
from app.web.pages.run.frame import Frame, value_count, value_splits
from storage.lifecycle import UNFINISHED


@dataclass(frozen=True)
class View:
    """One part of the Run page. `tab`: the tab it is on (None: above the tabs, always drawn). `group`: the poller's
    group that redraws it (views of one group share a tab). `outputs`: the components it fills, by their names in
    `build_run_page`. `changes(snapshot)`: what moves it, the same for every session (the poller compares it);
    `inputs`: the session's inputs (`Frame` fields) it also reads. `build(frame)`: its outputs (a dict that may hold
    more). `first_page_changes`: what moves it while it shows the first page in stage-1 order, if that differs.
    `with_header`: its group redraws the header too (one event instead of two; False for a group that only moves
    along with one that does)."""

    name: str
    tab: str | None
    group: str
    outputs: tuple[str, ...]
    changes: Callable[[dict[str, Any]], tuple[Any, ...]]
    build: Callable[[Frame], dict[str, Any]]
    inputs: tuple[str, ...] = ()
    first_page_changes: Callable[[dict[str, Any]], tuple[Any, ...]] | None = None
    with_header: bool = True

    def version(self, frame: Frame) -> tuple[Any, ...]:
        """What the view would show in `frame`: the run's changes it follows and the session's inputs it reads."""
        first_page = self.first_page_changes is not None and frame.order == "stage-1 order" and not frame.search
        changes = self.first_page_changes if first_page else self.changes
        return (changes(frame.snap), *(getattr(frame, name) for name in self.inputs))


def _rows(snap: dict[str, Any]) -> tuple[Any, ...]:
    """The run's own V* rows: their value set, count per split, a revision that moves with any rewrite of them,
    and whether the set is complete."""
    run, value_set = snap["run"], snap["value_set"]
    return (run.get("value_set_id"), tuple(sorted((run.get("value_counts") or {}).items())),
            run.get("values_revision"), bool(value_set and value_set["complete"]))


def _header_changes(snap: dict[str, Any]) -> tuple[Any, ...]:
    run = snap["run"]
    active = run["status"] in UNFINISHED  # the elapsed time moves every 10 s while the run is active
    return (run["status"], run.get("stage"), round(run.get("progress") or 0, 3), snap["ids"]["evaluations"],
            *_rows(snap), int(time.time() // 10) if active else 0)


def _controls_changes(snap: dict[str, Any]) -> tuple[Any, ...]:
    run = snap["run"]
    # The error's checksum, not its text: versions go to every browser that polls.
    return run["status"], zlib.crc32((run.get("error") or "").encode()), tuple(value_splits(run))


def _summary_changes(snap: dict[str, Any]) -> tuple[Any, ...]:
    return *_rows(snap), str((snap["value_set"] or {}).get("summary")), snap["run"].get("stage") == "values"


def _charts_changes(snap: dict[str, Any]) -> tuple[Any, ...]:
    return *_rows(snap), str((snap["value_set"] or {}).get("summary")), snap["run"].get("best_eval_accuracy")


def _first_page_changes(snap: dict[str, Any]) -> tuple[Any, ...]:
    """A full first page in stage-1 order moves only when the run's rows are rewritten, not when rows are added
    after it."""
    counts = (snap["run"].get("value_counts") or {}).values()
    value_set_id, _, revision, complete = _rows(snap)
    full = bool(counts) and all(n >= values.PAGE_ROWS for n in counts)
    return ("full", value_set_id, revision, complete) if full else _rows(snap)


def _training_changes(snap: dict[str, Any]) -> tuple[Any, ...]:
    run, ids = snap["run"], snap["ids"]
    # The reference's pass rates drawn beside the eval accuracy move with the run's held-out V* rows.
    return ids["metrics"], ids["evaluations"], value_count(run, "eval"), run.get("values_revision")


def _build_header(frame: Frame) -> dict[str, Any]:
    run, split = frame.run, frame.split
    return live.SHARED.get(("header", run["id"], split), (_header_changes(frame.snap), split),
                           lambda _prev: header_view(frame.store, run, frame.snap["value_set"], split))


def _build_values(frame: Frame) -> dict[str, Any]:
    """The V* tab's summary and charts, computed together once per change of either for every session."""
    run, split = frame.run, frame.split
    version = (_summary_changes(frame.snap), _charts_changes(frame.snap), split)
    return live.SHARED.get(("values", run["id"], split), version,
                           lambda _prev: values_view(frame.store, run, frame.snap["value_set"], split))


def _build_training(frame: Frame) -> dict[str, Any]:
    run, ids = frame.run, frame.snap["ids"]
    ceilings = eval_pass_rates(frame.store, run, ids, frame.snap["value_set"])
    return training_view(frame.store, run["id"], ids, frame.chart, ceilings)


VIEWS: dict[str, View] = {view.name: view for view in (
    View("header", tab=None, group="head", outputs=("header", "progress"), changes=_header_changes,
         build=_build_header, inputs=("split",)),
    View("controls", tab=None, group="controls", outputs=("error", "stop", "resume", "delete", "picker", "split"),
         changes=_controls_changes, build=lambda f: controls_view(f.services, f.run, f.split), inputs=("split",)),
    View("summary", tab="values", group="values", outputs=("summary",), changes=_summary_changes,
         build=_build_values, inputs=("split",)),
    View("charts", tab="values", group="values", outputs=("histogram", "correct_bar", "pass_rates"),
         changes=_charts_changes, build=_build_values, inputs=("split",)),
    View("table_info", tab="values", group="values", outputs=("table_info",), changes=_rows,
         build=lambda f: table_view(f.store, f.run, f.split, f.order, f.search), inputs=("split", "order", "search")),
    View("table", tab="values", group="table", outputs=("table",), changes=_rows,
         build=lambda f: table_view(f.store, f.run, f.split, f.order, f.search), inputs=("split", "order", "search"),
         first_page_changes=_first_page_changes, with_header=False),
    View("filtered", tab="filtered", group="filtered", outputs=("filtered_summary", "filtered_table"),
         changes=_rows, build=lambda f: filtered_view(f.store, f.run, f.split), inputs=("split",)),
    View("training", tab="training", group="training", outputs=("plot", "evaluations"), changes=_training_changes,
         build=_build_training, inputs=("chart",)),
    View("samples", tab="samples", group="samples",
         outputs=("samples", "samples_info", "samples_step", "samples_latest", "samples_split"),
         changes=lambda snap: (snap["ids"]["samples"],),
         inputs=("correct", "text", "step", "sort", "latest", "sample_split"),
         build=lambda f: samples_view(f.store, f.run["id"], f.snap["ids"]["samples"], f)),
    View("logs", tab="logs", group="logs", outputs=("logs",), changes=lambda snap: (snap["ids"]["logs"],),
         build=lambda f: logs_view(f.services, f.run["id"], f.snap["ids"]["logs"])),
)}


HEADER = VIEWS["header"]
# Outputs of `refresh`, in the order of `build_run_page`'s outputs list.
OUTPUTS = ("state", "timer", *dict.fromkeys(name for view in VIEWS.values() for name in view.outputs))
TABS = tuple(dict.fromkeys(view.tab for view in VIEWS.values() if view.tab is not None))
# What a session sees with each tab open: the views above the tabs and the tab's.
ON_TAB = {tab: tuple(view for view in VIEWS.values() if view.tab in (None, tab)) for tab in TABS}
