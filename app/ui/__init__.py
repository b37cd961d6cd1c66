"""The dashboard's pages, one module each, assembled into one `gr.Blocks` by `build_demo`."""

from __future__ import annotations

from typing import Any

import gradio as gr

from app.ui.api import register_api
from app.ui.common import CSS, Services, run_choices
from app.ui.compare import build_compare_page
from app.ui.export import build_export_page
from app.ui.launch import build_launch_page, model_choices
from app.ui.run import build_run_page
from app.ui.runs import build_runs_page

TITLE = "A*-PO Studio"


def build_demo(services: Services) -> gr.Blocks:
    """All pages as top-level tabs (Launch, Runs, Run, Compare, Export) plus the named API endpoints."""
    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:
        gr.Markdown(f"# {TITLE}\nTrain language models with A*-PO: stage 1 estimates V*(x) from N reference "
                    "samples per prompt, stage 2 regresses the policy onto the optimal advantage.")
        with gr.Tabs(selected="launch", elem_id="main-tabs") as tabs:
            with gr.Tab("Launch", id="launch", elem_id="page-launch") as launch_tab:
                launch = build_launch_page(services)
            with gr.Tab("Runs", id="runs", elem_id="page-runs"):
                runs = build_runs_page(services)
            with gr.Tab("Run", id="run", elem_id="page-run") as run_tab:
                run = build_run_page(services)
            with gr.Tab("Compare", id="compare", elem_id="page-compare") as compare_tab:
                compare_picker = build_compare_page(services)
            with gr.Tab("Export", id="export", elem_id="page-export") as export_tab:
                export_picker = build_export_page(services)
        register_api(services)

        def open_run(run_id: int | None) -> tuple[Any, Any]:
            if run_id is None:
                return gr.skip(), gr.skip()
            return gr.Tabs(selected="run"), gr.Dropdown(choices=run_choices(services.store), value=int(run_id))

        private = {"api_visibility": "private"}
        for event in launch.events:
            event.then(open_run, launch.launched, [tabs, run.picker], **private)
        runs.select_event.then(open_run, runs.selected, [tabs, run.picker], **private)

        def choices() -> Any:
            return gr.Dropdown(choices=run_choices(services.store))

        run_tab.select(choices, None, run.picker, **private)
        compare_tab.select(choices, None, compare_picker, **private)
        export_tab.select(choices, None, export_picker, **private)
        launch_tab.select(lambda: gr.Dropdown(choices=model_choices(services)), None, launch.model, **private)
    return demo


def launch_options() -> dict[str, Any]:
    """Keyword arguments of `demo.launch` that belong to the look (Gradio 6 takes theme and css there)."""
    return {"theme": gr.themes.Soft(), "css": CSS}


__all__ = ["Services", "build_demo", "launch_options"]
