"""The Launch page's handlers: each takes the `LaunchForm` and an event's values as {component: value} and
returns {component: update}: check, command, preview, the starts (a run, seeds, a pair, a sweep), "Try the
reward", YAML and presets, and what follows the method, recipe and dataset source picked."""

from __future__ import annotations

import html
from typing import Any

import gradio as gr
import pandas as pd

from app.access import allowlist
from app.access.gate import Refused, offline
from app.studies import sweeps
from app.studies.protocols import PROTOCOL_LABELS, StudyError, budget_flops, budget_seconds
from app.web import forms, saved_presets
from app.web.common import short
from app.web.pages.launch.form import (
    ACTION_LABELS,
    LaunchForm,
    error_updates,
    fill,
    load_dataset_preview,
    preset_choices,
    validate,
)
from app.web.pages.launch.plans import pair_grpo_settings, pair_recipe

TRY_COLUMNS = ["prompt", "kind", "completion", "reward"]


def try_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows of "Try the reward" as a small table."""
    return pd.DataFrame([{"prompt": short(r["prompt"], 120), "kind": r["kind"],
                          "completion": short(r["completion"], 200), "reward": f"{r['reward']:g}"} for r in rows],
                        columns=TRY_COLUMNS)


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
                                          grpo_settings=pair_grpo_settings(form, data, result.spec),
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


def match_rewards(form: LaunchForm, source: str) -> dict[Any, Any]:
    """A task is scored by its own checker, and only by it; other sources start from exact_match again."""
    wanted = "task_checker" if source == "reasoning-gym" else "exact_match"
    return {form.inputs[f"use_reward:{name}"]: gr.update(value=name == wanted) for name in form.reward_names}


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
