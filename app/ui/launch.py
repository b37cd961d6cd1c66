"""Launch page: pick a model, a dataset and rewards, set hyper-parameters, validate, and start a run.

Defaults work offline: the built-in model and the arithmetic dataset are preselected, so one press of "Train"
starts a run. Every problem is shown right under the field it concerns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
import pandas as pd

from app import forms
from app.ui.common import Services, short

SOURCES = [("Built-in arithmetic (offline)", "arithmetic"), ("Hugging Face hub dataset", "hub"),
           ("Upload a file (jsonl / csv / parquet)", "file")]
ACTIONS = {"values": "Estimate V* only", "train": "Train (A*-PO)", "evaluate": "Evaluate"}
PREVIEW_ROWS = 5


@dataclass
class LaunchPage:
    """Components other pages use: the id of the run this session launched last."""

    launched: gr.State
    events: list[Any]
    model: gr.Dropdown
    inputs: dict[str, gr.components.Component] = field(default_factory=dict)


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def model_choices(services: Services) -> list[str]:
    """The built-in models first, then models used by earlier runs (most recent first)."""
    from a2po.models import DEFAULT_MODEL

    seen = dict.fromkeys([DEFAULT_MODEL])
    for run in services.store.list_runs():
        if run.get("model"):
            seen.setdefault(run["model"])
    return list(seen)


def load_dataset_preview(dataset: dict[str, Any], rows: int = PREVIEW_ROWS) -> tuple[list[str], pd.DataFrame]:
    """The raw columns of the dataset a form describes and its first rows (may raise on unreadable data).

    The rows are shown as the model will see them (prompt and ground_truth added) when the columns allow it.
    """
    from a2po import data

    if dataset["source"] == "arithmetic":
        ds = data.arithmetic_dataset(num_prompts=min(rows, dataset["num_prompts"]), operations=dataset["operations"],
                                     difficulty=dataset["difficulty"], seed=dataset["seed"], chat=False)
        columns = list(ds.column_names)
    else:
        source = dataset["name"] if dataset["source"] == "hub" else dataset["path"]
        ds = data._load_raw(source, dataset.get("split") or "train", dataset.get("config_name"))
        columns = list(ds.column_names)
        head = ds.select(range(min(rows, len(ds))))
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


def validate(form: dict[str, Any]) -> forms.FormResult:
    """Validate the form, loading the dataset's columns for hub and file datasets so column problems show too."""
    result = forms.validate_form(form, offline=offline())
    if result.spec is None or result.spec["dataset"]["source"] == "arithmetic":
        return result
    try:
        columns, _ = load_dataset_preview(result.spec["dataset"], rows=1)
    except Exception as exc:  # an unreadable dataset is a form error, shown next to its field
        key = "hub_name" if result.spec["dataset"]["source"] == "hub" else "file_path"
        return forms.FormResult(None, {key: f"Could not read this dataset: {short(str(exc), 300)}"})
    return forms.validate_form(form, columns=columns, offline=offline())


def build_launch_page(services: Services) -> LaunchPage:
    """Lay out the launch form and wire validation, preview, the command view and the three actions."""
    from a2po.rewards import REWARD_FUNCTIONS

    defaults = forms.default_form()
    reward_names = list(REWARD_FUNCTIONS)
    inputs: dict[str, gr.components.Component] = {}
    errors: dict[str, gr.Markdown] = {}

    def error_slot(key: str) -> None:
        errors[key] = gr.Markdown(visible=False, elem_classes=["field-error"], elem_id=f"error-{key}")

    def number(key: str, label: str, info: str = "", **kw: Any) -> None:
        inputs[key] = gr.Number(value=defaults[key], label=label, info=info or None, elem_id=f"field-{key}", **kw)
        error_slot(key)

    gr.Markdown("## Launch a run\nThe defaults work offline: press **Train** to fine-tune the built-in model on "
                "arithmetic prompts and watch stage 1 (V* estimation) and stage 2 (A*-PO training) live.")
    with gr.Row():
        with gr.Column(scale=3):
            with gr.Group():
                inputs["name"] = gr.Textbox(value=defaults["name"], label="Run name", elem_id="field-name")
                error_slot("name")
                inputs["model"] = gr.Dropdown(choices=model_choices(services), value=defaults["model"],
                                              allow_custom_value=True, label="Model", elem_id="field-model",
                                              info="Built-in name, hub id (org/name) or a local folder.")
                error_slot("model")
            gr.Markdown("### Dataset")
            with gr.Group():
                inputs["dataset_source"] = gr.Radio(SOURCES, value=defaults["dataset_source"], label="Source",
                                                    elem_id="field-dataset_source")
                error_slot("dataset_source")
                with gr.Row(visible=True) as arithmetic_box:
                    with gr.Column():
                        number("num_prompts", "Number of prompts", precision=0, minimum=1)
                    with gr.Column():
                        inputs["difficulty"] = gr.Slider(1, forms.MAX_DIFFICULTY, value=defaults["difficulty"],
                                                         step=1, label="Difficulty (digits)",
                                                         elem_id="field-difficulty")
                        error_slot("difficulty")
                    with gr.Column():
                        inputs["operations"] = gr.CheckboxGroup(list(forms.ARITHMETIC_OPERATIONS),
                                                                value=list(defaults["operations"]),
                                                                label="Operations", elem_id="field-operations")
                        error_slot("operations")
                    with gr.Column():
                        number("data_seed", "Data seed", precision=0)
                with gr.Row(visible=False) as hub_box:
                    with gr.Column(scale=2):
                        inputs["hub_name"] = gr.Textbox(value=defaults["hub_name"], label="Hub dataset id",
                                                        elem_id="field-hub_name")
                        error_slot("hub_name")
                    inputs["hub_config"] = gr.Textbox(value=defaults["hub_config"], label="Config")
                    inputs["hub_split"] = gr.Textbox(value=defaults["hub_split"], label="Split")
                with gr.Column(visible=False) as file_box:
                    inputs["file_path"] = gr.File(label="Data file", file_types=list(forms.DATA_SUFFIXES),
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
                number("eval_size", "Held-out eval prompts", precision=0, minimum=0)
            gr.Markdown("### Rewards")
            with gr.Group():
                for name in reward_names:
                    with gr.Row():
                        inputs[f"use_reward:{name}"] = gr.Checkbox(value=name in defaults["rewards"], label=name,
                                                                   elem_id=f"field-use-{name}")
                        inputs[f"weight_reward:{name}"] = gr.Number(value=defaults["rewards"].get(name, 1.0),
                                                                    label=f"{name} weight", minimum=0)
                error_slot("rewards")
            gr.Markdown("### Hyper-parameters")
            with gr.Row():
                for param in [p for p in forms.PARAMS if not p.advanced]:
                    with gr.Column(min_width=200):
                        _param_input(param, defaults, inputs)
                        error_slot(param.key)
            with gr.Accordion("Advanced", open=False, elem_id="advanced"):
                with gr.Row():
                    for param in [p for p in forms.PARAMS if p.advanced]:
                        with gr.Column(min_width=200):
                            _param_input(param, defaults, inputs)
                            error_slot(param.key)
            gr.Markdown("### LoRA")
            with gr.Row():
                with gr.Column(min_width=150):
                    inputs["lora"] = gr.Checkbox(value=defaults["lora"], label="Train a LoRA adapter",
                                                 elem_id="field-lora")
                with gr.Column(min_width=150):
                    inputs["lora_r"] = gr.Number(value=defaults["lora_r"], label="Rank r", precision=0,
                                                 elem_id="field-lora_r")
                    error_slot("lora_r")
                with gr.Column(min_width=150):
                    inputs["lora_alpha"] = gr.Number(value=defaults["lora_alpha"], label="Alpha",
                                                     elem_id="field-lora_alpha")
                    error_slot("lora_alpha")
        with gr.Column(scale=2):
            gr.Markdown("### Start")
            buttons = [gr.Button(ACTIONS["train"], variant="primary", elem_id="action-train"),
                       gr.Button(ACTIONS["values"], elem_id="action-values"),
                       gr.Button(ACTIONS["evaluate"], elem_id="action-evaluate")]
            error_slot(forms.FORM_ERROR)
            status = gr.Markdown(elem_id="launch-status")
            with gr.Row():
                check_btn = gr.Button("Check form", size="sm", elem_id="check-form")
                command_btn = gr.Button("Show command", size="sm", elem_id="show-command")
                preview_btn = gr.Button("Preview data", size="sm", elem_id="preview-data")
            command = gr.Code(label="Equivalent command line", language="shell", lines=3, interactive=False,
                              elem_id="command", wrap_lines=True)
            default_dataset = forms.check_dataset(defaults, {})
            preview_info = gr.Markdown("Built-in arithmetic prompts (the defaults):", elem_id="preview-info")
            preview = gr.Dataframe(value=lambda: load_dataset_preview(default_dataset)[1],
                                   label="First rows of the dataset", interactive=False, wrap=True,
                                   elem_id="preview", max_height=300)

    keys = list(inputs)
    error_keys = list(errors)
    launched = gr.State(None)

    def error_updates(result_errors: dict[str, str]) -> list[Any]:
        return [gr.Markdown(value=f"⚠ {result_errors[k]}", visible=True) if k in result_errors
                else gr.Markdown(value="", visible=False) for k in error_keys]

    def check(*values: Any) -> list[Any]:
        result = validate(_form_values(keys, values, reward_names))
        message = ("✅ The form is valid." if result.ok
                   else f"❌ {len(result.errors)} problem(s): see the marked fields.")
        return [*error_updates(result.errors), message]

    def show_command(*values: Any) -> list[Any]:
        result = validate(_form_values(keys, values, reward_names))
        text = forms.command_line(result.spec) if result.ok else "# Fix the marked fields first."
        return [*error_updates(result.errors), text]

    def show_preview(*values: Any) -> tuple[Any, ...]:
        form = _form_values(keys, values, reward_names)
        form_errors: dict[str, str] = {}
        dataset = forms.check_dataset(form, form_errors)
        if dataset is None:
            return "⚠ " + "; ".join(form_errors.values()), None
        try:
            columns, frame = load_dataset_preview(dataset)
        except Exception as exc:  # shown to the user, not raised: a bad file is an input problem
            return f"⚠ Could not read this dataset: {short(str(exc), 300)}", None
        return f"Columns: {', '.join(f'`{c}`' for c in columns)}", frame

    def start(action: str):
        def handler(*values: Any) -> list[Any]:
            form = {**_form_values(keys, values, reward_names), "action": action}
            result = validate(form)
            if not result.ok:
                return [*error_updates(result.errors), f"❌ Not started: {len(result.errors)} problem(s) "
                        "— see the marked fields.", None]
            run_id = services.jobs.submit(result.spec)
            return [*error_updates({}), f"✅ Started run #{run_id} ({ACTIONS[action]}).", run_id]
        return handler

    all_inputs = [inputs[k] for k in keys]
    errors_out = [errors[k] for k in error_keys]
    check_btn.click(check, all_inputs, [*errors_out, status], api_visibility="private")
    command_btn.click(show_command, all_inputs, [*errors_out, command], api_visibility="private")
    preview_btn.click(show_preview, all_inputs, [preview_info, preview], api_visibility="private")
    events = [button.click(start(action), all_inputs, [*errors_out, status, launched], api_visibility="private",
                           concurrency_limit=1)
              for button, action in zip(buttons, ["train", "values", "evaluate"], strict=True)]

    def toggle(source: str) -> list[Any]:
        return [gr.update(visible=source == "arithmetic"), gr.update(visible=source == "hub"),
                gr.update(visible=source == "file"), gr.update(visible=source != "arithmetic")]

    inputs["dataset_source"].change(toggle, inputs["dataset_source"], [arithmetic_box, hub_box, file_box,
                                                                       columns_box], api_visibility="private")
    return LaunchPage(launched=launched, events=events, model=inputs["model"], inputs=inputs)


def _param_input(param: forms.Param, defaults: dict[str, Any], inputs: dict[str, Any]) -> None:
    value = defaults[param.key]
    elem_id = f"field-{param.key}"
    if param.kind == "bool":
        inputs[param.key] = gr.Checkbox(value=value, label=param.label, info=param.info or None, elem_id=elem_id)
    else:
        inputs[param.key] = gr.Number(value=value, label=param.label, info=param.info or None, elem_id=elem_id,
                                      precision=0 if param.kind == "int" else None)
