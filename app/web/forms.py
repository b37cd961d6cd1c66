"""The launch form's mapping to and from run specs.

The form is flat (one Gradio component per field); a spec is nested (`dataset`, `config`, `rewards`, `peft`).
`form_to_spec` converts without checking; `validate_form` checks through the allow-list
(`app.access.allowlist.check_spec`, the one every way to launch goes through) and keys each problem by the form
field that shows it.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from a2po.data import OPERATIONS
from a2po.presets import DEFAULT_PRESET, NO_PRESET
from a2po.settings import METHODS, config_default
from app.access.allowlist import (
    EMPTY_MEANS_UNSET,
    PARAM_BY_KEY,
    PARAMS,
    ZERO_MEANS_NONE,
    SpecResult,
    check_spec,
    method_params,
)
from app.access.policy import Policy

ARITHMETIC_OPERATIONS = "".join(OPERATIONS)  # the form's check boxes
FORM_ERROR = "_form"
"""Error key for problems that belong to no single field."""
# Where each spec field is shown on the form (config fields keep their own names).
FORM_KEYS = {"dataset.source": "dataset_source", "dataset.num_prompts": "num_prompts",
             "dataset.difficulty": "difficulty", "dataset.operations": "operations", "dataset.seed": "data_seed",
             "dataset.eval_size": "eval_size", "dataset.name": "hub_name", "dataset.config_name": "hub_config",
             "dataset.split": "hub_split", "dataset.path": "file_path", "dataset.prompt_column": "prompt_column",
             "dataset.answer_column": "answer_column", "dataset.task": "task", "dataset.tasks": "task",
             "dataset.settings": "task_settings", "dataset.system_prompt": "system_prompt",
             "dataset.answer_format": "answer_format", "peft.r": "lora_r",
             "peft.lora_alpha": "lora_alpha",
             "peft": "lora_r", "recipe": "recipe"}
FORM_FIELDS_DEFAULTS: dict[str, Any] = {
    "hub_name": "openai/gsm8k", "hub_config": "main", "hub_split": "train", "file_path": "", "prompt_column": "",
    "answer_column": "", "task": "chain_sum", "task_settings": "{}", "lora": False, "lora_r": 16, "lora_alpha": 32,
    "template_system_prompt": True, "system_prompt": "", "answer_format": "tags", "recipe": "none",
}
NO_RECIPE = "none"  # the form's recipe choice for TRL's GRPOConfig defaults (a spec without a recipe)
@dataclass
class FormResult:
    """What form validation produced: the allow-list's verdict (`checked`, whose run the gate queues as it is) when
    `errors` is empty, else the errors keyed by form field."""

    checked: SpecResult | None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def spec(self) -> dict[str, Any] | None:
        """The clean spec."""
        return self.checked.spec if self.checked is not None else None


def command_line(spec: Mapping[str, Any]) -> str:
    """The `python -m a2po ...` command that runs the same spec from a terminal."""
    from a2po.runspec import RunSpec

    return RunSpec.from_dict(dict(spec)).command()


def default_run_name(model: str, dataset: Mapping[str, Any]) -> str:
    """A readable run name from the model and dataset, for runs launched without one."""
    short_model = Path(model.rstrip("/")).name or model
    short_data = {"arithmetic": "arithmetic", "hub": str(dataset.get("name", "")).split("/")[-1],
                  "file": Path(str(dataset.get("path", ""))).stem,
                  "reasoning-gym": str(dataset.get("task") or "tasks")}.get(dataset.get("source"), "data")
    return f"{short_model}-{short_data}"



# ---------------------------------------------------------------------------------------------------------- form

def spec_to_form(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The launch form's flat field values for a spec (a preset, a loaded YAML config, a cloned run): what the spec
    leaves out shows the library's default, as it would run."""
    from a2po.runspec import DATASET_DEFAULTS, with_defaults

    spec = with_defaults(dict(spec), NO_PRESET)
    method = spec.get("method") or "a2po"
    form: dict[str, Any] = {**FORM_FIELDS_DEFAULTS, "name": spec["name"], "action": spec["action"],
                            "model": spec["model"], "method": method,
                            "num_processes": spec.get("num_processes", spec.get("num_devices", 1))}
    # Every method's fields (the form hides the other method's): each with its own method's default.
    config = {**{p.key: config_default(p.key, method if method in p.methods else p.methods[0]) for p in PARAMS},
              **spec["config"]}
    form.update({k: (0 if v is None and k in ZERO_MEANS_NONE else v) for k, v in config.items()
                 if k in PARAM_BY_KEY})
    form.update({p.key: band_text(form.get(p.key)) for p in PARAMS if p.kind == "band"})
    dataset = {**DATASET_DEFAULTS, **spec["dataset"]}
    source = dataset["source"]
    form.update(dataset_source=source, num_prompts=dataset["num_prompts"], difficulty=dataset["difficulty"],
                operations=dataset["operations"], data_seed=dataset["seed"], eval_size=dataset["eval_size"] or 0)
    if source == "hub":
        form.update(hub_name=dataset.get("name", ""), hub_config=dataset.get("config_name") or "",
                    hub_split=dataset.get("split") or "train")
    elif source == "file":
        form["file_path"] = dataset.get("path", "")
    elif source == "reasoning-gym":
        form["answer_format"] = dataset.get("answer_format") or "tags"
        form.update(task=dataset.get("task") or "", task_settings=json.dumps(
            dataset.get("settings") or {} if dataset.get("task") else dataset.get("tasks") or []))
    form.update(prompt_column=dataset.get("prompt_column") or "", answer_column=dataset.get("answer_column") or "")
    form.update(template_system_prompt=dataset.get("system_prompt") is None,
                system_prompt=dataset.get("system_prompt") or "")
    form["rewards"] = {r["name"]: r.get("weight", 1.0) for r in spec["rewards"]}
    peft = spec.get("peft")
    form.update(lora=bool(peft), lora_r=(peft or {}).get("r", 16), lora_alpha=(peft or {}).get("lora_alpha", 32))
    form["recipe"] = spec.get("recipe") or NO_RECIPE
    return form


def default_form(preset: str = DEFAULT_PRESET) -> dict[str, Any]:
    """The values the launch form starts with: those of `preset` (the default: the teaching demo)."""
    from a2po.runspec import preset_spec

    return spec_to_form(preset_spec(preset))


def form_to_spec(form: Mapping[str, Any]) -> dict[str, Any]:
    """The spec the form's fields describe (converted, not checked: `check_spec` does that)."""
    source = form.get("dataset_source") or "arithmetic"
    dataset: dict[str, Any] = {"source": source, "eval_size": form.get("eval_size")}
    if source == "arithmetic":
        dataset.update(num_prompts=form.get("num_prompts"), difficulty=form.get("difficulty"),
                       operations="".join(form.get("operations") or []), seed=form.get("data_seed"))
    elif source == "reasoning-gym":
        dataset.update(num_prompts=form.get("num_prompts"), seed=form.get("data_seed"),
                       answer_format=form.get("answer_format") or "tags")
        settings = _json_field(form.get("task_settings"))
        if isinstance(settings, list):
            dataset["tasks"] = settings
        else:
            dataset.update(task=form.get("task"), settings=settings)
    else:
        dataset.update(prompt_column=(form.get("prompt_column") or "").strip() or None,
                       answer_column=(form.get("answer_column") or "").strip() or None)
        if source == "hub":
            dataset.update(name=(form.get("hub_name") or "").strip(),
                           config_name=(form.get("hub_config") or "").strip() or None,
                           split=(form.get("hub_split") or "").strip() or "train")
        elif source == "file":
            dataset["path"] = str(form.get("file_path") or "").strip()
    dataset["system_prompt"] = None if form.get("template_system_prompt", True) else form.get("system_prompt") or ""
    method = form.get("method") or "a2po"
    known = method if method in METHODS else "a2po"  # an unknown method is the library's to name
    config = {p.key: form[p.key] if p.key in form else config_default(p.key, known) for p in method_params(known)}
    config.update({key: band_value(config[key]) for key in config if PARAM_BY_KEY[key].kind == "band"})
    # A setting left empty that has no value of its own (the stage-1 seed: the run seed's) stays out of the spec.
    config = {k: v for k, v in config.items() if not (k in EMPTY_MEANS_UNSET and v in (None, ""))}
    model = (form.get("model") or "").strip()
    name = (form.get("name") or "").strip()
    rewards = [{"name": n, "weight": w} for n, w in (form.get("rewards") or {}).items()]
    peft = {"r": form.get("lora_r"), "lora_alpha": form.get("lora_alpha")} if form.get("lora") else None
    spec = {"name": name or default_run_name(model, dataset), "action": form.get("action") or "train",
            "model": model, "dataset": dataset, "rewards": rewards, "config": config, "peft": peft}
    if form.get("num_processes") not in (None, ""):
        spec["num_processes"] = form["num_processes"]
    if method != "a2po":
        spec["method"] = method
    if method == "grpo" and form.get("recipe") not in (None, "", NO_RECIPE):
        spec["recipe"] = form["recipe"]
    return spec


def recipe_choices() -> list[tuple[str, str]]:
    """The form's GRPO recipes (`a2po.recipes`), TRL's defaults first."""
    from a2po.recipes import RECIPES

    return [("None: TRL's GRPOConfig defaults", NO_RECIPE), *((f"{r.title} ({r.name})", r.name)
                                                             for r in RECIPES.values())]


def recipe_values(name: str) -> dict[str, Any]:
    """The form's values of every setting some recipe sets, as recipe `name` has them: its own settings, TRL's
    GRPOConfig defaults for the rest (`NO_RECIPE`: all TRL's), so switching recipes leaves nothing of the last."""
    from a2po.recipes import RECIPE_SETTINGS, recipe_settings

    chosen = {} if name in (None, "", NO_RECIPE) else recipe_settings(name)
    values = {k: chosen[k] if k in chosen else config_default(k, "grpo") for k in RECIPE_SETTINGS}
    return {k: 0 if v is None and k in ZERO_MEANS_NONE else v for k, v in values.items()}


def recipe_note(name: str, form: Mapping[str, Any]) -> str:
    """What the recipe sets, from which paper, what it leaves out, and which of its settings change nothing in the
    form's run (those that act only off-policy, with num_iterations 1)."""
    from a2po.recipes import RECIPES, canonical_name, off_policy_note

    if name in (None, "", NO_RECIPE):
        return "**Recipe:** none: GRPO with TRL's GRPOConfig defaults and the settings below."
    recipe = RECIPES[canonical_name(name)]
    left_out = f" Not set by the recipe: {recipe.left_out}." if recipe.left_out else ""
    caveat = off_policy_note(recipe.name, form, num_rewards=len(form.get("rewards") or {}) or 1)
    return (f"**Recipe:** {recipe.describe()} A setting changed below wins over the recipe.{left_out}"
            + (f"\n\n⚠ {caveat}" if caveat else ""))


def band_text(band: Any) -> str:
    """A pass-rate band as the form shows it: "low, high" ("" for None: every prompt)."""
    return ", ".join(f"{float(v):g}" for v in band) if isinstance(band, (list, tuple)) else str(band or "")


def band_value(text: Any) -> Any:
    """The form's "low, high" as [low, high]; empty: None; anything else as typed, for the library to refuse."""
    if not isinstance(text, str):
        return text
    if not text.strip():
        return None
    try:
        return [float(part) for part in text.replace("[", "").replace("]", "").split(",")]
    except ValueError:
        return text.strip()


def _json_field(text: Any) -> Any:
    if not isinstance(text, str) or not text.strip():
        return {}
    try:
        return json.loads(text)
    except ValueError:
        return text  # reported by the task checks as not an object


def form_errors(errors: Mapping[str, str]) -> dict[str, str]:
    """Spec-path errors keyed by the form field that shows them (`FORM_ERROR` for the rest)."""
    out: dict[str, str] = {}
    for path, message in errors.items():
        if path.startswith("config.") and path[len("config."):] in PARAM_BY_KEY:
            key = path[len("config."):]
        elif path.startswith(("dataset.settings", "dataset.tasks")):
            key = "task_settings"
        else:
            key = FORM_KEYS.get(path, path if path in ("name", "model", "rewards", "action", "num_processes", "method")
                                else FORM_ERROR)
        out[key] = f"{out[key]} {message}" if key in out else message
    return out


def validate_form(form: Mapping[str, Any], policy: Policy, *, columns: Sequence[str] | None = None,
                  offline: bool = False) -> FormResult:
    """Check every field of the launch form and build the run spec (through `check_spec`, like the API).

    `columns` are the dataset's columns when the caller could load them (None: not checked). Errors are keyed by
    form field (`FORM_ERROR` for the rest).
    """
    return form_result(check_spec(form_to_spec(form), policy, offline=offline), columns)


def form_result(result: SpecResult, columns: Sequence[str] | None = None) -> FormResult:
    """The allow-list's verdict on the form's spec, its problems keyed by form field, with those of a file or hub
    dataset's `columns` (None: not read)."""
    errors = form_errors(result.errors)
    if result.ok and columns is not None and result.spec["dataset"]["source"] in ("file", "hub"):
        dataset = result.spec["dataset"]
        needs = {r["name"]: reward_columns(r["name"]) for r in result.spec["rewards"]}
        errors.update(check_columns(columns, dataset.get("prompt_column"), dataset.get("answer_column"),
                                    [r["name"] for r in result.spec["rewards"]], needs))
    return FormResult(None if errors else result, errors)


def check_columns(columns: Sequence[str], prompt_column: str | None, answer_column: str | None,
                  rewards: Sequence[str], needs: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Errors for a dataset with `columns`: it needs a prompt column, and the columns the chosen rewards read.

    Without an explicit column the library picks the first of its usual names (`a2po.data.PROMPT_COLUMNS`,
    `ANSWER_COLUMNS`); the answer column becomes `ground_truth`. `needs` maps reward names to the columns they
    read (see `reward_columns`).
    """
    from a2po.data import ANSWER_COLUMNS, PROMPT_COLUMNS

    errors: dict[str, str] = {}
    listed = ", ".join(columns) or "none"
    if prompt_column and prompt_column not in columns:
        errors["prompt_column"] = f"No `{prompt_column}` column in this dataset (columns: {listed})."
    elif not prompt_column and not set(PROMPT_COLUMNS) & set(columns):
        errors["prompt_column"] = (f"No `prompt` column in this dataset (columns: {listed}). "
                                   "Name the column that holds the prompts.")
    if answer_column and answer_column not in columns:
        errors["answer_column"] = f"No `{answer_column}` column in this dataset (columns: {listed})."
        return errors
    has_answer = bool(answer_column) or bool(set(ANSWER_COLUMNS) & set(columns))
    available = set(columns) | ({"ground_truth"} if has_answer else set())
    for reward in rewards:
        missing = [c for c in needs.get(reward, ()) if c not in available]
        if missing:
            errors["answer_column"] = (f"Reward {reward} needs a `{missing[0]}` column, which this dataset lacks "
                                       f"(columns: {listed}). Name the column that holds the answers.")
            break
    return errors


def reward_columns(name: str) -> list[str]:
    """Dataset columns a reward reads: its named parameters besides those the trainer passes (`TRAINER_ARGUMENTS`:
    `completions`, `prompts`, `completion_ids`, `trainer_state`, `log_extra`, `log_metric`) (a registered reward's
    read from its source, without importing it)."""
    from a2po.reward_registry import read_registry
    from a2po.rewards import REWARD_FUNCTIONS, TRAINER_ARGUMENTS

    if name in REWARD_FUNCTIONS:
        params = inspect.signature(REWARD_FUNCTIONS[name]).parameters.values()
        names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    else:
        registered = read_registry().rewards.get(name)
        names = list(registered.params or ()) if registered is not None else []
    return [n for n in names if n not in TRAINER_ARGUMENTS]
