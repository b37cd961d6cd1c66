"""Runs page: every run with its status, stage, progress, timing and best eval accuracy; a click opens it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from app.ui.common import Services, elapsed_and_remaining, format_duration, format_time

COLUMN_WIDTHS = ["4%", "11%", "6%", "8%", "6%", "7%", "7%", "8%", "13%", "14%", "7%", "9%"]
RUN_COLUMNS = ["id", "name", "kind", "status", "stage", "progress", "elapsed", "remaining", "model", "dataset",
               "best eval acc", "created"]
POLL_SECONDS = 3.0


@dataclass
class RunsPage:
    table: gr.Dataframe
    selected: gr.State
    select_event: Any


def runs_frame(runs: list[dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for run in runs:
        elapsed, remaining = elapsed_and_remaining(run)
        best = run.get("best_eval_accuracy")
        rows.append({"id": run["id"], "name": run["name"], "kind": run["kind"], "status": run["status"],
                     "stage": run.get("stage") or "", "progress": f"{(run.get('progress') or 0):.0%}",
                     "elapsed": format_duration(elapsed), "remaining": format_duration(remaining),
                     "model": Path(run["model"]).name if "/" in run["model"] and Path(run["model"]).is_absolute()
                     else run["model"], "dataset": run["dataset"],
                     "best eval acc": "" if best is None else f"{best:.1%}", "created": format_time(run["created_at"])})
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def build_runs_page(services: Services) -> RunsPage:
    gr.Markdown("## Runs\nClick a row to open the run. Times: elapsed since the run started; remaining is "
                "estimated from the progress of its current stage.")
    with gr.Row():
        refresh = gr.Button("Refresh", size="sm", scale=0, min_width=100, elem_id="runs-refresh")
        info = gr.Markdown(elem_id="runs-info")
    table = gr.Dataframe(value=lambda: runs_frame(services.store.list_runs()), headers=RUN_COLUMNS,
                         interactive=False, show_search="filter", max_height=700, wrap=True, elem_id="runs-table",
                         label="Runs", column_widths=COLUMN_WIDTHS)
    selected = gr.State(None)
    timer = gr.Timer(POLL_SECONDS)
    last = gr.State(None)

    def poll(previous: Any):
        runs = services.store.list_runs()
        frame = runs_frame(runs)
        signature = frame.to_json()
        if signature == previous:
            return gr.skip(), gr.skip(), previous
        active = sum(r["status"] in ("queued", "running", "stopping") for r in runs)
        return frame, f"{len(runs)} run{'s' if len(runs) != 1 else ''}, {active} active.", signature

    common = {"api_visibility": "private", "show_progress": "hidden", "concurrency_limit": None}
    timer.tick(poll, last, [table, info, last], **common)
    refresh.click(lambda: poll(None), None, [table, info, last], **common)

    def select(evt: gr.SelectData):
        return int(evt.row_value[0]) if evt.row_value else gr.skip()

    event = table.select(select, None, selected, api_visibility="private")
    return RunsPage(table=table, selected=selected, select_event=event)
