"""The dashboard's pages, one module each, assembled into one `gr.Blocks` by `build_demo`."""

from __future__ import annotations

from typing import Any

import gradio as gr

from app.access.gate import Services
from app.web.api import register_api
from app.web.banner import build_banner
from app.web.common import CSS, model_choices, run_choices
from app.web.pages.chunks import build_chunk_panel
from app.web.pages.compare import build_compare_page
from app.web.pages.compare import study_choices as _study_choices
from app.web.pages.explain import build_explain_page
from app.web.pages.export import build_export_page
from app.web.pages.launch.form import preset_choices
from app.web.pages.launch.page import build_launch_page
from app.web.pages.login import build_login, show_status
from app.web.pages.playground import build_playground_page
from app.web.pages.run.page import build_run_page
from app.web.pages.runs import build_runs_page
from app.web.pages.studies import build_studies_page

TITLE = "A*-PO Studio"
SHOW_LAUNCH_TAB = "() => { document.getElementById('page-launch-button')?.click(); return []; }"


def build_demo(services: Services) -> gr.Blocks:
    """All pages as top-level tabs (Launch, Runs, Run, Compare, Export) plus the named API endpoints."""
    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:
        services.policy.received_uploads = demo.upload_file_set  # the same set, filled as uploads arrive
        gr.Markdown(f"# {TITLE}\nTrain language models with A*-PO: stage 1 estimates V*(x) from N reference "
                    "samples per prompt, stage 2 regresses the policy onto the optimal advantage.")
        build_banner(demo, services)  # studio-wide problems, above every page
        login = build_login(services)
        with gr.Tabs(selected="launch", elem_id="main-tabs"):
            with gr.Tab("Launch", id="launch", elem_id="page-launch") as launch_tab:
                launch = build_launch_page(services, login.token)
            with gr.Tab("Runs", id="runs", elem_id="page-runs") as runs_tab:
                runs = build_runs_page(services)
            with gr.Tab("Run", id="run", elem_id="page-run") as run_tab:
                run = build_run_page(services, login.token)
                build_chunk_panel(services, run.picker, login.token)  # chunked runs; runs them on ZeroGPU
            with gr.Tab("Playground", id="playground", elem_id="page-playground") as playground_tab:
                playground = build_playground_page(services, login.token)
            with gr.Tab("Explain", id="explain", elem_id="page-explain") as explain_tab:
                explain_picker, explain_pair = build_explain_page(services)
            with gr.Tab("Compare", id="compare", elem_id="page-compare") as compare_tab:
                compare_picker = build_compare_page(services)
            with gr.Tab("Studies", id="studies", elem_id="page-studies") as studies_tab:
                studies = build_studies_page(services, login.token)
            with gr.Tab("Export", id="export", elem_id="page-export") as export_tab:
                export_picker = build_export_page(services)
        register_api(services)
        show_status(demo, services, login)

        def open_run(run_id: int | None) -> Any:
            if run_id is None:
                return gr.skip()
            return gr.Dropdown(choices=run_choices(services.store), value=int(run_id))

        private = {"api_visibility": "private"}
        # The Run tab opens in the browser (`app.web.pages.run.page.SHOW_RUN_TAB`, when the picker changes or a run is
        # clicked): with the main tabs as an output of an event, every event of the page walked all the app's
        # components.
        for event in launch.events:
            event.then(open_run, launch.launched, run.picker, **private)
        runs.select_event.then(open_run, runs.selected, run.picker, **private)

        def compare_pair(ids: list[int] | None) -> Any:
            if not ids:
                return gr.skip()
            return gr.Dropdown(choices=run_choices(services.store), value=[int(i) for i in ids])

        launch.plan_pair_on([demo.load, launch_tab.select])  # its time estimate reads the runs finished since
        launch.pair_event.then(compare_pair, launch.pair, compare_picker, **private)
        launch.pair_event.then(compare_pair, launch.pair, explain_pair, **private)

        def clone(run_id: int | None) -> list[Any]:
            """The picked run's spec in the Launch form, through the same allow-list as the API."""
            found = services.store.get_run(int(run_id)) if run_id is not None else None
            if found is None:
                return [gr.skip()] * (len(launch.fill_outputs) - 1) + ["Pick a run on the Run page to clone it."]
            spec = {k: v for k, v in (found.get("config") or {}).items() if k not in ("resume_from_checkpoint",)}
            spec["name"] = f"{found['name']}-clone"
            return launch.load_spec(spec, "Cloned run #{} as".format(found["id"]))

        run.clone.click(clone, run.picker, launch.fill_outputs, **private).then(None, None, None, js=SHOW_LAUNCH_TAB)
        # The best grid point of a study: its first seed's spec, the study's label left out (a new run of its own).
        studies.clone.click(clone, studies.best_run, launch.fill_outputs, **private).then(
            None, None, None, js=SHOW_LAUNCH_TAB)

        def open_study(study_id: str | None) -> Any:
            if not study_id:
                return gr.skip()
            return gr.Dropdown(choices=_study_choices(services.store), value=study_id)

        launch.sweep_event.then(open_study, launch.sweep_study, studies.picker, **private)

        def choices() -> Any:
            return gr.Dropdown(choices=run_choices(services.store))

        run_tab.select(choices, None, run.picker, **private)
        compare_tab.select(choices, None, compare_picker, **private)
        studies_tab.select(lambda: gr.Dropdown(choices=_study_choices(services.store)), None, studies.picker,
                           **private)
        explain_tab.select(choices, None, explain_picker, **private)
        explain_tab.select(choices, None, explain_pair, **private)
        export_tab.select(choices, None, export_picker, **private)
        playground.refresh_on(playground_tab)
        launch_tab.select(lambda: gr.Dropdown(choices=model_choices(services)), None, launch.model, **private)
        launch_tab.select(lambda: gr.Dropdown(choices=preset_choices(services)), None, launch.preset, **private)
        runs.poll_while_open(runs_tab, [launch_tab, run_tab, compare_tab, export_tab, playground_tab, explain_tab,
                                        studies_tab])
    return demo


def launch_options() -> dict[str, Any]:
    """Keyword arguments of `demo.launch` that belong to the look (Gradio 6 takes theme and css there)."""
    return {"theme": gr.themes.Soft(), "css": CSS}


__all__ = ["Services", "build_demo", "launch_options"]
