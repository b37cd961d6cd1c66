"""The Run page's layout and its events: the picker, the header, Stop/Resume/Delete and the tabs, laid out once
(`build_run_page`); the poller's redraws, a session's refreshes, the details on request and the actions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from app.access.gate import Services
from app.web import live
from app.web.common import run_choices
from app.web.pages import completions, training, values
from app.web.pages.run.frame import ChartOptions
from app.web.pages.run.poller import GROUPS, POLL_SECONDS, POLLER_JS, draw_group, run_version
from app.web.pages.run.session import new_state, refresh
from app.web.pages.run.views import OUTPUTS, TABS

# Opens the Run page's tab (its button's id comes from the tab's elem_id "page-run" in app.web): run in the browser,
# since a Gradio event with the main tabs as an output would make every later event walk the whole app.
SHOW_RUN_TAB = "() => { document.getElementById('page-run-button')?.click(); return []; }"


@dataclass
class RunPage:
    picker: gr.Dropdown
    state: gr.State
    timer: gr.Timer
    clone: gr.Button


def build_run_page(services: Services, token: Any = None) -> RunPage:
    """The run page: picker, header, progress, stop/resume/delete, and the V*/Filtered/Training/Samples/Logs tabs.
    `token` is the login's browser state: Stop, Resume and Delete are checked like the API's (`Services.act`)."""
    token = token if token is not None else gr.State(None)
    with gr.Row():
        picker = gr.Dropdown(choices=run_choices(services.store), value=None, label="Run", scale=4,
                             elem_id="run-picker")
        # Disabled until a run is picked (`button_updates`): there is nothing to act on yet.
        stop_btn = gr.Button("Stop", variant="stop", size="sm", scale=0, min_width=90, elem_id="run-stop",
                             interactive=False)
        resume_btn = gr.Button("Resume", size="sm", scale=0, min_width=90, elem_id="run-resume", interactive=False)
        delete_btn = gr.Button("Delete", size="sm", scale=0, min_width=90, elem_id="run-delete", interactive=False)
        clone_btn = gr.Button("Clone into the Launch form", size="sm", scale=0, min_width=140, elem_id="run-clone")
    head = gr.Markdown("Pick a run above, launch one, or open one from the Runs page.", elem_id="run-header")
    progress = gr.HTML(elem_id="run-progress")
    error = gr.Textbox(label="Error", lines=8, max_lines=20, visible=False, interactive=False, elem_id="run-error")
    action_msg = gr.Markdown(elem_id="run-action")
    with gr.Tabs(selected="values", elem_id="run-tabs"):
        vtab = values.build_values_tabs()
        ttab = training.build_training_tab()
        stab = completions.build_samples_tab()
        with gr.Tab("Logs", id="logs", elem_id="tab-logs") as logs_tab:
            logs = gr.Textbox(lines=18, max_lines=18, autoscroll=True, interactive=False, show_label=False,
                              elem_id="run-logs")
    state = gr.State(None)
    timer = gr.Timer(POLL_SECONDS, active=False)  # on while the picked run is active
    # The components the views fill (`View.outputs`) and the tabs they are on, by name.
    components = {"state": state, "timer": timer, "header": head, "progress": progress, "error": error,
                  **vtab.outputs(), "plot": ttab.plot, "evaluations": ttab.evaluations, "samples": stab.table,
                  "samples_info": stab.info, "samples_step": stab.step, "samples_latest": stab.latest,
                  "samples_split": stab.split, "logs": logs, "stop": stop_btn, "resume": resume_btn,
                  "delete": delete_btn, "picker": picker}
    tabs = {"values": vtab.values_tab, "filtered": vtab.filtered_tab, "training": ttab.tab, "samples": stab.tab,
            "logs": logs_tab}
    chart_inputs = ttab.controls()  # smoothing, x axis, log scale
    filters = [vtab.split, vtab.order, vtab.search, *stab.filters()]
    _add_redraws(services, picker, timer, components, chart_inputs, filters)
    triggers = (vtab.split.change, vtab.order.change, vtab.search.submit, ttab.smoothing.release, ttab.x_axis.change,
                ttab.log_y.change, stab.correct.change, stab.text.submit, stab.sort.change, stab.latest.input,
                stab.split.input)
    _add_refreshes(services, picker, state, components, tabs, chart_inputs, filters, triggers)
    _add_step_pick(services, picker, state, components, chart_inputs, filters, stab)
    _add_details(services, picker, vtab, ttab, stab)
    _add_actions(services, picker, token, timer, action_msg, {"stop": stop_btn, "resume": resume_btn,
                                                              "delete": delete_btn})
    return RunPage(picker=picker, state=state, timer=timer, clone=clone_btn)


def _add_redraws(services: Services, picker: gr.Dropdown, timer: gr.Timer, components: dict[str, Any],
                 chart_inputs: list[Any], filters: list[Any]) -> None:
    """The poller: the timer's event runs in the browser only (`POLLER_JS`): no Gradio event (each costs the page a
    walk over every component of the app), just a request to `run_version`; a group is redrawn by a Gradio event
    (its hidden button's click) when it moved. They are callable by clients (benchmarks/polling_cost.py simulates a
    class with them); they read only what any viewer of the page may see."""
    draw_buttons = {group: gr.Button(group, visible="hidden", elem_id=f"run-draw-{group}") for group in GROUPS}

    def drawer(group: str):
        def handler(run_id, smoothing, x_axis, log_y, *rest):
            updates = draw_group(services, group, run_id, ChartOptions.of(smoothing, x_axis, log_y), *rest)
            # One output takes the value itself: a list of one would be read as a table of one row.
            return updates[0] if len(updates) == 1 else updates
        return handler

    def version(run_id: int) -> dict[str, str]:
        """The run's versions (see `run_version`): what the page's poller asks every few seconds."""
        return run_version(services.store, run_id)

    timer.tick(None, None, None, js=POLLER_JS)
    gr.api(version, api_name="run_version", api_visibility="undocumented", concurrency_limit=None)
    # A click while the group's last draw is still running (a busy server) draws once more after it: with Gradio's
    # default for buttons the click would be dropped, and the poller, which counts the change as drawn, would leave
    # the page showing the state before it.
    draw_inputs = [picker, *chart_inputs, *filters]
    for group, button in draw_buttons.items():
        button.click(drawer(group), draw_inputs, [components[name] for name in GROUPS[group][1]],
                     api_name=f"run_draw_{group}", api_visibility="undocumented", trigger_mode="always_last",
                     show_progress="hidden", concurrency_limit=None)


def _add_refreshes(services: Services, picker: gr.Dropdown, state: gr.State, components: dict[str, Any],
                   tabs: dict[str, Any], chart_inputs: list[Any], filters: list[Any], triggers: tuple) -> None:
    """A session's own events: a run picked, a tab opened, a filter changed (`refresh`)."""
    inputs = [picker, state, *chart_inputs, *filters]
    outputs = [components[name] for name in OUTPUTS]
    # Only a change of the picker draws the page without a run. Any other event that finds no run picked was
    # triggered before the picker's new value reached it (the Run tab opening from a click on the Runs page); run
    # beside the picker's reload, it could finish last and blank the page that reload drew.
    nothing = [gr.skip()] * len(outputs)

    def update(run_id, state, smoothing, x_axis, log_y, *rest):
        if run_id is None:
            return nothing
        return refresh(services, run_id, state, ChartOptions.of(smoothing, x_axis, log_y), *rest)

    def reload(run_id, state, smoothing, x_axis, log_y, *rest):
        tab = (state or {}).get("tab", "values")
        return refresh(services, run_id, new_state(run_id, tab), ChartOptions.of(smoothing, x_axis, log_y), *rest)

    def select(tab: str):
        def handler(run_id, state, smoothing, x_axis, log_y, *rest):
            if run_id is None:  # remember the tab for the run picked next; draw nothing
                return [{**(state or new_state(None)), "tab": tab}, *nothing[1:]]
            return refresh(services, run_id, state, ChartOptions.of(smoothing, x_axis, log_y), *rest, tab=tab)
        return handler

    private = {"show_progress": "hidden", "concurrency_limit": None, "api_visibility": "private"}
    picker.change(reload, inputs, outputs, **private)
    picker.change(None, None, None, js=SHOW_RUN_TAB)  # a run picked here, launched or clicked on the Runs page
    for trigger in triggers:
        trigger(update, inputs, outputs, **private)
    for tab_id in TABS:
        tabs[tab_id].select(select(tab_id), inputs, outputs, **private)


def _add_step_pick(services: Services, picker: gr.Dropdown, state: gr.State, components: dict[str, Any],
                   chart_inputs: list[Any], filters: list[Any], stab: completions.SamplesTab) -> None:
    """The Samples tab's slider let go: that step is shown, and no longer the latest (its box unticked by the
    draw), so a live run's new steps leave it where the user put it."""
    latest = filters.index(stab.latest)

    def pick(run_id, state, smoothing, x_axis, log_y, *rest):
        if run_id is None:
            return [gr.skip()] * len(OUTPUTS)
        rest = [False if i == latest else value for i, value in enumerate(rest)]
        return refresh(services, run_id, state, ChartOptions.of(smoothing, x_axis, log_y), *rest)

    stab.step.release(pick, [picker, state, *chart_inputs, *filters], [components[name] for name in OUTPUTS],
                      show_progress="hidden", concurrency_limit=None, api_visibility="private")


def _add_details(services: Services, picker: gr.Dropdown, vtab: Any, ttab: Any,
                 stab: completions.SamplesTab) -> None:
    """The training tab's download, a prompt's reference completions (V* tab) and a prompt's completions across
    steps (Samples tab), on request."""

    def chart_data(run_id: int | None):
        """Every logged metric of the run, one row per (step, name), as the Export page writes it."""
        from app.web.pages.export import write_csv

        if run_id is None:
            return gr.File(visible=False)
        return gr.File(value=str(write_csv(services, "metrics", int(run_id))), visible=True)

    ttab.download.click(chart_data, picker, ttab.data_file, api_visibility="private")

    def show_prompt(run_id: int | None, split: str, evt: gr.SelectData):
        run = services.store.get_run(run_id) if run_id is not None else None
        if run is None or not evt.row_value:
            return gr.skip(), gr.skip()
        prompt_id = str(evt.row_value[0])
        return values.prompt_detail(services.store.get_value(run["id"], split or "train", prompt_id), prompt_id)

    vtab.table.select(show_prompt, [picker, vtab.split], [vtab.prompt_text, vtab.completions],
                      api_visibility="private")

    def prompt_history(run_id: int | None, split: str, evt: gr.SelectData):
        if run_id is None or not evt.row_value:
            return gr.skip(), gr.skip()
        prompt_id = str(evt.row_value[completions.STEP_COLUMNS.index("prompt")])
        rows = services.store.prompt_samples(int(run_id), prompt_id, split or "train")
        return completions.prompt_heading(rows, prompt_id), completions.history_frame(rows)

    stab.table.select(prompt_history, [picker, stab.split], [stab.prompt, stab.history], api_visibility="private")


def _add_actions(services: Services, picker: gr.Dropdown, token: Any, timer: gr.Timer, message: gr.Markdown,
                 buttons: dict[str, gr.Button]) -> None:
    """Stop, Resume and Delete, checked like the API's (`Services.act`: own runs, or any as admin)."""

    def act(action: str):
        def handler(run_id: int | None, token_value: str | None, request: gr.Request):
            if run_id is None:
                return "Pick a run first.", gr.skip(), gr.skip()
            user = services.auth.identify(token=token_value, request=request)
            try:
                services.act(action, run_id, user)
            except (ValueError, KeyError, RuntimeError) as exc:
                return f"❌ {exc}", gr.skip(), gr.skip()
            live.forget_run(run_id)
            if action == "delete":
                return (f"🗑 Deleted run #{run_id}.", gr.Dropdown(choices=run_choices(services.store), value=None),
                        gr.Timer(POLL_SECONDS, active=False))
            # A resumed run is queued again: poll it (the next poll also redraws its header and buttons).
            return (f"✅ {action.capitalize()} requested for run #{run_id}.",
                    gr.Dropdown(choices=run_choices(services.store), value=run_id),
                    gr.Timer(POLL_SECONDS, active=True))
        return handler

    for action, button in buttons.items():
        button.click(act(action), [picker, token], [message, picker, timer], api_visibility="private")
