"""Run page: one run, live while it works.

A `gr.Timer` polls every few seconds. Each session keeps in a `gr.State` what it already shows (the last metric,
sample and log ids, the value count, the run's status), asks the store only for rows newer than that, and leaves a
component untouched (`gr.skip()`) when nothing behind it changed; the training chart is redrawn only when the
run's largest metric id moved.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Any

import gradio as gr

from app import charts
from app.ui import training, values
from app.ui.common import (
    ACTIVE,
    Services,
    elapsed_and_remaining,
    format_duration,
    format_time,
    progress_bar,
    run_choices,
    status_badge,
)

POLL_SECONDS = 2.5
MAX_LOG_LINES = 300


@dataclass
class RunPage:
    picker: gr.Dropdown
    state: gr.State
    timer: gr.Timer


def new_state(run_id: int | None) -> dict[str, Any]:
    """What a session has already drawn for `run_id` (nothing yet)."""
    return {"run_id": run_id, "run_sig": None, "values_sig": None, "metric_id": 0, "series": {}, "drawn_metric": -1,
            "sample_id": 0, "samples": [], "sample_filter": None, "samples_drawn": False, "log_id": 0, "logs": [],
            "eval_id": -1, "ceilings": {}, "smoothing": None}


def stage_progress(run: dict[str, Any], num_values: int, value_set: dict[str, Any] | None) -> str:
    """Two progress bars: stage 1 (V* estimation) and stage 2 (training, or evaluation for evaluate runs)."""
    kind, stage, status = run["kind"], run.get("stage"), run["status"]
    progress = run.get("progress") or 0.0
    done = status == "finished"
    expected = _expected_prompts(run)
    if value_set is not None and value_set.get("complete"):
        s1, d1 = 1.0, f"{num_values} prompts"
    elif stage == "values":
        s1 = progress
        d1 = f"{num_values} / {expected} prompts" if expected else f"{num_values} prompts"
    elif kind == "evaluate" and not run.get("value_set_id"):
        s1, d1 = None, "not needed"
    else:
        s1 = 1.0 if (done or stage in ("train", "eval")) and num_values else (0.0 if status in ACTIVE else None)
        d1 = f"{num_values} prompts" if num_values else "waiting"
    bars = [progress_bar("Stage 1 · V* estimation", s1, d1, elem="progress-stage1")]
    if kind != "values":
        label = "Evaluation" if kind == "evaluate" else "Stage 2 · A*-PO training"
        if done:
            s2, d2 = 1.0, "done"
        elif stage in ("train", "eval"):
            s2, d2 = progress, f"stage {stage}"
        else:
            s2, d2 = (0.0, "waiting for stage 1") if status in ACTIVE else (None, "not reached")
        bars.append(progress_bar(label, s2, d2, elem="progress-stage2"))
    return "".join(bars)


def _expected_prompts(run: dict[str, Any]) -> int | None:
    dataset = (run.get("config") or {}).get("dataset") or {}
    if dataset.get("source") == "arithmetic" and dataset.get("num_prompts"):
        return int(dataset["num_prompts"])  # train prompts; the eval prompts come on top
    return None


def header(run: dict[str, Any]) -> str:
    elapsed, remaining = elapsed_and_remaining(run)
    parts = [f"### #{run['id']} {html.escape(run['name'])} {status_badge(run['status'])}",
             f"**{run['kind']}** · model `{run['model']}` · dataset `{run['dataset']}` · stage "
             f"`{run.get('stage') or '–'}` · created {format_time(run['created_at'])} · elapsed "
             f"{format_duration(elapsed)} · remaining ≈ {format_duration(remaining)}"]
    if run.get("best_eval_accuracy") is not None:
        parts.append(f"best eval accuracy **{run['best_eval_accuracy']:.1%}**")
    return "\n\n".join(parts)


def _button_updates(run: dict[str, Any] | None) -> list[Any]:
    status = run["status"] if run else None
    return [gr.Button(interactive=status in ("queued", "running")),
            gr.Button(interactive=status in ("stopped", "failed")),
            gr.Button(interactive=run is not None and status not in ("running", "stopping"))]


def refresh(services: Services, run_id: int | None, state: dict[str, Any] | None, smoothing: float, split: str,
            correct: str, text: str | None, step: str | None) -> list[Any]:
    """One poll: new rows since `state`, as updates for `RunPage` outputs (see `build_run_page`)."""
    store = services.store
    if state is None or state.get("run_id") != run_id:
        state = new_state(run_id)
    run = store.get_run(run_id) if run_id is not None else None
    skip = gr.skip()
    if run is None:
        if state.get("run_sig") == "empty":
            return [state, *[skip] * (OUTPUT_COUNT - 1)]
        state["run_sig"] = "empty"
        message = "Pick a run above, launch one, or open one from the Runs page."
        return [state, message, "", gr.Textbox(visible=False, value=""),
                *values.render([], [], "train", None, None),
                charts.empty_figure("No run selected"), None, None, "", "", *_button_updates(None), gr.skip()]
    out: dict[str, Any] = {}
    ids = store.last_ids(run_id)
    # Header, progress and error: cheap, but redrawn only when something shown there moved.
    value_set = store.get_value_set(run["value_set_id"]) if run.get("value_set_id") else None
    split = split or "train"
    num_values = store.count_values(run["value_set_id"], split) if value_set else 0
    run_sig = (run["status"], run.get("stage"), round(run.get("progress") or 0, 3), run.get("error"), num_values,
               run.get("best_eval_accuracy"), bool(value_set and value_set.get("complete")),
               int(time.time() // 5) if run["status"] in ACTIVE else 0)
    if run_sig != state["run_sig"]:
        state["run_sig"] = run_sig
        out["header"] = header(run)
        out["progress"] = stage_progress(run, num_values, value_set)
        error = run.get("error") or ""
        out["error"] = gr.Textbox(value=error, visible=bool(error))
        out["buttons"] = _button_updates(run)
        out["picker"] = gr.Dropdown(choices=run_choices(store))  # the status in the labels moves too
    # V* tabs: only when the stored values of the split changed.
    values_sig = (run.get("value_set_id"), split, num_values, bool(value_set and value_set.get("complete")),
                  run.get("best_eval_accuracy"))
    if values_sig != state["values_sig"]:
        state["values_sig"] = values_sig
        rows = store.get_values(run["value_set_id"], split) if value_set else []
        splits = store.value_splits(run["value_set_id"]) if value_set else []
        summary = ((value_set or {}).get("summary") or {}).get(split) or (value_set or {}).get("summary")
        expected = _expected_prompts(run)
        note = f" (of {expected}, still estimating)" if expected and run.get("stage") == "values" else ""
        out["values"] = values.render(rows, splits, split, summary if isinstance(summary, dict) else None,
                                      run.get("best_eval_accuracy"), note)
        state["ceilings"] = values.ceilings(rows, summary if isinstance(summary, dict) else None) if rows else {}
        state["drawn_metric"] = -1  # the eval panel draws the ceilings
    # Training curves: fetch only metric rows newer than the last one seen; redraw when the max id moved.
    if ids["metrics"] != state["metric_id"]:
        rows = store.get_metrics(run_id, after_id=state["metric_id"])
        charts.series_from_rows(rows, into=state["series"])
        state["metric_id"] = ids["metrics"]
    if state["drawn_metric"] != state["metric_id"] or state["smoothing"] != smoothing:
        state["drawn_metric"], state["smoothing"] = state["metric_id"], smoothing
        out["plot"] = charts.training_figure(state["series"], smoothing=smoothing, ceilings=state["ceilings"])
    if ids["evaluations"] != state["eval_id"]:
        state["eval_id"] = ids["evaluations"]
        out["evaluations"] = training.evaluations_frame(store.get_evaluations(run_id))
    # Samples: newest first; only rows newer than the newest shown, unless the filters changed.
    query = training.sample_query(correct, text, step)
    if query != state["sample_filter"]:
        state.update(sample_filter=query, sample_id=0, samples=[], samples_drawn=False)
    if ids["samples"] != state["sample_id"] or not state["samples_drawn"]:
        new = store.get_samples(run_id, after_id=state["sample_id"], limit=training.MAX_SAMPLES, newest_first=True,
                                **query)
        state["samples"] = (new + state["samples"])[: training.MAX_SAMPLES]
        state["sample_id"], state["samples_drawn"] = ids["samples"], True
        out["samples"] = training.samples_frame(state["samples"])
        out["samples_info"] = f"{len(state['samples'])} completions shown (newest first, at most " \
                              f"{training.MAX_SAMPLES})."
    if ids["logs"] != state["log_id"]:
        new_logs = store.get_logs(run_id, after_id=state["log_id"])
        state["logs"] = (state["logs"] + [f"{format_time(x['created_at'])} {x['level']:7} {x['message']}"
                                          for x in new_logs])[-MAX_LOG_LINES:]
        state["log_id"] = ids["logs"]
        out["logs"] = "\n".join(state["logs"])
    return [state, out.get("header", skip), out.get("progress", skip), out.get("error", skip),
            *out.get("values", [skip] * 8), out.get("plot", skip), out.get("evaluations", skip),
            out.get("samples", skip), out.get("samples_info", skip), out.get("logs", skip),
            *out.get("buttons", [skip] * 3), out.get("picker", skip)]


OUTPUT_COUNT = 1 + 3 + 8 + 2 + 2 + 1 + 3 + 1


def build_run_page(services: Services) -> RunPage:
    """The run page: picker, header, progress, stop/resume/delete, and the V*/Filtered/Training/Samples/Logs tabs."""
    with gr.Row():
        picker = gr.Dropdown(choices=run_choices(services.store), value=None, label="Run", scale=4,
                             elem_id="run-picker")
        stop_btn = gr.Button("Stop", variant="stop", size="sm", scale=0, min_width=90, elem_id="run-stop")
        resume_btn = gr.Button("Resume", size="sm", scale=0, min_width=90, elem_id="run-resume")
        delete_btn = gr.Button("Delete", size="sm", scale=0, min_width=90, elem_id="run-delete")
    head = gr.Markdown("Pick a run above, launch one, or open one from the Runs page.", elem_id="run-header")
    progress = gr.HTML(elem_id="run-progress")
    error = gr.Textbox(label="Error", lines=8, max_lines=20, visible=False, interactive=False, elem_id="run-error")
    action_msg = gr.Markdown(elem_id="run-action")
    with gr.Tabs(selected="values", elem_id="run-tabs"):
        vtab = values.build_values_tabs()
        ttab = training.build_training_tab()
        stab = training.build_samples_tab()
        with gr.Tab("Logs", id="logs", elem_id="tab-logs"):
            logs = gr.Textbox(lines=18, max_lines=18, autoscroll=True, interactive=False, show_label=False,
                              elem_id="run-logs")
    state = gr.State(None)
    timer = gr.Timer(POLL_SECONDS)

    inputs = [picker, state, ttab.smoothing, vtab.split, *stab.filters()]
    outputs = [state, head, progress, error, *vtab.outputs(), ttab.plot, ttab.evaluations, stab.table, stab.info,
               logs, stop_btn, resume_btn, delete_btn, picker]
    assert len(outputs) == OUTPUT_COUNT

    def poll(run_id, state, smoothing, split, correct, text, step):
        return refresh(services, run_id, state, smoothing, split, correct, text, step)

    def reload(run_id, _state, smoothing, split, correct, text, step):
        return refresh(services, run_id, None, smoothing, split, correct, text, step)

    common = {"api_visibility": "private", "show_progress": "hidden", "concurrency_limit": None}
    timer.tick(poll, inputs, outputs, **common)
    picker.change(reload, inputs, outputs, **common)
    vtab.split.change(reload, inputs, outputs, **common)
    ttab.smoothing.release(poll, inputs, outputs, **common)
    for component in stab.filters():
        component.change(poll, inputs, outputs, **common)

    def show_prompt(run_id: int | None, split: str, evt: gr.SelectData):
        run = services.store.get_run(run_id) if run_id is not None else None
        if run is None or not run.get("value_set_id") or not evt.row_value:
            return gr.skip(), gr.skip()
        prompt_id = str(evt.row_value[0])
        row = next((v for v in services.store.get_values(run["value_set_id"], split or "train")
                    if v["prompt_id"] == prompt_id), None)
        if row is None:
            return "Prompt not found.", None
        text = (f"**Prompt {html.escape(prompt_id)}** · V* = {row['v_star']:.4f} · {row['num_correct']} of "
                f"{len(row['rewards'])} correct{' · filtered' if row['filtered'] else ''}\n\n```\n"
                f"{row['prompt_text']}\n```")
        return text, values.completions_frame(row)

    vtab.table.select(show_prompt, [picker, vtab.split], [vtab.prompt_text, vtab.completions],
                      api_visibility="private")

    def act(action: str):
        def handler(run_id: int | None):
            if run_id is None:
                return "Pick a run first.", gr.skip()
            try:
                getattr(services.jobs, action)(run_id)
            except (ValueError, KeyError, RuntimeError) as exc:
                return f"❌ {exc}", gr.skip()
            if action == "delete":
                return f"🗑 Deleted run #{run_id}.", gr.Dropdown(choices=run_choices(services.store), value=None)
            return f"✅ {action.capitalize()} requested for run #{run_id}.", gr.Dropdown(
                choices=run_choices(services.store), value=run_id)
        return handler

    for button, action in ((stop_btn, "stop"), (resume_btn, "resume"), (delete_btn, "delete")):
        button.click(act(action), picker, [action_msg, picker], api_visibility="private")
    return RunPage(picker=picker, state=state, timer=timer)
