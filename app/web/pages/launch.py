"""Launch page: pick a preset, a model, a dataset and rewards, set hyper-parameters, validate, and start a run.

It opens on the teaching-demo preset, which works offline: one press of "Train" starts a run. A preset fills the
form; the form still shows every value. Every problem is shown right under the field it concerns, with the
studio's limits next to the fields they bound. The form goes through the same allow-list as the API
(`app.access.allowlist.check_spec`, via `Services.launch`).
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
import pandas as pd

from a2po.data import MAX_DIFFICULTY
from a2po.names import ACTIONS
from app.access import allowlist
from app.access.gate import Refused, Services, offline
from app.studies import sweeps
from app.studies.protocols import (
    DEFAULT_PROTOCOL,
    PROTOCOL_LABELS,
    PROTOCOLS,
    StudyError,
    budget_seconds,
    parse_seeds,
    planned_steps,
    study_specs,
)
from app.web import forms, saved_presets
from app.web.common import format_duration, model_choices, short

SOURCES = [("Built-in arithmetic (offline)", "arithmetic"),
           ("Reasoning task (reasoning-gym, offline)", "reasoning-gym"),
           ("Hugging Face hub dataset", "hub"), ("Upload a file (jsonl / csv / parquet)", "file")]
METHODS = [("A*-PO (stage 1: V* from N samples, then one sample per prompt per step)", "a2po"),
           ("GRPO (G samples per prompt per step, no stage 1)", "grpo")]
ACTION_LABELS = {"train": "Train", "values": "Estimate V* only", "evaluate": "Evaluate"}  # `a2po.names.ACTIONS`
PREVIEW_ROWS = 5
PAIR_NOTE = ("**A*-PO vs GRPO** launches the form's A*-PO run and a GRPO run matched to it: the same model, prompts, "
             "held-out set, rewards, learning rate and schedule, completion length; G = N; the same prompts per "
             "optimizer step (GRPO's batch counts completions: G × the A*-PO batch). Both are evaluated on one grid. "
             "**Run seeds** (e.g. `0, 1, 2`) launch one run, or one pair, per seed as a study: Compare then shows each "
             "seed and their median.")


SWEEP_NOTE = ("One run per grid point and run seed (the seeds box above), as one study; A*-PO runs whose stage-1 "
              "settings match (everything but beta1, beta2, the learning rate, the filter, the epochs...) share one "
              "V* set, sampled once. `method: a2po, grpo` adds each point's GRPO match (the paper's protocol).")


def sweep_fields() -> list[tuple[str, str]]:
    """The settings a sweep may vary: the form's (`allowlist.PARAMS`), and the method."""
    return [("Method (a2po, grpo)", "method"), *((f"{p.label} ({p.key})", p.key) for p in allowlist.PARAMS
                                                 if p.key != "seed")]


def finished_history(services: Services) -> list[tuple[dict[str, Any], dict[str, float]]]:
    """(spec, clock) of this studio's latest finished runs: what time estimates go by."""
    store = services.store
    finished = store.list_runs(status="finished")[:200]
    clocks = store.run_clocks(r["id"] for r in finished)
    return [(r["config"], clocks[r["id"]]) for r in finished if r["id"] in clocks]


def sweep_plan_text(services: Services, specs: list[dict[str, Any]]) -> str:
    """The sweep's size and, from this studio's finished runs, an estimate of its training time."""
    seconds = sweeps.estimate_seconds(specs, finished_history(services))
    tag = specs[0]["study"]
    points = len({repr(sorted(s["study"]["point"].items())) + s.get("method", "a2po") for s in specs})
    shared = sweeps.shared_stage_one(specs)
    estimate = (f"about {format_duration(seconds)} of training one after another (stage 1 and steps, from this "
                "studio's finished runs; evaluations and loading add to it)" if seconds is not None else
                "no estimate yet: this studio has no finished run of this model and method to measure from")
    return (f"**{len(specs)} runs**: {points} grid point(s) x {tag['seeds']} seed(s); stage 1 sampled for "
            f"{shared['value_sets']} V* set(s) and read by {shared['saved_runs']} other run(s); {estimate}.")


def pair_plan_text(spec: dict[str, Any], protocol: str, seeds: Any, budget_minutes: float | None,
                   history: list[tuple[dict[str, Any], dict[str, float]]]) -> str:
    """What "A*-PO vs GRPO" would start from the A*-PO `spec`: its runs, their optimizer steps and evaluations, and
    each method's training time estimated from finished runs (`history`, as `finished_history` gives it)."""
    try:
        specs = study_specs(spec, parse_seeds(seeds), pair=True, protocol=protocol,
                            budget_seconds=budget_seconds(budget_minutes))
    except StudyError as exc:
        return f"⚠ {exc}"
    a2po, grpo = specs[0], specs[1]
    count = len(specs) // 2
    runs = f"**This pair:** {len(specs)} runs ({count} seed{'s' if count > 1 else ''} x A*-PO and GRPO), one after " \
           "another"
    if protocol == "time":
        budget = a2po["config"]["max_train_seconds"]
        return (f"{runs}, each stopped after {format_duration(budget)} of training (A*-PO's stage 1 included): about "
                f"{format_duration(budget * len(specs))} in all, plus evaluations and loading.")
    steps = planned_steps(a2po)
    if steps is None:
        return f"{runs}; their length is known once the dataset is loaded (a whole file), so no estimate yet."
    every = a2po["config"].get("eval_steps")
    held_out = (a2po.get("dataset") or {}).get("eval_size", 64)
    evaluations = (f"; {1 + steps // int(every)} evaluations of {held_out} held-out prompts each"
                   if isinstance(every, (int, float)) and every >= 1 else "")
    times = []
    for label, method_spec, extra in [("A*-PO", a2po, " (stage 1 included)"), ("GRPO", grpo, "")]:
        seconds = sweeps.estimate_seconds([method_spec], history)
        times.append(f"{label} about {format_duration(seconds)}{extra}" if seconds is not None else
                     f"{label}: no estimate yet (no finished {label} run of this model on this studio)")
    total = sweeps.estimate_seconds(specs, history) if count > 1 else None
    in_all = f" All {len(specs)} runs: about {format_duration(total)}." if total is not None else ""
    return (f"{runs}: {steps} optimizer steps each{evaluations}. Training time per seed, from this studio's finished "
            f"runs: {'; '.join(times)}; evaluations and loading add to it.{in_all}")


def preset_choices(services: Services) -> list[tuple[str, str]]:
    """The built-in presets, then those saved on this studio (`app.web.saved_presets`)."""
    from a2po.presets import PRESET_DESCRIPTIONS

    return [*((PRESET_DESCRIPTIONS[name].split(":")[0], name) for name in PRESET_DESCRIPTIONS),
            *saved_presets.choices(services.data_dir)]


def protocol_note(protocol: str) -> str:
    return f"**Protocol:** {PROTOCOLS.get(protocol, '')}"


@dataclass
class LaunchPage:
    """Components other pages use: the id of the run this session launched last, the form's inputs."""

    launched: gr.State
    events: list[Any]
    model: gr.Dropdown
    inputs: dict[str, gr.components.Component] = field(default_factory=dict)
    preset: gr.Dropdown | None = None
    # What "Clone this run" fills: `load_spec(spec, verb)` returns updates for `fill_outputs`.
    fill_outputs: list[Any] = field(default_factory=list)
    load_spec: Any = None
    # "A*-PO vs GRPO": the ids [A*-PO's, GRPO's] of the pair this session launched last, and its event.
    pair: gr.State | None = None
    pair_event: Any = None
    # `plan_pair_on(triggers)`: refresh the pair's plan (runs, steps, time per method) on these events too.
    plan_pair_on: Any = None
    # "Launch sweep": the id of the study this session launched last, and its event.
    sweep_study: gr.State | None = None
    sweep_event: Any = None


def load_dataset_preview(dataset: dict[str, Any], rows: int = PREVIEW_ROWS) -> tuple[list[str], pd.DataFrame]:
    """The raw columns of the dataset a form describes and its first rows (may raise on unreadable data).

    A hub dataset is streamed (a few rows, never a full download in the UI process). The rows are shown as the
    model will see them (prompt and ground_truth added) when the columns allow it.
    """
    from a2po import data

    if dataset["source"] == "arithmetic":
        ds = data.arithmetic_dataset(num_prompts=min(rows, dataset["num_prompts"]), operations=dataset["operations"],
                                     difficulty=dataset["difficulty"], seed=dataset["seed"], chat=False)
        columns = list(ds.column_names)
    elif dataset["source"] == "reasoning-gym":
        preview = data.preview_tasks(dataset, rows)
        return ["prompt", "ground_truth", "task"], pd.DataFrame(
            [{"task": r["task"], "prompt": short(r["prompt"], 300), "answer": short(str(r["answer"]), 80)}
             for r in preview])
    else:
        source = dataset["name"] if dataset["source"] == "hub" else dataset["path"]
        head = data.peek_dataset(source, dataset.get("split") or "train", dataset.get("config_name"), rows)
        columns = list(head.column_names)
        try:
            ds = data.normalize_prompt_dataset(head, dataset.get("prompt_column"), dataset.get("answer_column"))
        except ValueError:
            ds = head  # the form shows what is missing; preview the raw rows meanwhile
    preview = data.preview_rows(ds, rows)
    frame = pd.DataFrame([{k: short(v if isinstance(v, str) else repr(v), 200) for k, v in row.items()}
                          for row in preview])
    return columns, frame


def _form_values(keys: list[str], values: tuple[Any, ...], reward_names: list[str]) -> dict[str, Any]:
    raw = dict(zip(keys, values, strict=True))
    form = {k: v for k, v in raw.items() if not k.startswith(("use_reward:", "weight_reward:"))}
    form["rewards"] = {n: raw[f"weight_reward:{n}"] for n in reward_names if raw[f"use_reward:{n}"]}
    form["operations"] = "".join(raw.get("operations") or [])
    return form


def validate(services: Services, form: dict[str, Any]) -> forms.FormResult:
    """Validate the form, reading the first rows of hub and file datasets so column problems show too."""
    result = forms.validate_form(form, services.policy, offline=offline())
    if result.spec is None or result.spec["dataset"]["source"] not in ("file", "hub"):
        return result
    try:
        columns, _ = load_dataset_preview(result.spec["dataset"], rows=1)
    except Exception as exc:  # an unreadable dataset is a form error, shown next to its field
        key = "hub_name" if result.spec["dataset"]["source"] == "hub" else "file_path"
        return forms.FormResult(None, {key: f"Could not read this dataset: {short(str(exc), 300)}"})
    return forms.validate_form(form, services.policy, columns=columns, offline=offline())


def _task_help() -> str:
    """The reasoning-gym tasks and their settings, as the form's help text."""
    try:
        from a2po.tasks import TASKS, settings_schema
    except ImportError:
        return "reasoning-gym is not installed: `pip install 'a2po-studio[tasks]'`."
    lines = []
    for name, task in TASKS.items():
        settings = ", ".join(f"`{s['name']}` ({s['default']})" for s in settings_schema(name)) or "none"
        lines.append(f"- **{name}**: {task.description} Settings: {settings}.")
    return "\n".join(lines)


def build_launch_page(services: Services, token: gr.BrowserState | None = None) -> LaunchPage:
    """Lay out the launch form and wire presets, validation, preview, the command view and the three actions."""
    from a2po.presets import DEFAULT_PRESET, PRESET_DESCRIPTIONS

    limits = services.policy.limits
    defaults = forms.default_form()
    reward_info = reward_choices()
    reward_names = list(reward_info)
    inputs: dict[str, gr.components.Component] = {}
    errors: dict[str, gr.Markdown] = {}

    def error_slot(key: str) -> None:
        errors[key] = gr.Markdown(visible=False, elem_classes=["field-error"], elem_id=f"error-{key}")

    def number(key: str, label: str, info: str = "", **kw: Any) -> None:
        inputs[key] = gr.Number(value=defaults[key], label=label, info=info or None, elem_id=f"field-{key}", **kw)
        error_slot(key)

    gr.Markdown("## Launch a run\nThe teaching demo works offline: press **Train** to fine-tune the built-in "
                "model on arithmetic and watch stage 1 (V* estimation) and stage 2 (A*-PO training) live.")
    with gr.Row():
        with gr.Column(scale=3):
            preset = gr.Dropdown(preset_choices(services),
                                 value=DEFAULT_PRESET, label="Preset", elem_id="field-preset",
                                 info=PRESET_DESCRIPTIONS[DEFAULT_PRESET])
            with gr.Group():
                inputs["name"] = gr.Textbox(value=defaults["name"], label="Run name", elem_id="field-name",
                                            max_length=limits.max_name_length)
                error_slot("name")
                inputs["model"] = gr.Dropdown(choices=model_choices(services), value=defaults["model"],
                                              allow_custom_value=True, label="Model", elem_id="field-model",
                                              info="Built-in name, hub id (org/name) or a folder under "
                                                   f"{services.data_dir / 'models'}.")
                error_slot("model")
            gr.Markdown("### Dataset")
            with gr.Group():
                inputs["dataset_source"] = gr.Radio(SOURCES, value=defaults["dataset_source"], label="Source",
                                                    elem_id="field-dataset_source")
                error_slot("dataset_source")
                with gr.Row():
                    with gr.Column():
                        number("num_prompts", "Number of prompts", precision=0, minimum=1,
                               info=f"At most {limits.max_prompts} here.")
                    with gr.Column():
                        number("data_seed", "Data seed", precision=0)
                    with gr.Column():
                        number("eval_size", "Held-out eval prompts", precision=0, minimum=0,
                               info=f"At most {limits.max_eval_size} here.")
                with gr.Row(visible=defaults["dataset_source"] == "arithmetic") as arithmetic_box:
                    with gr.Column():
                        inputs["difficulty"] = gr.Slider(1, MAX_DIFFICULTY, value=defaults["difficulty"],
                                                         step=1, label="Difficulty (digits)",
                                                         elem_id="field-difficulty")
                        error_slot("difficulty")
                    with gr.Column():
                        inputs["operations"] = gr.CheckboxGroup(list(forms.ARITHMETIC_OPERATIONS),
                                                                value=list(defaults["operations"]),
                                                                label="Operations", elem_id="field-operations")
                        error_slot("operations")
                with gr.Column(visible=False) as task_box:
                    with gr.Row():
                        inputs["task"] = gr.Dropdown(_task_names(), value=defaults["task"], label="Task",
                                                     elem_id="field-task")
                        inputs["task_settings"] = gr.Textbox(
                            value=defaults["task_settings"], label="Settings (JSON)", elem_id="field-task_settings",
                            info='e.g. {"max_terms": 3}; or a mix: [{"task": "chain_sum", "weight": 2}, ...]')
                    inputs["answer_format"] = gr.Radio(
                        [("between <answer> tags", "tags"), ("just the number (numeric tasks)", "number")],
                        value=defaults["answer_format"], label="Answer format", elem_id="field-answer_format",
                        info="Small models rarely write the tags (SmolLM2: never on chain sums); with 'number' the "
                             "checker reads the completion's last number.")
                    error_slot("answer_format")
                    error_slot("task")
                    error_slot("task_settings")
                    with gr.Accordion("Tasks and their settings", open=False):
                        gr.Markdown(_task_help())
                with gr.Row(visible=False) as hub_box:
                    with gr.Column(scale=2):
                        inputs["hub_name"] = gr.Textbox(value=defaults["hub_name"], label="Hub dataset id",
                                                        elem_id="field-hub_name")
                        error_slot("hub_name")
                    inputs["hub_config"] = gr.Textbox(value=defaults["hub_config"], label="Config")
                    inputs["hub_split"] = gr.Textbox(value=defaults["hub_split"], label="Split")
                with gr.Column(visible=False) as file_box:
                    upload = f" (at most {limits.upload_mb:g} MB)" if limits.upload_mb else ""
                    inputs["file_path"] = gr.File(label=f"Data file{upload}", file_types=list(allowlist.DATA_SUFFIXES),
                                                  type="filepath", elem_id="field-file_path")
                    error_slot("file_path")
                with gr.Row(visible=False) as columns_box:
                    with gr.Column():
                        inputs["prompt_column"] = gr.Textbox(label="Prompt column (default: prompt)",
                                                             elem_id="field-prompt_column")
                        error_slot("prompt_column")
                    with gr.Column():
                        inputs["answer_column"] = gr.Textbox(label="Answer column (default: ground_truth)",
                                                             elem_id="field-answer_column")
                        error_slot("answer_column")
                with gr.Row():
                    with gr.Column(min_width=200, scale=1):
                        inputs["template_system_prompt"] = gr.Checkbox(
                            value=defaults["template_system_prompt"], label="Chat template's own system prompt",
                            elem_id="field-template_system_prompt",
                            info="SmolLM2's adds 16 tokens ('You are a helpful AI assistant named SmolLM, ...') "
                                 "to every prompt.")
                    with gr.Column(scale=3):
                        inputs["system_prompt"] = gr.Textbox(
                            value=defaults["system_prompt"], label="System prompt (when the box is off)",
                            elem_id="field-system_prompt", max_lines=4, placeholder="empty: an empty system message",
                            info="Put before every conversational prompt; empty keeps prompts short (the teaching "
                                 "demo's choice).")
                        error_slot("system_prompt")
            gr.Markdown("### Rewards")
            with gr.Group():
                for name in reward_names:
                    with gr.Row():
                        inputs[f"use_reward:{name}"] = gr.Checkbox(value=name in defaults["rewards"], label=name,
                                                                   info=reward_info[name] or None,
                                                                   elem_id=f"field-use-{element_id(name)}")
                        inputs[f"weight_reward:{name}"] = gr.Number(value=defaults["rewards"].get(name, 1.0),
                                                                    label=f"{name} weight", minimum=0)
                error_slot("rewards")
            with gr.Row():
                try_btn = gr.Button("Try the reward", size="sm", scale=0, min_width=160, elem_id="try-reward")
                try_verdict = gr.Markdown("Scores a few of the dataset's prompts before launching: their answer "
                                          "column (should score 1), a wrong answer (should score 0) and a sample of "
                                          "the model.", elem_id="try-verdict")
            try_table = gr.Dataframe(headers=TRY_COLUMNS, interactive=False, wrap=True, visible=False,
                                     label="Try the reward", elem_id="try-table", max_height=400,
                                     column_widths=["40%", "16%", "32%", "12%"])
            gr.Markdown("### Method")
            inputs["method"] = gr.Radio(METHODS, value=defaults["method"], label="Method", elem_id="field-method",
                                        info="The other method's settings are hidden; \"A*-PO vs GRPO\" launches "
                                             "both, matched.")
            error_slot("method")
            gr.Markdown("### Hyper-parameters")
            param_columns: dict[str, Any] = {}
            with gr.Row():
                for param in [p for p in allowlist.PARAMS if not p.advanced]:
                    with gr.Column(min_width=200, visible=defaults["method"] in param.methods) as column:
                        _param_input(param, defaults, inputs, limits)
                        error_slot(param.key)
                    param_columns[param.key] = column
            with gr.Accordion("Advanced", open=False, elem_id="advanced"):
                with gr.Row():
                    for param in [p for p in allowlist.PARAMS if p.advanced]:
                        with gr.Column(min_width=200, visible=defaults["method"] in param.methods) as column:
                            _param_input(param, defaults, inputs, limits)
                            error_slot(param.key)
                        param_columns[param.key] = column
            gr.Markdown("### LoRA")
            with gr.Row():
                with gr.Column(min_width=150):
                    inputs["lora"] = gr.Checkbox(value=defaults["lora"], label="Train a LoRA adapter",
                                                 elem_id="field-lora")
                with gr.Column(min_width=150):
                    inputs["lora_r"] = gr.Number(value=defaults["lora_r"], label="Rank r", precision=0,
                                                 elem_id="field-lora_r", info=f"At most {limits.max_lora_rank} here.")
                    error_slot("lora_r")
                with gr.Column(min_width=150):
                    inputs["lora_alpha"] = gr.Number(value=defaults["lora_alpha"], label="Alpha",
                                                     elem_id="field-lora_alpha")
                    error_slot("lora_alpha")
            gr.Markdown("### Processes")
            with gr.Row():
                with gr.Column(min_width=150):
                    inputs["num_processes"] = gr.Number(value=defaults["num_processes"], label="Processes / GPUs",
                                                        precision=0, minimum=1, elem_id="field-num_processes",
                                                        info=processes_info(services))
                    error_slot("num_processes")
        with gr.Column(scale=2):
            gr.Markdown("### Start")
            buttons = [gr.Button(ACTION_LABELS[action], variant="primary" if action == "train" else "secondary",
                                 elem_id=f"action-{action}") for action in ACTIONS]
            seeds_box = gr.Textbox(label="Run seeds (a study: one run per seed)", placeholder="e.g. 0, 1, 2 "
                                   "(empty: the form's seed)", elem_id="field-seeds")
            pair_btn = gr.Button("A*-PO vs GRPO", variant="secondary", elem_id="action-pair")
            protocol_box = gr.Radio([(label, key) for key, label in PROTOCOL_LABELS.items()], value=DEFAULT_PROTOCOL,
                                    label="A*-PO vs GRPO: protocol", elem_id="pair-protocol")
            budget_box = gr.Number(value=10, label="Training-time budget per run (minutes, stage 1 included)",
                                   minimum=0.1, visible=False, elem_id="pair-budget")
            protocol_text = gr.Markdown(protocol_note(DEFAULT_PROTOCOL), elem_id="pair-protocol-note")
            pair_plan = gr.Markdown(elem_id="pair-plan")
            gr.Markdown(PAIR_NOTE, elem_id="pair-note")
            with gr.Accordion("Sweep: the form's run over a grid of settings", open=False, elem_id="sweep-panel"):
                sweep_field = gr.Dropdown(sweep_fields(), value=None, label="Add a setting to the grid",
                                          elem_id="sweep-field")
                sweep_grid = gr.Textbox(label="Grid (one setting per line: name: value, value, ...)", lines=3,
                                        placeholder="beta2: 0.001, 0.01, 0.1\nlearning_rate: 5e-6, 1e-5, 2e-5",
                                        elem_id="sweep-grid")
                sweep_plan = gr.Markdown(SWEEP_NOTE, elem_id="sweep-plan")
                sweep_btn = gr.Button("Launch sweep", variant="secondary", elem_id="action-sweep")
            error_slot(forms.FORM_ERROR)
            status = gr.Markdown(elem_id="launch-status")
            with gr.Row():
                check_btn = gr.Button("Check form", size="sm", elem_id="check-form")
                command_btn = gr.Button("Show command", size="sm", elem_id="show-command")
                preview_btn = gr.Button("Preview data", size="sm", elem_id="preview-data")
            with gr.Row():
                save_btn = gr.Button("Save as YAML", size="sm", elem_id="save-yaml")
                load_btn = gr.UploadButton("Load YAML", file_types=[".yaml", ".yml"], size="sm", elem_id="load-yaml")
            saved = gr.File(label="Config file (python -m a2po train --config FILE)", visible=False,
                            interactive=False, elem_id="saved-yaml")
            command = gr.Code(label="Equivalent command line", language="shell", lines=3, interactive=False,
                              elem_id="command", wrap_lines=True)
            default_dataset = forms.form_to_spec(defaults)["dataset"]
            preview_info = gr.Markdown("The preset's prompts:", elem_id="preview-info")
            preview = gr.Dataframe(value=lambda: load_dataset_preview(default_dataset)[1],
                                   label="First rows of the dataset", interactive=False, wrap=True,
                                   elem_id="preview", max_height=300)
            gr.Markdown(f"**This studio's limits:** at most {limits.text()}.", elem_id="limits-info")

    keys = list(inputs)
    error_keys = list(errors)
    launched = gr.State(None)
    token = token if token is not None else gr.State(None)

    def error_updates(result_errors: dict[str, str]) -> list[Any]:
        return [gr.Markdown(value=f"⚠ {result_errors[k]}", visible=True) if k in result_errors
                else gr.Markdown(value="", visible=False) for k in error_keys]

    def check(*values: Any) -> list[Any]:
        result = validate(services, _form_values(keys, values, reward_names))
        message = ("✅ The form is valid." if result.ok
                   else f"❌ {len(result.errors)} problem(s): see the marked fields.")
        return [*error_updates(result.errors), message]

    def show_command(*values: Any) -> list[Any]:
        result = validate(services, _form_values(keys, values, reward_names))
        text = forms.command_line(result.spec) if result.ok else "# Fix the marked fields first."
        return [*error_updates(result.errors), text]

    def show_preview(*values: Any) -> tuple[Any, ...]:
        spec = forms.form_to_spec(_form_values(keys, values, reward_names))
        # The dataset as the allow-list states it (a file's path resolved), whatever the other fields hold.
        result = allowlist.check_dataset(spec["dataset"], services.policy)
        if not result.ok:
            return "⚠ " + " ".join(result.errors.values()), None
        try:
            columns, frame = load_dataset_preview(result.spec)
        except Exception as exc:  # shown to the user, not raised: a bad file is an input problem
            return f"⚠ Could not read this dataset: {short(str(exc), 300)}", None
        return f"Columns: {', '.join(f'`{c}`' for c in columns)}", frame

    def start(action: str):
        # Inputs as a set: the handler gets a dict of values, and Gradio can add the request (for the login).
        def handler(data: dict, request: gr.Request) -> list[Any]:
            values = tuple(data[inputs[k]] for k in keys)
            user_token = data[token]
            form = {**_form_values(keys, values, reward_names), "action": action}
            result = validate(services, form)
            if not result.ok:
                return [*error_updates(result.errors), f"❌ Not started: {len(result.errors)} problem(s) "
                        "— see the marked fields.", None]
            seeds = data[seeds_box]
            user = services.auth.identify(token=user_token, request=request)
            try:
                if seeds and seeds.strip():
                    ids = services.launch_seeds(result.spec, user, seeds)
                    return [*error_updates({}), f"✅ Started a study of {len(ids)} runs, one per seed: "
                            + ", ".join(f"#{i}" for i in ids) + ". The Compare page shows them with their median.",
                            ids[0]]
                run_id = services.launch(result.spec, user)
            except Refused as exc:
                return [*error_updates({}), f"❌ Not started: {exc}", None]
            return [*error_updates({}), f"✅ Started run #{run_id} ({ACTION_LABELS[action]}).", run_id]
        return handler

    def start_pair(data: dict, request: gr.Request) -> list[Any]:
        """The form's A*-PO run and its matched GRPO run (`app.access.gate.pair_specs`), through the gate."""
        values = tuple(data[inputs[k]] for k in keys)
        form = {**_form_values(keys, values, reward_names), "action": "train", "method": "a2po"}
        result = validate(services, form)
        if not result.ok:
            return [*error_updates(result.errors), f"❌ Not started: {len(result.errors)} problem(s) — see the "
                    "marked fields (the pair starts from the form's A*-PO settings).", None, None]
        protocol, minutes = data[protocol_box], data[budget_box]
        try:
            pairs = services.launch_pair(result.spec, services.auth.identify(token=data[token], request=request),
                                         protocol=protocol, budget_seconds=budget_seconds(minutes),
                                         seeds=data[seeds_box])
        except (Refused, StudyError) as exc:
            return [*error_updates({}), f"❌ Not started: {exc}", None, None]
        ids = [run_id for pair in pairs for run_id in pair]
        listed = "; ".join(f"A*-PO #{a} and GRPO #{g}" for a, g in pairs)
        seeds = f" for {len(pairs)} seeds" if len(pairs) > 1 else ""
        return [*error_updates({}), f"✅ Started A*-PO vs GRPO ({PROTOCOL_LABELS[protocol]}){seeds}: {listed}. "
                "The Compare page shows them.", pairs[0][0], ids]

    def plan_pair(data: dict) -> str:
        """The pair the form would start (`pair_plan_text`): runs, steps, evaluations, time per method."""
        values = tuple(data[inputs[k]] for k in keys)
        result = validate(services, {**_form_values(keys, values, reward_names), "action": "train", "method": "a2po"})
        if not result.ok:
            return f"⚠ Fix the form first to see the pair's plan: {len(result.errors)} problem(s) (marked)."
        return pair_plan_text(result.spec, data[protocol_box], data[seeds_box], data[budget_box],
                              finished_history(services))

    def form_spec(data: dict) -> forms.FormResult:
        values = tuple(data[inputs[k]] for k in keys)
        return validate(services, {**_form_values(keys, values, reward_names), "action": "train"})

    def plan_sweep(data: dict) -> str:
        """How many runs the grid and seeds make, and an estimate of their training time."""
        if not (data[sweep_grid] or "").strip():
            return SWEEP_NOTE
        result = form_spec(data)
        if not result.ok:
            return f"⚠ Fix the form first: {len(result.errors)} problem(s) (see the marked fields)."
        try:
            specs = sweeps.sweep_specs(result.spec, sweeps.grid_from_text(data[sweep_grid]),
                                       parse_seeds(data[seeds_box]))
        except StudyError as exc:
            return f"⚠ {exc}"
        return sweep_plan_text(services, specs)

    def start_sweep(data: dict, request: gr.Request) -> list[Any]:
        result = form_spec(data)
        if not result.ok:
            return [*error_updates(result.errors), f"❌ Not started: {len(result.errors)} problem(s) — see the "
                    "marked fields (the sweep starts from the form's run).", None, None]
        try:
            grid = sweeps.grid_from_text(data[sweep_grid])
            if not grid:
                raise StudyError("Write the grid first: one setting per line, e.g. beta2: 0.001, 0.01")
            ids = services.launch_sweep(result.spec, services.auth.identify(token=data[token], request=request),
                                        grid, data[seeds_box])
        except (Refused, StudyError) as exc:
            return [*error_updates({}), f"❌ Not started: {exc}", None, None]
        study = services.store.get_run(ids[0])["config"]["study"]["id"]
        return [*error_updates({}), f"✅ Started a sweep of {len(ids)} runs ({', '.join(f'#{i}' for i in ids)}). "
                "The Studies page shows it.", ids[0], study]

    def try_it(data: dict, request: gr.Request) -> list[Any]:
        from app.web.pages.playground import try_reward

        values = tuple(data[inputs[k]] for k in keys)
        spec = forms.form_to_spec(_form_values(keys, values, reward_names))
        try:
            result = try_reward(services, services.auth.identify(token=data[token], request=request), spec)
        except Refused as exc:
            return [f"❌ {exc}", gr.Dataframe(visible=False)]
        return [result["verdict"], gr.Dataframe(value=try_frame(result["rows"]), visible=bool(result["rows"]))]

    all_inputs = [inputs[k] for k in keys]
    errors_out = [errors[k] for k in error_keys]
    try_btn.click(try_it, {token, *all_inputs}, [try_verdict, try_table], api_visibility="private",
                  concurrency_limit=1, concurrency_id="playground")
    check_btn.click(check, all_inputs, [*errors_out, status], api_visibility="private")
    command_btn.click(show_command, all_inputs, [*errors_out, command], api_visibility="private")
    preview_btn.click(show_preview, all_inputs, [preview_info, preview], api_visibility="private")
    events = [button.click(start(action), {token, seeds_box, *all_inputs}, [*errors_out, status, launched],
                           api_visibility="private", concurrency_limit=1)
              for button, action in zip(buttons, ACTIONS, strict=True)]

    pair = gr.State(None)
    pair_event = pair_btn.click(start_pair, {token, seeds_box, protocol_box, budget_box, *all_inputs},
                                [*errors_out, status, launched, pair], api_visibility="private", concurrency_limit=1)
    protocol_box.change(lambda protocol: (gr.update(visible=protocol == "time"), protocol_note(protocol)),
                        protocol_box, [budget_box, protocol_text], api_visibility="private")
    events.append(pair_event)
    # The fields that change a pair's length; the rest are read when one of these, or the page, changes.
    lengths = ["model", "num_prompts", "eval_size", "num_train_epochs", "max_steps", "per_device_train_batch_size",
               "gradient_accumulation_steps", "num_value_samples", "eval_steps"]

    def plan_pair_on(triggers: list[Any]) -> None:
        gr.on(triggers, plan_pair, {seeds_box, protocol_box, budget_box, *all_inputs}, pair_plan,
              api_visibility="private", trigger_mode="always_last")

    plan_pair_on([protocol_box.change, seeds_box.change, budget_box.change,
                  *(inputs[k].change for k in lengths if k in inputs)])
    sweep_study = gr.State(None)
    plan_inputs = {sweep_grid, seeds_box, *all_inputs}
    sweep_grid.change(plan_sweep, plan_inputs, sweep_plan, api_visibility="private", trigger_mode="always_last")
    seeds_box.change(plan_sweep, plan_inputs, sweep_plan, api_visibility="private", trigger_mode="always_last")

    def add_field(name: str | None, grid: str, *values: Any) -> tuple[Any, Any]:
        if not name:
            return gr.skip(), gr.skip()
        current = dict(zip(keys, values, strict=True)).get(name, "")
        line = f"{name}: {'' if current is None else current}, "
        return (grid.rstrip() + "\n" + line if grid and grid.strip() else line), None

    sweep_field.input(add_field, [sweep_field, sweep_grid, *all_inputs], [sweep_grid, sweep_field],
                      api_visibility="private")
    sweep_event = sweep_btn.click(start_sweep, {token, seeds_box, sweep_grid, *all_inputs},
                                  [*errors_out, status, launched, sweep_study], api_visibility="private",
                                  concurrency_limit=1)
    param_keys = list(param_columns)

    def show_method(method: str) -> list[Any]:
        return [gr.update(visible=method in allowlist.PARAM_BY_KEY[k].methods) for k in param_keys]

    inputs["method"].change(show_method, inputs["method"], [param_columns[k] for k in param_keys],
                            api_visibility="private")
    boxes = [arithmetic_box, task_box, hub_box, file_box, columns_box]

    def toggle(source: str) -> list[Any]:
        return [gr.update(visible=source == "arithmetic"), gr.update(visible=source == "reasoning-gym"),
                gr.update(visible=source == "hub"), gr.update(visible=source == "file"),
                gr.update(visible=source in ("hub", "file"))]

    inputs["dataset_source"].change(toggle, inputs["dataset_source"], boxes, api_visibility="private")
    reward_boxes = [inputs[f"use_reward:{name}"] for name in reward_names]

    def match_rewards(source: str) -> list[Any]:
        """A task is scored by its own checker, and only by it; other sources start from exact_match again."""
        wanted = "task_checker" if source == "reasoning-gym" else "exact_match"
        return [gr.update(value=name == wanted) for name in reward_names]

    # `.input`: only a user's pick switches the rewards, not a preset, a loaded config or a clone filling the form.
    inputs["dataset_source"].input(match_rewards, inputs["dataset_source"], reward_boxes, api_visibility="private")

    def fill(values: dict[str, Any]) -> list[Any]:
        """Updates that show `values` (the form's flat fields) in every input, and the right dataset boxes."""
        updates = []
        for key in keys:
            if key.startswith("use_reward:"):
                updates.append(gr.update(value=key.split(":", 1)[1] in values["rewards"]))
            elif key.startswith("weight_reward:"):
                updates.append(gr.update(value=values["rewards"].get(key.split(":", 1)[1], 1.0)))
            elif key == "operations":
                updates.append(gr.update(value=list(values["operations"])))
            elif key == "file_path":
                updates.append(gr.update())
            else:
                updates.append(gr.update(value=values.get(key)))
        return [*updates, *toggle(values["dataset_source"])]

    def apply_preset(name: str) -> list[Any]:
        """Fill every field from the preset (the form keeps showing each value); a saved preset's spec goes through
        the allow-list first, as a cloned run's does."""
        if name and name.startswith(saved_presets.PREFIX):
            spec = saved_presets.saved(services.data_dir).get(name[len(saved_presets.PREFIX):])
            if spec is None:
                return [*(gr.update() for _ in [*all_inputs, *boxes]), gr.Dropdown(choices=preset_choices(services)),
                        "❌ That preset is gone: pick another."]
            *filled, message = load_spec(spec, "Loaded preset")
            return [*filled, gr.Dropdown(info="A preset saved on this studio."), message]
        return [*fill(forms.default_form(name)), gr.Dropdown(info=PRESET_DESCRIPTIONS[name]), gr.skip()]

    preset.input(apply_preset, preset, [*all_inputs, *boxes, preset, status], api_visibility="private")

    def save_yaml(*values: Any) -> list[Any]:
        from a2po.runspec import RunSpec

        result = validate(services, _form_values(keys, values, reward_names))
        if not result.ok:
            return [*error_updates(result.errors), "❌ Fix the marked fields first.", gr.File(visible=False)]
        spec = RunSpec.from_dict(result.spec)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in spec.name)[:60]
        path = services.exports_dir / f"config-{safe}.yaml"
        path.write_text(spec.to_yaml())
        return [*error_updates({}), f"✅ Saved {path.name}: run it with `python -m a2po train --config "
                f"{path.name}`, or load it here later.", gr.File(value=str(path), visible=True)]

    def load_yaml(file: str | None) -> list[Any]:
        """Fill the form from a YAML config, after the same allow-list as the API (a file can name anything)."""
        from a2po.cli import spec_from_config_file

        keep = [gr.update() for _ in [*all_inputs, *boxes]]
        if not file:
            return [*keep, gr.skip()]
        try:
            spec = spec_from_config_file(file).to_dict()
        except ValueError as exc:
            return [*keep, f"❌ Not loaded: {short(str(exc), 500)}"]
        return load_spec(spec, "Loaded")

    def load_spec(spec: Any, verb: str) -> list[Any]:
        """Fill the form from a run spec (a YAML file's, or a run's to clone) after the API's allow-list: a spec that
        names a refused field fills nothing and says why."""
        result = allowlist.check_spec(spec, services.policy, offline=offline())
        if not result.ok:
            return [*(gr.update() for _ in [*all_inputs, *boxes]), f"❌ Not {verb.lower()}: "
                    f"{short(result.message(), 800)}"]
        warnings = "".join(f"\n\n⚠ {html.escape(w)}" for w in result.warnings)
        return [*fill(forms.spec_to_form(result.spec)), f"✅ {verb} {html.escape(result.spec['name'])}: check the "
                                                      f"fields, then start it.{warnings}"]

    save_btn.click(save_yaml, all_inputs, [*errors_out, status, saved], api_visibility="private")
    load_btn.upload(load_yaml, load_btn, [*all_inputs, *boxes, status], api_visibility="private")
    return LaunchPage(launched=launched, events=events, model=inputs["model"], inputs=inputs, preset=preset,
                      sweep_study=sweep_study, sweep_event=sweep_event,
                      fill_outputs=[*all_inputs, *boxes, status], load_spec=load_spec, pair=pair,
                      pair_event=pair_event, plan_pair_on=plan_pair_on)


def reward_choices() -> dict[str, str]:
    """The rewards the form offers, each with its docstring's summary: the built-in ones, then those the
    operator registered (read from their source, never imported here), with their file."""
    from a2po.reward_registry import read_registry, summary
    from a2po.rewards import REWARD_FUNCTIONS

    out = {name: summary(func.__doc__) for name, func in REWARD_FUNCTIONS.items()}
    for reward in read_registry().rewards.values():
        where = os.path.basename(reward.file) if reward.file else reward.origin
        out[reward.name] = f"{reward.doc} (registered: {where})" if reward.doc else f"Registered: {where}."
    return out


def element_id(name: str) -> str:
    """A reward's name as part of an element id."""
    return re.sub(r"[^\w-]", "_", name)


TRY_COLUMNS = ["prompt", "kind", "completion", "reward"]


def try_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows of "Try the reward" as a small table."""
    return pd.DataFrame([{"prompt": short(r["prompt"], 120), "kind": r["kind"],
                          "completion": short(r["completion"], 200), "reward": f"{r['reward']:g}"} for r in rows],
                        columns=TRY_COLUMNS)


def processes_info(services: Services) -> str:
    """What the "Processes / GPUs" field does on this machine."""
    devices = getattr(services.scheduler, "devices", None)
    gpus = len(getattr(devices, "gpus", ()) or ())
    split = ("Stage 1 is split between the processes and each gets the whole V* table; the batch size is per "
             "process, so a step trains on processes × batch size prompts.")
    if gpus:
        return (f"More than 1: one process per GPU under `accelerate launch` (DDP); this machine has {gpus} "
                f"GPU(s). {split}")
    cores = getattr(devices, "cpu_processes", None) or os.cpu_count() or 1
    return (f"This machine has no GPU: more than 1 runs that many processes on its CPU (gloo, at most {cores}); "
            f"they share its cores, so this is for trying multi-process runs, not for speed. {split}")


def _task_names() -> list[str]:
    try:
        from a2po.tasks import TASKS
    except ImportError:
        return []
    return list(TASKS)


def _param_input(param: allowlist.Param, defaults: dict[str, Any], inputs: dict[str, Any], limits) -> None:
    value = defaults[param.key]
    elem_id = f"field-{param.key}"
    info = allowlist.limit_info(param, limits) or None
    if param.kind == "bool":
        inputs[param.key] = gr.Checkbox(value=value, label=param.label, info=info, elem_id=elem_id)
    elif param.kind == "choice":
        inputs[param.key] = gr.Dropdown(list(param.choices), value=value, label=param.label, info=info,
                                        elem_id=elem_id)
    else:
        inputs[param.key] = gr.Number(value=value, label=param.label, info=info, elem_id=elem_id,
                                      precision=0 if param.kind == "int" else None)


