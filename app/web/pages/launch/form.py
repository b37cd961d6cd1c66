"""The Launch form's fields and their mapping: the components the layout makes (`LaunchForm`), the form's flat
values from an event's (`LaunchForm.values`) and back (`fill`), the gate's verdict on them (`validate`), the
rewards and presets it offers and the dataset's first rows."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
import pandas as pd
from gradio.components import Component

from app.access.gate import Services
from app.web import forms, saved_presets
from app.web.common import short

SOURCES = [("Built-in arithmetic (offline)", "arithmetic"),
           ("Reasoning task (reasoning-gym, offline)", "reasoning-gym"),
           ("Hugging Face hub dataset", "hub"), ("Upload a file (jsonl / csv / parquet)", "file")]
METHODS = [("A*-PO (stage 1: V* from N samples, then one sample per prompt per step)", "a2po"),
           ("GRPO (G samples per prompt per step, no stage 1)", "grpo")]
ACTION_LABELS = {"train": "Train", "values": "Estimate V* only", "evaluate": "Evaluate"}  # `a2po.names.ACTIONS`
PREVIEW_ROWS = 5
SOURCE_BOXES = ("arithmetic", "reasoning-gym", "hub", "file", "columns")  # `LaunchForm.boxes`


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


def preset_choices(services: Services) -> list[tuple[str, str]]:
    """The built-in presets, then those saved on this studio (`app.web.saved_presets`)."""
    from a2po.presets import PRESET_DESCRIPTIONS

    return [*((PRESET_DESCRIPTIONS[name].split(":")[0], name) for name in PRESET_DESCRIPTIONS),
            *saved_presets.choices(services.data_dir)]


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


@dataclass
class LaunchForm:
    """The Launch page's components, made once by its layout (`page.build_launch_page`). Every handler (`actions`,
    `plans`) takes it, with the event's values as {component: value}, and returns its updates as
    {component: update}."""

    services: Services
    token: Any  # the session's login token (a `gr.BrowserState`; a `gr.State` where the page has no login)
    defaults: dict[str, Any]  # the values the form opens with (`forms.default_form`)
    reward_names: list[str]
    inputs: dict[str, Component] = field(default_factory=dict)  # the form's fields by key (`app.web.forms`)
    errors: dict[str, gr.Markdown] = field(default_factory=dict)  # the problem shown under each field
    param_columns: dict[str, gr.Column] = field(default_factory=dict)  # a setting's column, shown for its methods
    boxes: list[Any] = field(default_factory=list)  # the dataset's boxes, in `SOURCE_BOXES` order
    buttons: dict[str, Any] = field(default_factory=dict)  # an action's, "pair", "sweep", "check", "save", ...
    # The sections' other components.
    preset: Any = None
    status: Any = None
    seeds: Any = None
    protocol: Any = None
    budget: Any = None
    flops_budget: Any = None
    protocol_text: Any = None
    pair_recipe: Any = None  # the GRPO side's recipe in "A*-PO vs GRPO"
    pair_grpo_lr: Any = None  # GRPO's own learning rate and prompts per step under equal time or compute
    pair_grpo_prompts: Any = None
    recipe_box: Any = None  # the GRPO recipe's choice and note, shown for GRPO runs
    recipe_text: Any = None
    pair_plan: Any = None
    batch_text: Any = None  # prompts, completions and generations per step (`a2po.batches`), by the batch settings
    sweep_field: Any = None
    sweep_grid: Any = None
    sweep_halving: Any = None
    sweep_plan: Any = None
    try_verdict: Any = None
    try_table: Any = None
    command: Any = None
    preview_info: Any = None
    preview: Any = None
    saved: Any = None
    # Per session: the run launched last, the pair launched last ([A*-PO's, GRPO's, ...]), the sweep's study.
    launched: gr.State = field(default_factory=lambda: gr.State(None))
    pair: gr.State = field(default_factory=lambda: gr.State(None))
    sweep_study: gr.State = field(default_factory=lambda: gr.State(None))

    @property
    def fields(self) -> list[Component]:
        return list(self.inputs.values())

    @property
    def pair_controls(self) -> list[Any]:
        """What "A*-PO vs GRPO" reads besides the form's fields and seeds."""
        return [self.protocol, self.budget, self.flops_budget, self.pair_recipe, self.pair_grpo_lr,
                self.pair_grpo_prompts]

    def error_slot(self, key: str) -> None:
        self.errors[key] = gr.Markdown(visible=False, elem_classes=["field-error"], elem_id=f"error-{key}")

    def number(self, key: str, label: str, info: str = "", **kw: Any) -> None:
        self.inputs[key] = gr.Number(value=self.defaults[key], label=label, info=info or None,
                                     elem_id=f"field-{key}", **kw)
        self.error_slot(key)

    def values(self, data: dict[Any, Any], **extra: Any) -> dict[str, Any]:
        """The form's flat fields (`app.web.forms`) from an event's values, with `extra` fields set."""
        raw = {key: data[component] for key, component in self.inputs.items()}
        form = {k: v for k, v in raw.items() if not k.startswith(("use_reward:", "weight_reward:"))}
        form["rewards"] = {n: raw[f"weight_reward:{n}"] for n in self.reward_names if raw[f"use_reward:{n}"]}
        form["operations"] = "".join(raw.get("operations") or [])
        return {**form, **extra}


def validate(services: Services, form: dict[str, Any]) -> forms.FormResult:
    """The gate's verdict on the form (asked once: "Train" queues the run it checked), reading the first row of a
    hub or file dataset so column problems show too."""
    result = services.check(forms.form_to_spec(form))
    source = result.spec["dataset"]["source"] if result.ok else None
    if source not in ("file", "hub"):
        return forms.form_result(result)
    try:
        columns, _ = load_dataset_preview(result.spec["dataset"], rows=1)
    except Exception as exc:  # an unreadable dataset is a form error, shown next to its field
        key = "hub_name" if source == "hub" else "file_path"
        return forms.FormResult(None, {key: f"Could not read this dataset: {short(str(exc), 300)}"})
    return forms.form_result(result, columns)


def error_updates(form: LaunchForm, problems: Mapping[str, str]) -> dict[Any, Any]:
    """Every field's problem slot: shown with its problem, else hidden."""
    return {slot: gr.Markdown(value=f"⚠ {problems[key]}", visible=True) if key in problems
            else gr.Markdown(value="", visible=False) for key, slot in form.errors.items()}


def show_source(form: LaunchForm, source: str) -> dict[Any, Any]:
    """The boxes of the chosen dataset source (hub and file datasets share the columns box)."""
    shown = {source, "columns"} if source in ("hub", "file") else {source}
    return {box: gr.update(visible=name in shown) for name, box in zip(SOURCE_BOXES, form.boxes, strict=True)}


def fill(form: LaunchForm, values: dict[str, Any]) -> dict[Any, Any]:
    """Updates that show `values` (the form's flat fields) in every input, and the right dataset boxes."""
    updates: dict[Any, Any] = {}
    for key, component in form.inputs.items():
        if key.startswith("use_reward:"):
            updates[component] = gr.update(value=key.split(":", 1)[1] in values["rewards"])
        elif key.startswith("weight_reward:"):
            updates[component] = gr.update(value=values["rewards"].get(key.split(":", 1)[1], 1.0))
        elif key == "operations":
            updates[component] = gr.update(value=list(values["operations"]))
        elif key == "file_path":
            updates[component] = gr.update()
        else:
            updates[component] = gr.update(value=values.get(key))
    return {**updates, **show_source(form, values["dataset_source"])}
