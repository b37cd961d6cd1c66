"""The Launch form's sections, laid out once by `page.build_launch_page`: the run, the dataset, the rewards, the
method and its settings, and the right-hand column of actions and tools."""

from __future__ import annotations

import os
import re
from typing import Any

import gradio as gr

from a2po.data import MAX_DIFFICULTY
from a2po.names import ACTIONS
from a2po.settings import VLLM_FIELDS
from app.access import allowlist
from app.access.gate import Services
from app.studies.protocols import DEFAULT_PROTOCOL, PROTOCOL_LABELS
from app.web import forms
from app.web.common import model_choices
from app.web.pages.launch.actions import TRY_COLUMNS
from app.web.pages.launch.form import ACTION_LABELS, METHODS, SOURCES, LaunchForm, load_dataset_preview, preset_choices
from app.web.pages.launch.plans import (
    DEFAULT_BUDGET_FLOPS,
    DEFAULT_BUDGET_MINUTES,
    MATCHED,
    PAIR_NOTE,
    SWEEP_NOTE,
    batch_text,
    protocol_note,
    sweep_fields,
)


def run_section(form: LaunchForm) -> None:
    """The preset, the run's name and its model."""
    from a2po.presets import DEFAULT_PRESET, PRESET_DESCRIPTIONS

    services, inputs = form.services, form.inputs
    form.preset = gr.Dropdown(preset_choices(services), value=DEFAULT_PRESET, label="Preset", elem_id="field-preset",
                              info=PRESET_DESCRIPTIONS[DEFAULT_PRESET])
    with gr.Group():
        inputs["name"] = gr.Textbox(value=form.defaults["name"], label="Run name", elem_id="field-name",
                                    max_length=services.policy.limits.max_name_length)
        form.error_slot("name")
        inputs["model"] = gr.Dropdown(choices=model_choices(services), value=form.defaults["model"],
                                      allow_custom_value=True, label="Model", elem_id="field-model",
                                      info="Built-in name, hub id (org/name) or a folder under "
                                           f"{services.data_dir / 'models'}.")
        form.error_slot("model")


def dataset_section(form: LaunchForm) -> None:
    """The dataset: its source, size and seed, then the source's own box (`SOURCE_BOXES`), and the system prompt."""
    inputs, defaults, limits = form.inputs, form.defaults, form.services.policy.limits
    gr.Markdown("### Dataset")
    with gr.Group():
        inputs["dataset_source"] = gr.Radio(SOURCES, value=defaults["dataset_source"], label="Source",
                                            elem_id="field-dataset_source")
        form.error_slot("dataset_source")
        with gr.Row():
            with gr.Column():
                form.number("num_prompts", "Number of prompts", precision=0, minimum=1,
                            info=f"At most {limits.max_prompts} here.")
            with gr.Column():
                form.number("data_seed", "Data seed", precision=0)
            with gr.Column():
                form.number("eval_size", "Held-out eval prompts", precision=0, minimum=0,
                            info=f"At most {limits.max_eval_size} here.")
        with gr.Row(visible=defaults["dataset_source"] == "arithmetic") as arithmetic_box:
            with gr.Column():
                inputs["difficulty"] = gr.Slider(1, MAX_DIFFICULTY, value=defaults["difficulty"], step=1,
                                                 label="Difficulty (digits)", elem_id="field-difficulty")
                form.error_slot("difficulty")
            with gr.Column():
                inputs["operations"] = gr.CheckboxGroup(list(forms.ARITHMETIC_OPERATIONS),
                                                        value=list(defaults["operations"]), label="Operations",
                                                        elem_id="field-operations")
                form.error_slot("operations")
        with gr.Column(visible=False) as task_box:
            with gr.Row():
                inputs["task"] = gr.Dropdown(_task_names(), value=defaults["task"], label="Task", elem_id="field-task")
                inputs["task_settings"] = gr.Textbox(
                    value=defaults["task_settings"], label="Settings (JSON)", elem_id="field-task_settings",
                    info='e.g. {"max_terms": 3}; or a mix: [{"task": "chain_sum", "weight": 2}, ...]')
            inputs["answer_format"] = gr.Radio(
                [("between <answer> tags", "tags"), ("just the number (numeric tasks)", "number")],
                value=defaults["answer_format"], label="Answer format", elem_id="field-answer_format",
                info="Small models rarely write the tags (SmolLM2: never on chain sums); with 'number' the checker "
                     "reads the completion's last number.")
            for key in ("answer_format", "task", "task_settings"):
                form.error_slot(key)
            with gr.Accordion("Tasks and their settings", open=False):
                gr.Markdown(_task_help())
        with gr.Row(visible=False) as hub_box:
            with gr.Column(scale=2):
                inputs["hub_name"] = gr.Textbox(value=defaults["hub_name"], label="Hub dataset id",
                                                elem_id="field-hub_name")
                form.error_slot("hub_name")
            inputs["hub_config"] = gr.Textbox(value=defaults["hub_config"], label="Config")
            inputs["hub_split"] = gr.Textbox(value=defaults["hub_split"], label="Split")
        with gr.Column(visible=False) as file_box:
            upload = f" (at most {limits.upload_mb:g} MB)" if limits.upload_mb else ""
            inputs["file_path"] = gr.File(label=f"Data file{upload}", file_types=list(allowlist.DATA_SUFFIXES),
                                          type="filepath", elem_id="field-file_path")
            form.error_slot("file_path")
        with gr.Row(visible=False) as columns_box:
            with gr.Column():
                inputs["prompt_column"] = gr.Textbox(label="Prompt column (default: prompt)",
                                                     elem_id="field-prompt_column")
                form.error_slot("prompt_column")
            with gr.Column():
                inputs["answer_column"] = gr.Textbox(label="Answer column (default: ground_truth)",
                                                     elem_id="field-answer_column")
                form.error_slot("answer_column")
        _system_prompt_row(form)
    form.boxes = [arithmetic_box, task_box, hub_box, file_box, columns_box]


def _system_prompt_row(form: LaunchForm) -> None:
    with gr.Row():
        with gr.Column(min_width=200, scale=1):
            form.inputs["template_system_prompt"] = gr.Checkbox(
                value=form.defaults["template_system_prompt"], label="Chat template's own system prompt",
                elem_id="field-template_system_prompt",
                info="SmolLM2's adds 16 tokens ('You are a helpful AI assistant named SmolLM, ...') to every prompt.")
        with gr.Column(scale=3):
            form.inputs["system_prompt"] = gr.Textbox(
                value=form.defaults["system_prompt"], label="System prompt (when the box is off)",
                elem_id="field-system_prompt", max_lines=4, placeholder="empty: an empty system message",
                info="Put before every conversational prompt; empty keeps prompts short (the teaching demo's "
                     "choice).")
            form.error_slot("system_prompt")


def rewards_section(form: LaunchForm, reward_info: dict[str, str]) -> None:
    """A check box and a weight per reward (`reward_choices`), and "Try the reward"."""
    defaults = form.defaults
    gr.Markdown("### Rewards")
    with gr.Group():
        for name in form.reward_names:
            with gr.Row():
                form.inputs[f"use_reward:{name}"] = gr.Checkbox(value=name in defaults["rewards"], label=name,
                                                                info=reward_info[name] or None,
                                                                elem_id=f"field-use-{element_id(name)}")
                form.inputs[f"weight_reward:{name}"] = gr.Number(value=defaults["rewards"].get(name, 1.0),
                                                                 label=f"{name} weight", minimum=0)
        form.error_slot("rewards")
    with gr.Row():
        form.buttons["try"] = gr.Button("Try the reward", size="sm", scale=0, min_width=160, elem_id="try-reward")
        form.try_verdict = gr.Markdown("Scores a few of the dataset's prompts before launching: their answer column "
                                       "(should score 1), a wrong answer (should score 0) and a sample of the model.",
                                       elem_id="try-verdict")
    form.try_table = gr.Dataframe(headers=TRY_COLUMNS, interactive=False, wrap=True, visible=False,
                                  label="Try the reward", elem_id="try-table", max_height=400,
                                  column_widths=["40%", "16%", "32%", "12%"])


def settings_section(form: LaunchForm) -> None:
    """The method, its hyper-parameters (the advanced ones folded), LoRA and the number of processes."""
    inputs, defaults, limits = form.inputs, form.defaults, form.services.policy.limits
    gr.Markdown("### Method")
    inputs["method"] = gr.Radio(METHODS, value=defaults["method"], label="Method", elem_id="field-method",
                                info="The other method's settings are hidden; \"A*-PO vs GRPO\" launches both, "
                                     "matched.")
    form.error_slot("method")
    with gr.Column(visible=defaults["method"] == "grpo", elem_id="recipe-box") as form.recipe_box:
        inputs["recipe"] = gr.Dropdown(forms.recipe_choices(), value=defaults["recipe"], elem_id="field-recipe",
                                       label="GRPO recipe (TRL's paper index)",
                                       info="A named GRPO variant: picking one fills its settings (some under "
                                            "Advanced); a setting changed after wins.")
        form.error_slot("recipe")
        form.recipe_text = gr.Markdown(forms.recipe_note(defaults["recipe"], defaults), elem_id="recipe-note")
    gr.Markdown("### Hyper-parameters")
    with gr.Row():
        _param_columns(form, [p for p in allowlist.PARAMS if not p.advanced])
    form.batch_text = gr.Markdown(batch_text(forms.form_to_spec(defaults)), elem_id="batch-figures")
    with gr.Accordion("Advanced", open=False, elem_id="advanced"):
        with gr.Row():
            _param_columns(form, [p for p in allowlist.PARAMS if p.advanced])
    gr.Markdown("### LoRA")
    with gr.Row():
        with gr.Column(min_width=150):
            inputs["lora"] = gr.Checkbox(value=defaults["lora"], label="Train a LoRA adapter", elem_id="field-lora")
        with gr.Column(min_width=150):
            inputs["lora_r"] = gr.Number(value=defaults["lora_r"], label="Rank r", precision=0,
                                         elem_id="field-lora_r", info=f"At most {limits.max_lora_rank} here.")
            form.error_slot("lora_r")
        with gr.Column(min_width=150):
            inputs["lora_alpha"] = gr.Number(value=defaults["lora_alpha"], label="Alpha", elem_id="field-lora_alpha")
            form.error_slot("lora_alpha")
    gr.Markdown("### Processes")
    with gr.Row():
        with gr.Column(min_width=150):
            inputs["num_processes"] = gr.Number(value=defaults["num_processes"], label="Processes / GPUs",
                                                precision=0, minimum=1, elem_id="field-num_processes",
                                                info=processes_info(form.services))
            form.error_slot("num_processes")


def _param_columns(form: LaunchForm, params: list[allowlist.Param]) -> None:
    """A column per setting, shown for the methods that have it; vLLM's shown disabled, with the reason, where this
    studio cannot run vLLM."""
    vllm_off = allowlist.vllm_problem(form.services.policy)
    for param in params:
        with gr.Column(min_width=200, visible=form.defaults["method"] in param.methods) as column:
            locked = vllm_off if param.key in VLLM_FIELDS else None
            _param_input(param, form.defaults, form.inputs, form.services.policy.limits, locked)
            form.error_slot(param.key)
        form.param_columns[param.key] = column


def actions_section(form: LaunchForm) -> None:
    """The right-hand column: the actions, run seeds, "A*-PO vs GRPO", the sweep, the status and the form's tools."""
    limits = form.services.policy.limits
    gr.Markdown("### Start")
    for action in ACTIONS:
        form.buttons[action] = gr.Button(ACTION_LABELS[action], variant="primary" if action == "train" else
                                         "secondary", elem_id=f"action-{action}")
    form.seeds = gr.Textbox(label="Run seeds (a study: one run per seed)", placeholder="e.g. 0, 1, 2 (empty: the "
                            "form's seed)", elem_id="field-seeds")
    form.buttons["pair"] = gr.Button("A*-PO vs GRPO", variant="secondary", elem_id="action-pair")
    form.protocol = gr.Radio([(label, key) for key, label in PROTOCOL_LABELS.items()], value=DEFAULT_PROTOCOL,
                             label="A*-PO vs GRPO: protocol", elem_id="pair-protocol")
    form.budget = gr.Number(value=DEFAULT_BUDGET_MINUTES, label="Training-time budget per run (minutes, stage 1 "
                            "included)", minimum=0.1, visible=False, elem_id="pair-budget")
    form.flops_budget = gr.Number(value=DEFAULT_BUDGET_FLOPS, label="Compute budget per run (FLOPs, stage 1 included; "
                                  "e.g. 1e15)", minimum=0, visible=False, elem_id="pair-flops-budget")
    form.pair_recipe = gr.Dropdown(forms.recipe_choices(), value=forms.NO_RECIPE, label="A*-PO vs GRPO: GRPO's recipe",
                                   elem_id="pair-recipe", info="GRPO's side runs TRL's defaults, or a named variant "
                                                               "(settings only GRPO has: the match holds).")
    with gr.Row():
        form.pair_grpo_lr = gr.Number(None, label="GRPO's learning rate", visible=False, elem_id="pair-grpo-lr",
                                      info=MATCHED)
        form.pair_grpo_prompts = gr.Number(None, label="GRPO's prompts per step", precision=0, visible=False,
                                           elem_id="pair-grpo-prompts", info=f"{MATCHED} Its batch is G × this.")
    form.protocol_text = gr.Markdown(protocol_note(DEFAULT_PROTOCOL), elem_id="pair-protocol-note")
    form.pair_plan = gr.Markdown(elem_id="pair-plan")
    gr.Markdown(PAIR_NOTE, elem_id="pair-note")
    with gr.Accordion("Sweep: the form's run over a grid of settings", open=False, elem_id="sweep-panel"):
        form.sweep_field = gr.Dropdown(sweep_fields(), value=None, label="Add a setting to the grid",
                                       elem_id="sweep-field")
        form.sweep_grid = gr.Textbox(label="Grid (one setting per line: name: value, value, ...)", lines=3,
                                     placeholder="beta2: 0.001, 0.01, 0.1\nlearning_rate: 5e-6, 1e-5, 2e-5",
                                     elem_id="sweep-grid")
        form.sweep_halving = gr.Checkbox(False, label="Stop weak points early (successive halving)",
                                         info="Needs a budget: Advanced, compute (FLOPs) or time. The best third "
                                              "of the points go on at each rung; the others are pruned.",
                                         elem_id="sweep-halving")
        form.sweep_plan = gr.Markdown(SWEEP_NOTE, elem_id="sweep-plan")
        form.buttons["sweep"] = gr.Button("Launch sweep", variant="secondary", elem_id="action-sweep")
    form.error_slot(forms.FORM_ERROR)
    form.status = gr.Markdown(elem_id="launch-status")
    with gr.Row():
        form.buttons["check"] = gr.Button("Check form", size="sm", elem_id="check-form")
        form.buttons["command"] = gr.Button("Show command", size="sm", elem_id="show-command")
        form.buttons["preview"] = gr.Button("Preview data", size="sm", elem_id="preview-data")
    with gr.Row():
        form.buttons["save"] = gr.Button("Save as YAML", size="sm", elem_id="save-yaml")
        form.buttons["load"] = gr.UploadButton("Load YAML", file_types=[".yaml", ".yml"], size="sm",
                                               elem_id="load-yaml")
    form.saved = gr.File(label="Config file (python -m a2po train --config FILE)", visible=False, interactive=False,
                         elem_id="saved-yaml")
    form.command = gr.Code(label="Equivalent command line", language="shell", lines=3, interactive=False,
                           elem_id="command", wrap_lines=True)
    default_dataset = forms.form_to_spec(form.defaults)["dataset"]
    form.preview_info = gr.Markdown("The preset's prompts:", elem_id="preview-info")
    form.preview = gr.Dataframe(label="First rows of the dataset", interactive=False, wrap=True, elem_id="preview",
                                max_height=300)
    # Filled when a page loads (reading the dataset imports `datasets`); a page's own event, not an API endpoint.
    gr.on(None, lambda: load_dataset_preview(default_dataset)[1], None, form.preview, api_visibility="private")
    gr.Markdown(f"**This studio's limits:** at most {limits.text()}.", elem_id="limits-info")


def element_id(name: str) -> str:
    """A reward's name as part of an element id."""
    return re.sub(r"[^\w-]", "_", name)


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


def _param_input(param: allowlist.Param, defaults: dict[str, Any], inputs: dict[str, Any], limits,
                 locked: str | None = None) -> None:
    """The form's input for `param`; `locked`: why this studio refuses the setting, shown on a disabled input."""
    value = defaults[param.key]
    elem_id = f"field-{param.key}"
    info = f"Not available here: {locked}" if locked else allowlist.limit_info(param, limits) or None
    if param.kind == "bool":
        inputs[param.key] = gr.Checkbox(value=value, label=param.label, info=info, elem_id=elem_id,
                                        interactive=False if locked else None)
    elif param.kind == "choice":
        inputs[param.key] = gr.Dropdown(list(param.choices), value=value, label=param.label, info=info,
                                        elem_id=elem_id)
    elif param.kind == "band":
        inputs[param.key] = gr.Textbox(value=value, label=param.label, info=info or param.info, elem_id=elem_id,
                                       placeholder="e.g. 0.125, 0.875", interactive=False if locked else None)
    else:
        inputs[param.key] = gr.Number(value=value, label=param.label, info=info, elem_id=elem_id,
                                      precision=0 if param.kind == "int" else None,
                                      interactive=False if locked else None)
