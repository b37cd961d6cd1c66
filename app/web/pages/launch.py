"""Launch page: pick a preset, a model, a dataset and rewards, set hyper-parameters, validate, and start a run.

It opens on the teaching-demo preset, which works offline: one press of "Train" starts a run. A preset fills the
form; the form still shows every value. Every problem is shown right under the field it concerns, with the
studio's limits next to the fields they bound. The form goes through the same allow-list as the API
(`app.access.allowlist.check_spec`, via `Services.launch_run`).

The layout is a few sections that fill one `LaunchForm` (the page's components); the handlers are functions of it
and of an event's values, returning {component: update} (one output: its value), so tests call them without a browser
(tests/web/test_launch_page.py).
"""

from __future__ import annotations

import functools
import html
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
import pandas as pd
from gradio.components import Component

from a2po.batches import spec_batch_figures
from a2po.compute import format_flops
from a2po.data import MAX_DIFFICULTY
from a2po.names import ACTIONS
from a2po.settings import VLLM_FIELDS
from app.access import allowlist
from app.access.gate import Refused, Services, offline
from app.studies import sweeps
from app.studies.protocols import (
    DEFAULT_PROTOCOL,
    PROTOCOL_LABELS,
    PROTOCOLS,
    StudyError,
    budget_flops,
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
                   history: list[tuple[dict[str, Any], dict[str, float]]], grpo_recipe: str | None = None,
                   flops: float | None = None) -> str:
    """What "A*-PO vs GRPO" would start from the A*-PO `spec`: its runs, their optimizer steps and evaluations, and
    each method's training time estimated from finished runs (`history`, as `finished_history` gives it); the GRPO
    side's recipe (`grpo_recipe`) first, when it has one."""
    try:
        specs = study_specs(spec, parse_seeds(seeds), pair=True, protocol=protocol,
                            budget_seconds=budget_seconds(budget_minutes), grpo_recipe=grpo_recipe,
                            budget_flops=budget_flops(flops))
    except StudyError as exc:
        return f"⚠ {exc}"
    per_step = pair_batch_text(specs[0], specs[1])
    if grpo_recipe:
        note = forms.recipe_note(specs[1]["recipe"], {**specs[1]["config"], "rewards": specs[1]["rewards"]})
        return (f"{note.replace('**Recipe:**', '**GRPO side:**', 1)}\n\n{_pair_runs_text(specs, protocol, history)}"
                f"\n\n{per_step}")
    return f"{_pair_runs_text(specs, protocol, history)}\n\n{per_step}"


def pair_batch_text(a2po: dict[str, Any], grpo: dict[str, Any]) -> str:
    """Each side's optimizer step (`a2po.batches`): the same prompts, one completion each against G."""
    return (f"**Per optimizer step:** A*-PO {spec_batch_figures(a2po).text()}; GRPO "
            f"{spec_batch_figures(grpo).text()}.")


def _pair_runs_text(specs: list[dict[str, Any]], protocol: str,
                    history: list[tuple[dict[str, Any], dict[str, float]]]) -> str:
    """The runs of a pair study (`study_specs`), their steps, evaluations and estimated training times."""
    a2po, grpo = specs[0], specs[1]
    count = len(specs) // 2
    runs = f"**This pair:** {len(specs)} runs ({count} seed{'s' if count > 1 else ''} x A*-PO and GRPO), one after " \
           "another"
    if protocol == "time":
        budget = a2po["config"]["max_train_seconds"]
        return (f"{runs}, each stopped after {format_duration(budget)} of training (A*-PO's stage 1 included): about "
                f"{format_duration(budget * len(specs))} in all, plus evaluations and loading.")
    if protocol == "compute":
        return (f"{runs}, each stopped once it has computed {format_flops(a2po['config']['max_train_flops'])} "
                "(A*-PO's stage 1 included; FLOPs counted from the tokens each run processes, docs/compute.md), "
                "whatever the machine or its load.")
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
    form: LaunchForm | None = None  # the page's components, which its handlers take


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


SOURCE_BOXES = ("arithmetic", "reasoning-gym", "hub", "file", "columns")  # `LaunchForm.boxes`


@dataclass
class LaunchForm:
    """The Launch page's components, made once by its layout (`build_launch_page`). Every handler below takes it,
    with the event's values as {component: value}, and returns its updates as {component: update}."""

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

# ---------------------------------------------------------------------------------------------------------- handlers

def error_updates(form: LaunchForm, problems: Mapping[str, str]) -> dict[Any, Any]:
    """Every field's problem slot: shown with its problem, else hidden."""
    return {slot: gr.Markdown(value=f"⚠ {problems[key]}", visible=True) if key in problems
            else gr.Markdown(value="", visible=False) for key, slot in form.errors.items()}


def check(form: LaunchForm, data: dict[Any, Any]) -> dict[Any, Any]:
    """"Check form": every problem under its field, and a verdict."""
    result = validate(form.services, form.values(data))
    message = "✅ The form is valid." if result.ok else f"❌ {len(result.errors)} problem(s): see the marked fields."
    return {**error_updates(form, result.errors), form.status: message}


def show_command(form: LaunchForm, data: dict[Any, Any]) -> dict[Any, Any]:
    """"Show command": the `python -m a2po` line that runs the form's spec."""
    result = validate(form.services, form.values(data))
    text = forms.command_line(result.spec) if result.ok else "# Fix the marked fields first."
    return {**error_updates(form, result.errors), form.command: text}


def show_preview(form: LaunchForm, data: dict[Any, Any]) -> dict[Any, Any]:
    """"Preview data": the dataset's columns and first rows, whatever the other fields hold."""
    spec = forms.form_to_spec(form.values(data))
    # The dataset as the allow-list states it (a file's path resolved).
    result = allowlist.check_dataset(spec["dataset"], form.services.policy)
    if not result.ok:
        return {form.preview_info: "⚠ " + " ".join(result.errors.values()), form.preview: None}
    try:
        columns, frame = load_dataset_preview(result.spec)
    except Exception as exc:  # shown to the user, not raised: a bad file is an input problem
        return {form.preview_info: f"⚠ Could not read this dataset: {short(str(exc), 300)}", form.preview: None}
    return {form.preview_info: f"Columns: {', '.join(f'`{c}`' for c in columns)}", form.preview: frame}


def _user(form: LaunchForm, data: dict[Any, Any], request: gr.Request | None) -> Any:
    return form.services.auth.identify(token=data[form.token], request=request)


def start(form: LaunchForm, action: str, data: dict[Any, Any], request: gr.Request | None) -> dict[Any, Any]:
    """"Train", "Estimate V* only", "Evaluate": the form's run, or one per run seed as a study."""
    result = validate(form.services, form.values(data, action=action))
    if not result.ok:
        return {**error_updates(form, result.errors), form.launched: None,
                form.status: f"❌ Not started: {len(result.errors)} problem(s) — see the marked fields."}
    seeds, user = data[form.seeds], _user(form, data, request)
    try:
        if seeds and seeds.strip():
            ids = form.services.launch_seeds(result.spec, user, seeds)
            return {**error_updates(form, {}), form.launched: ids[0],
                    form.status: f"✅ Started a study of {len(ids)} runs, one per seed: "
                                 + ", ".join(f"#{i}" for i in ids) + ". The Compare page shows them with their median."}
        run_id, _ = form.services.launch_run(result.checked, user)
    except Refused as exc:
        return {**error_updates(form, {}), form.status: f"❌ Not started: {exc}", form.launched: None}
    return {**error_updates(form, {}), form.status: f"✅ Started run #{run_id} ({ACTION_LABELS[action]}).",
            form.launched: run_id}


def start_pair(form: LaunchForm, data: dict[Any, Any], request: gr.Request | None) -> dict[Any, Any]:
    """"A*-PO vs GRPO": the form's A*-PO run and its matched GRPO run (`app.access.gate.pair_specs`)."""
    result = validate(form.services, form.values(data, action="train", method="a2po"))
    if not result.ok:
        return {**error_updates(form, result.errors), form.launched: None, form.pair: None,
                form.status: f"❌ Not started: {len(result.errors)} problem(s) — see the marked fields (the pair "
                             "starts from the form's A*-PO settings)."}
    protocol = data[form.protocol]
    try:
        pairs = form.services.launch_pair(result.spec, _user(form, data, request), protocol=protocol,
                                          budget_seconds=budget_seconds(data[form.budget]), seeds=data[form.seeds],
                                          grpo_recipe=pair_recipe(form, data),
                                          budget_flops=budget_flops(data[form.flops_budget]))
    except (Refused, StudyError) as exc:
        return {**error_updates(form, {}), form.status: f"❌ Not started: {exc}", form.launched: None,
                form.pair: None}
    recipe = pair_recipe(form, data)
    listed = "; ".join(f"A*-PO #{a} and GRPO #{g}{f' ({recipe})' if recipe else ''}" for a, g in pairs)
    seeds = f" for {len(pairs)} seeds" if len(pairs) > 1 else ""
    return {**error_updates(form, {}), form.launched: pairs[0][0], form.pair: [i for pair in pairs for i in pair],
            form.status: f"✅ Started A*-PO vs GRPO ({PROTOCOL_LABELS[protocol]}){seeds}: {listed}. The Compare page "
                         "shows them."}


def plan_pair(form: LaunchForm, data: dict[Any, Any]) -> str:
    """The pair the form would start (`pair_plan_text`): runs, steps, evaluations, time per method."""
    result = validate(form.services, form.values(data, action="train", method="a2po"))
    if not result.ok:
        return f"⚠ Fix the form first to see the pair's plan: {len(result.errors)} problem(s) (marked)."
    return pair_plan_text(result.spec, data[form.protocol], data[form.seeds], data[form.budget],
                          finished_history(form.services), grpo_recipe=pair_recipe(form, data),
                          flops=data[form.flops_budget])


def batch_text(spec: dict[str, Any]) -> str:
    """What one optimizer step of the form's run trains on (`a2po.batches`), under the batch settings."""
    figures = spec_batch_figures(spec)
    if figures is None:
        return "**Per optimizer step:** set the batch size, accumulation steps and G to whole numbers to see it."
    note = " (GRPO's batch size counts completions, as TRL's)" if figures.method == "grpo" else ""
    return f"**Per optimizer step:** {figures.text()}{note}."


def show_batch(form: LaunchForm, data: dict[Any, Any]) -> str:
    """`batch_text` of the form's values, as they are (unchecked)."""
    return batch_text(forms.form_to_spec(form.values(data)))


def pair_recipe(form: LaunchForm, data: dict[Any, Any]) -> str | None:
    """The GRPO side's recipe chosen for "A*-PO vs GRPO" (None: TRL's GRPOConfig defaults)."""
    name = data.get(form.pair_recipe)
    return None if name in (None, "", forms.NO_RECIPE) else name


def show_protocol(form: LaunchForm, protocol: str) -> dict[Any, Any]:
    """The protocol's note; the time budget only for equal time, the FLOPs budget only for equal compute."""
    return {form.budget: gr.update(visible=protocol == "time"),
            form.flops_budget: gr.update(visible=protocol == "compute"), form.protocol_text: protocol_note(protocol)}


def plan_sweep(form: LaunchForm, data: dict[Any, Any]) -> str:
    """How many runs the grid and seeds make, and an estimate of their training time."""
    if not (data[form.sweep_grid] or "").strip():
        return SWEEP_NOTE
    result = validate(form.services, form.values(data, action="train"))
    if not result.ok:
        return f"⚠ Fix the form first: {len(result.errors)} problem(s) (see the marked fields)."
    halving = sweeps.parse_halving(True) if data.get(form.sweep_halving) else None
    try:
        seeds = parse_seeds(data[form.seeds])
        specs = sweeps.sweep_specs(result.spec, sweeps.grid_from_text(data[form.sweep_grid]), seeds, halving=halving)
    except StudyError as exc:
        return f"⚠ {exc}"
    if halving is None:
        return sweep_plan_text(form.services, specs)
    shares = ", ".join(f"{halving.share(r):.3g}" for r in range(halving.rungs))
    return (f"**Halving:** {len(specs)} points at rung 0 with the first seed; the best 1/{halving.reduction_factor} "
            f"go on at each rung, on {shares} of the budget's training part; the last rung with every seed: at most "
            f"{halving.max_runs(len(specs), len(seeds) or 1)} runs. The studio launches each rung when the one "
            "before has ended (docs/studies.md).")


def start_sweep(form: LaunchForm, data: dict[Any, Any], request: gr.Request | None) -> dict[Any, Any]:
    """"Launch sweep": the form's run over the grid and run seeds, as one study."""
    result = validate(form.services, form.values(data, action="train"))
    if not result.ok:
        return {**error_updates(form, result.errors), form.launched: None, form.sweep_study: None,
                form.status: f"❌ Not started: {len(result.errors)} problem(s) — see the marked fields (the sweep "
                             "starts from the form's run)."}
    try:
        grid = sweeps.grid_from_text(data[form.sweep_grid])
        if not grid:
            raise StudyError("Write the grid first: one setting per line, e.g. beta2: 0.001, 0.01")
        ids = form.services.launch_sweep(result.spec, _user(form, data, request), grid, data[form.seeds],
                                         halving=bool(data.get(form.sweep_halving)))
    except (Refused, StudyError) as exc:
        return {**error_updates(form, {}), form.status: f"❌ Not started: {exc}", form.launched: None,
                form.sweep_study: None}
    study = form.services.store.get_run(ids[0])["config"]["study"]["id"]
    return {**error_updates(form, {}), form.launched: ids[0], form.sweep_study: study,
            form.status: f"✅ Started a sweep of {len(ids)} runs ({', '.join(f'#{i}' for i in ids)}). The Studies "
                         "page shows it."}


def add_sweep_field(form: LaunchForm, data: dict[Any, Any]) -> dict[Any, Any]:
    """A grid line for the picked setting, starting from its value on the form."""
    name, grid = data[form.sweep_field], data[form.sweep_grid]
    if not name:
        return {form.sweep_grid: gr.skip(), form.sweep_field: gr.skip()}
    current = data[form.inputs[name]] if name in form.inputs else ""
    line = f"{name}: {'' if current is None else current}, "
    return {form.sweep_grid: grid.rstrip() + "\n" + line if grid and grid.strip() else line, form.sweep_field: None}


def try_it(form: LaunchForm, data: dict[Any, Any], request: gr.Request | None) -> dict[Any, Any]:
    """"Try the reward" on a few of the dataset's prompts (`app.web.pages.playground.try_reward`)."""
    from app.web.pages.playground import try_reward

    spec = forms.form_to_spec(form.values(data))
    try:
        result = try_reward(form.services, _user(form, data, request), spec)
    except Refused as exc:
        return {form.try_verdict: f"❌ {exc}", form.try_table: gr.Dataframe(visible=False)}
    return {form.try_verdict: result["verdict"],
            form.try_table: gr.Dataframe(value=try_frame(result["rows"]), visible=bool(result["rows"]))}


def show_method(form: LaunchForm, method: str) -> dict[Any, Any]:
    """The settings of the chosen method; the other method's hidden (and the recipe, GRPO's)."""
    return {**{column: gr.update(visible=method in allowlist.PARAM_BY_KEY[key].methods)
               for key, column in form.param_columns.items()}, form.recipe_box: gr.update(visible=method == "grpo")}


def pick_recipe(form: LaunchForm, data: dict[Any, Any]) -> dict[Any, Any]:
    """A recipe picked: its settings in their fields, TRL's GRPOConfig defaults in those of the settings it leaves
    (so nothing of the last recipe stays)."""
    values = forms.recipe_values(data[form.inputs["recipe"]])
    return {form.inputs[k]: gr.update(value=v) for k, v in values.items() if k in form.inputs}


def show_recipe(form: LaunchForm, data: dict[Any, Any]) -> str:
    """The recipe's note: what it sets, what it leaves out, and which of its settings act only off-policy, so
    change nothing with the form's num_iterations (or, GDPO's, with one reward)."""
    return forms.recipe_note(data[form.inputs["recipe"]], form.values(data))


def show_source(form: LaunchForm, source: str) -> dict[Any, Any]:
    """The boxes of the chosen dataset source (hub and file datasets share the columns box)."""
    shown = {source, "columns"} if source in ("hub", "file") else {source}
    return {box: gr.update(visible=name in shown) for name, box in zip(SOURCE_BOXES, form.boxes, strict=True)}


def match_rewards(form: LaunchForm, source: str) -> dict[Any, Any]:
    """A task is scored by its own checker, and only by it; other sources start from exact_match again."""
    wanted = "task_checker" if source == "reasoning-gym" else "exact_match"
    return {form.inputs[f"use_reward:{name}"]: gr.update(value=name == wanted) for name in form.reward_names}


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


def apply_preset(form: LaunchForm, name: str) -> dict[Any, Any]:
    """Fill every field from the preset (the form keeps showing each value); a saved preset's spec goes through the
    allow-list first, as a cloned run's does."""
    from a2po.presets import PRESET_DESCRIPTIONS

    if name and name.startswith(saved_presets.PREFIX):
        spec = saved_presets.saved(form.services.data_dir).get(name[len(saved_presets.PREFIX):])
        if spec is None:
            return {form.preset: gr.Dropdown(choices=preset_choices(form.services)),
                    form.status: "❌ That preset is gone: pick another."}
        return {**load_spec(form, spec, "Loaded preset"), form.preset: gr.Dropdown(info="A preset saved on this "
                                                                                         "studio.")}
    return {**fill(form, forms.default_form(name)), form.preset: gr.Dropdown(info=PRESET_DESCRIPTIONS[name])}


def save_yaml(form: LaunchForm, data: dict[Any, Any]) -> dict[Any, Any]:
    """"Save as YAML": the form's spec as a config file for `python -m a2po train --config`."""
    from a2po.runspec import RunSpec

    result = validate(form.services, form.values(data))
    if not result.ok:
        return {**error_updates(form, result.errors), form.status: "❌ Fix the marked fields first.",
                form.saved: gr.File(visible=False)}
    spec = RunSpec.from_dict(result.spec)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in spec.name)[:60]
    path = form.services.exports_dir / f"config-{safe}.yaml"
    path.write_text(spec.to_yaml())
    return {**error_updates(form, {}), form.saved: gr.File(value=str(path), visible=True),
            form.status: f"✅ Saved {path.name}: run it with `python -m a2po train --config {path.name}`, or load it "
                         "here later."}


def load_yaml(form: LaunchForm, file: str | None) -> dict[Any, Any]:
    """"Load YAML": fill the form from a config file, after the same allow-list as the API (a file can name
    anything)."""
    from a2po.cli import spec_from_config_file

    if not file:
        return {form.status: gr.skip()}
    try:
        spec = spec_from_config_file(file).to_dict()
    except ValueError as exc:
        return {form.status: f"❌ Not loaded: {short(str(exc), 500)}"}
    return load_spec(form, spec, "Loaded")


def load_spec(form: LaunchForm, spec: Any, verb: str) -> dict[Any, Any]:
    """Fill the form from a run spec (a YAML file's, a saved preset's, a run's to clone) after the API's allow-list:
    a spec that names a refused field fills nothing and says why."""
    result = allowlist.check_spec(spec, form.services.policy, offline=offline())
    if not result.ok:
        return {form.status: f"❌ Not {verb.lower()}: {short(result.message(), 800)}"}
    warnings = "".join(f"\n\n⚠ {html.escape(w)}" for w in result.warnings)
    return {**fill(form, forms.spec_to_form(result.spec)),
            form.status: f"✅ {verb} {html.escape(result.spec['name'])}: check the fields, then start it.{warnings}"}


# ---------------------------------------------------------------------------------------------------------- layout

def build_launch_page(services: Services, token: gr.BrowserState | None = None) -> LaunchPage:
    """Lay out the launch form and wire presets, validation, preview, the command view and the three actions."""
    reward_info = reward_choices()
    form = LaunchForm(services=services, token=token if token is not None else gr.State(None),
                      defaults=forms.default_form(), reward_names=list(reward_info))
    gr.Markdown("## Launch a run\nThe teaching demo works offline: press **Train** to fine-tune the built-in "
                "model on arithmetic and watch stage 1 (V* estimation) and stage 2 (A*-PO training) live.")
    with gr.Row():
        with gr.Column(scale=3):
            _run_section(form)
            _dataset_section(form)
            _rewards_section(form, reward_info)
            _settings_section(form)
        with gr.Column(scale=2):
            _actions_section(form)
    starts, pair_event, sweep_event = _wire_actions(form)
    _wire_form(form)
    return LaunchPage(launched=form.launched, events=starts, model=form.inputs["model"], inputs=form.inputs,
                      preset=form.preset, sweep_study=form.sweep_study, sweep_event=sweep_event,
                      fill_outputs=[*form.fields, *form.boxes, form.status],
                      load_spec=functools.partial(load_spec, form), pair=form.pair, pair_event=pair_event,
                      plan_pair_on=functools.partial(plan_pair_on, form), form=form)


def _run_section(form: LaunchForm) -> None:
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


def _dataset_section(form: LaunchForm) -> None:
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


def _rewards_section(form: LaunchForm, reward_info: dict[str, str]) -> None:
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


def _settings_section(form: LaunchForm) -> None:
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


def _actions_section(form: LaunchForm) -> None:
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
    form.budget = gr.Number(value=10, label="Training-time budget per run (minutes, stage 1 included)", minimum=0.1,
                            visible=False, elem_id="pair-budget")
    form.flops_budget = gr.Number(value=1e15, label="Compute budget per run (FLOPs, stage 1 included; e.g. 1e15)",
                                  minimum=0, visible=False, elem_id="pair-flops-budget")
    form.pair_recipe = gr.Dropdown(forms.recipe_choices(), value=forms.NO_RECIPE, label="A*-PO vs GRPO: GRPO's recipe",
                                   elem_id="pair-recipe", info="GRPO's side runs TRL's defaults, or a named variant "
                                                               "(settings only GRPO has: the match holds).")
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


# ---------------------------------------------------------------------------------------------------------- wiring

PRIVATE = {"api_visibility": "private"}
# The fields that change a pair's length; the rest are read when one of these, or the page, changes.
# The fields the batch figures (`batch_text`) read.
BATCH_FIELDS = ("method", "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                "num_value_samples", "num_processes", "pass_rate_band")
PAIR_LENGTH_FIELDS = ("model", "num_prompts", "eval_size", "num_train_epochs", "max_steps",
                      "per_device_train_batch_size", "gradient_accumulation_steps", "num_value_samples", "eval_steps")


def _bind(handler: Callable[..., Any], form: LaunchForm, *args: Any) -> Callable[..., Any]:
    """`handler(form, *args, ...)` as an event function, under the handler's name."""
    event = functools.partial(handler, form, *args)
    event.__name__ = handler.__name__
    return event


def _with_request(handler: Callable[..., Any], form: LaunchForm, *args: Any) -> Callable[..., Any]:
    """`handler(form, *args, data, request)` as an event function: Gradio hands the request (for the login) to a
    parameter annotated `gr.Request`."""
    def event(data: dict, request: gr.Request) -> dict[Any, Any]:
        return handler(form, *args, data, request)
    event.__name__ = handler.__name__
    return event


def _wire_actions(form: LaunchForm) -> tuple[list[Any], Any, Any]:
    """The buttons that start runs and the form's tools. Returns the events after which the Run page opens the run
    launched (one per action, then the pair's), the pair's event and the sweep's."""
    bind, buttons = _bind, form.buttons
    errors = list(form.errors.values())
    buttons["try"].click(_with_request(try_it, form), {form.token, *form.fields}, [form.try_verdict, form.try_table],
                         concurrency_limit=1, concurrency_id="playground", **PRIVATE)
    buttons["check"].click(bind(check, form), set(form.fields), [*errors, form.status], **PRIVATE)
    buttons["command"].click(bind(show_command, form), set(form.fields), [*errors, form.command], **PRIVATE)
    buttons["preview"].click(bind(show_preview, form), set(form.fields), [form.preview_info, form.preview],
                             **PRIVATE)
    events = [buttons[action].click(_with_request(start, form, action), {form.token, form.seeds, *form.fields},
                                    [*errors, form.status, form.launched], concurrency_limit=1, **PRIVATE)
              for action in ACTIONS]
    pair_event = buttons["pair"].click(_with_request(start_pair, form),
                                       {form.token, form.seeds, form.protocol, form.budget, form.flops_budget,
                                        form.pair_recipe,
                                        *form.fields},
                                       [*errors, form.status, form.launched, form.pair], concurrency_limit=1,
                                       **PRIVATE)
    sweep_event = buttons["sweep"].click(_with_request(start_sweep, form),
                                         {form.token, form.seeds, form.sweep_grid, form.sweep_halving, *form.fields},
                                         [*errors, form.status, form.launched, form.sweep_study], concurrency_limit=1,
                                         **PRIVATE)
    buttons["save"].click(bind(save_yaml, form), set(form.fields), [*errors, form.status, form.saved], **PRIVATE)
    buttons["load"].upload(bind(load_yaml, form), buttons["load"], [*form.fields, *form.boxes, form.status],
                           **PRIVATE)
    return [*events, pair_event], pair_event, sweep_event


def plan_pair_on(form: LaunchForm, triggers: list[Any]) -> None:
    """Refresh the pair's plan (runs, steps, time per method) on these events."""
    gr.on(triggers, _bind(plan_pair, form), {form.seeds, form.protocol, form.budget, form.flops_budget,
                                             form.pair_recipe, *form.fields},
          form.pair_plan, trigger_mode="always_last", **PRIVATE)


def _wire_form(form: LaunchForm) -> None:
    """What changes with the form's fields: the protocol's note, the plans of a pair and a sweep, the method's
    settings, the dataset's boxes and rewards, a preset."""
    bind, inputs = _bind, form.inputs
    form.protocol.change(bind(show_protocol, form), form.protocol, [form.budget, form.flops_budget,
                                                                     form.protocol_text], **PRIVATE)
    plan_pair_on(form, [form.protocol.change, form.seeds.change, form.budget.change, form.flops_budget.change,
                        form.pair_recipe.change,
                        *(inputs[k].change for k in PAIR_LENGTH_FIELDS if k in inputs)])
    gr.on([inputs[k].change for k in BATCH_FIELDS if k in inputs], bind(show_batch, form), set(form.fields),
          form.batch_text, trigger_mode="always_last", **PRIVATE)
    plan_inputs = {form.sweep_grid, form.seeds, form.sweep_halving, *form.fields}
    for box in (form.sweep_grid, form.seeds, form.sweep_halving):
        box.change(bind(plan_sweep, form), plan_inputs, form.sweep_plan, trigger_mode="always_last", **PRIVATE)
    form.sweep_field.input(bind(add_sweep_field, form), {form.sweep_field, form.sweep_grid, *form.fields},
                           [form.sweep_grid, form.sweep_field], **PRIVATE)
    inputs["method"].change(bind(show_method, form), inputs["method"],
                            [*form.param_columns.values(), form.recipe_box], **PRIVATE)
    # `.input`: a user's pick fills the recipe's settings; a preset, a loaded config or a clone keeps its own values.
    recipe_fields = [inputs[k] for k in forms.recipe_values(forms.NO_RECIPE) if k in inputs]
    inputs["recipe"].input(bind(pick_recipe, form), set(form.fields), recipe_fields, **PRIVATE)
    note_triggers = [inputs["recipe"].change, inputs["num_iterations"].change,
                     *(inputs[f"use_reward:{name}"].change for name in form.reward_names)]
    gr.on(note_triggers, bind(show_recipe, form), set(form.fields), form.recipe_text, trigger_mode="always_last",
          **PRIVATE)
    inputs["dataset_source"].change(bind(show_source, form), inputs["dataset_source"], form.boxes, **PRIVATE)
    # `.input`: only a user's pick switches the rewards, not a preset, a loaded config or a clone filling the form.
    inputs["dataset_source"].input(bind(match_rewards, form), inputs["dataset_source"],
                                   [inputs[f"use_reward:{name}"] for name in form.reward_names], **PRIVATE)
    form.preset.input(bind(apply_preset, form), form.preset, [*form.fields, *form.boxes, form.preset, form.status],
                      **PRIVATE)


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


