"""Runs page: every run with its status, stage, progress, timing and best eval accuracy; a click opens it.

Its timer runs only while the page is open (`RunsPage.poll_while_open`): every `POLL_SECONDS` while some run is
active (queued, running, stopping), every `IDLE_SECONDS` otherwise, only to notice runs launched elsewhere (another
tab, the API). Each poll reads the runs table once and sends nothing unless a row shown changed; the table itself
is built once per change for all sessions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from app.access.gate import Services
from app.web import live
from app.web.common import elapsed_seconds, format_duration, format_time, method_label
from app.web.pages.run.page import SHOW_RUN_TAB
from app.web.remaining import estimate_remaining, training_seconds
from storage.lifecycle import UNFINISHED

COLUMN_WIDTHS = ["4%", "10%", "6%", "7%", "5%", "5%", "6%", "7%", "7%", "11%", "12%", "6%", "6%", "8%"]
RUN_COLUMNS = ["id", "name", "action", "status", "stage", "progress", "wall time", "training time", "remaining",
               "model", "dataset", "best eval acc", "owner", "created"]
EXPLANATION = ("## Runs\nClick a row to open the run. **wall time**: since the run (last) started, loading and "
               "pauses included; **training time**: the run's own clock, stage 1 of its training prompts plus its "
               "training steps (evaluations, loading and pauses left out: what Compare counts); **remaining**: the "
               "rest of the run (stage 1, training steps and the evaluations to come) at the rates its clock "
               "measured; `≥`: what is measured so far, while a part has no rate yet (e.g. training before its "
               "first step).")
POLL_SECONDS = 3.0
IDLE_SECONDS = 15.0
# The run fields the table shows (with its clock, `Store.run_clocks`, read when the table is rebuilt), the
# signature of a poll.
SHOWN = ("id", "name", "action", "status", "stage", "progress", "model", "dataset", "best_eval_accuracy", "owner",
         "created_at", "started_at", "finished_at")


@dataclass
class RunsPage:
    table: gr.Dataframe
    selected: gr.State
    select_event: Any
    timer: gr.Timer
    refresh_outputs: list[Any]
    poll: Callable[[Any], tuple[Any, ...]]

    def poll_while_open(self, tab: gr.Tab, other_tabs: list[gr.Tab]) -> None:
        """Run the timer only while `tab` (the one holding this page) is the selected tab: opening it redraws the
        table and starts the timer, opening any of `other_tabs` stops it (clicking a run, which opens the Run
        page, stops it too)."""
        private = {"api_visibility": "private", "show_progress": "hidden"}
        tab.select(lambda previous: self.poll(previous, restart=True), self.refresh_outputs[2],
                   self.refresh_outputs, **private)
        for other in other_tabs:
            other.select(lambda: gr.Timer(active=False), None, self.timer, **private)


def runs_frame(runs: list[dict[str, Any]], clocks: Mapping[int, Mapping[str, float]] | None = None) -> pd.DataFrame:
    """The table of `runs`, with their clocks by run id (`Store.run_clocks`)."""
    rows = []
    for run in runs:
        clock = (clocks or {}).get(run["id"])
        best = run.get("best_eval_accuracy")
        rows.append({"id": run["id"], "name": run["name"], "action": f"{run['action']} · {method_label(run)}",
                     "status": run["status"],
                     "stage": run.get("stage") or "", "progress": f"{(run.get('progress') or 0):.0%}",
                     "wall time": format_duration(elapsed_seconds(run)),
                     "training time": format_duration(training_seconds(clock)),
                     "remaining": estimate_remaining(run, clock).text(),
                     "model": Path(run["model"]).name if "/" in run["model"] and Path(run["model"]).is_absolute()
                     else run["model"], "dataset": run["dataset"],
                     "best eval acc": "" if best is None else f"{best:.1%}", "owner": run.get("owner") or "",
                     "created": format_time(run["created_at"])})
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def build_runs_page(services: Services) -> RunsPage:
    gr.Markdown(EXPLANATION)
    with gr.Row():
        refresh = gr.Button("Refresh", size="sm", scale=0, min_width=100, elem_id="runs-refresh")
        info = gr.Markdown(elem_id="runs-info")
    table = gr.Dataframe(headers=RUN_COLUMNS,
                         interactive=False, show_search="filter", max_height=700, wrap=True, elem_id="runs-table",
                         label="Runs", column_widths=COLUMN_WIDTHS)
    selected = gr.State(None)
    timer = gr.Timer(POLL_SECONDS, active=False)  # see `RunsPage.poll_while_open`
    last = gr.State(None)

    def poll(previous: Any, restart: bool = False):
        """(table, info, signature, timer): the table only when a row shown changed, the timer only when its pace
        does (or `restart`: the page was just opened)."""
        runs = services.store.list_runs()
        active = sum(r["status"] in UNFINISHED for r in runs)
        # Elapsed and remaining times move while runs are active: their 5-second bucket is part of the signature.
        signature = (str([tuple(r.get(k) for k in SHOWN) for r in runs]), int(time.time() // 5) if active else 0)
        pace = POLL_SECONDS if active else IDLE_SECONDS
        timer_update = (gr.Timer(pace, active=True) if restart or not previous or previous[1] != pace
                        else gr.skip())
        if previous and previous[0] == signature:
            return gr.skip(), gr.skip(), previous, timer_update
        frame = live.SHARED.get(("runs",), signature, lambda _prev: runs_frame(
            runs, services.store.run_clocks(r["id"] for r in runs)))  # one read for every run
        info = f"{len(runs)} run{'s' if len(runs) != 1 else ''}, {active} active."
        return frame, info, (signature, pace), timer_update

    outputs = [table, info, last, timer]
    common = {"show_progress": "hidden", "concurrency_limit": None}
    # Callable by clients (benchmarks/polling_cost.py simulates a class with it); it reads only the runs list.
    timer.tick(poll, last, outputs, api_name="runs_poll", api_visibility="undocumented", **common)
    refresh.click(lambda: poll(None, restart=True), None, outputs, api_visibility="private", **common)

    def select(evt: gr.SelectData):
        if not evt.row_value:
            return gr.skip(), gr.skip()
        return int(evt.row_value[0]), gr.Timer(active=False)  # the Run page opens: stop polling this one

    event = table.select(select, None, [selected, timer], api_visibility="private")
    table.select(None, None, None, js=SHOW_RUN_TAB)  # even when the run clicked is the one already open
    return RunsPage(table=table, selected=selected, select_event=event, timer=timer, refresh_outputs=outputs,
                    poll=poll)
