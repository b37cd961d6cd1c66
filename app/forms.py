"""Launch-form validation: the flat values of the form's fields in, a run spec dict (or per-field errors) out.

Pure functions apart from looking at the file system (does a model folder or data file exist?) and, for the
"show command" view, the library's `RunSpec`. The UI shows each error next to the field whose key it carries.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from a2po.data import MAX_DIFFICULTY

DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
ARITHMETIC_OPERATIONS = "+-*"
FORM_ERROR = "_form"
"""Error key for problems that belong to no single field."""


@dataclass(frozen=True)
class Param:
    """One hyper-parameter of the form: an A2POConfig field with its form default and how to check it."""

    key: str
    label: str
    default: Any
    kind: str  # "int", "float" or "bool"
    check: str = ""  # "pos" (> 0), "ge1" (>= 1), "ge0" (>= 0), "prob" (in (0, 1]), "steps" (-1 or >= 1)
    advanced: bool = False
    info: str = ""


PARAMS: list[Param] = [
    Param("num_value_samples", "N: reference samples per prompt", 8, "int", "ge1",
          info="Stage 1 samples N completions per prompt to estimate V*."),
    Param("beta1", "β₁ (V* temperature)", 0.5, "float", "pos", info="Soft-max temperature of the V* estimate."),
    Param("beta2", "β₂ (KL temperature)", 1e-3, "float", "pos", info="Scale of the implicit reward in stage 2."),
    Param("learning_rate", "Learning rate", 2e-5, "float", "pos"),
    Param("max_steps", "Max steps", -1, "int", "steps", info="-1: train for num_train_epochs."),
    Param("per_device_train_batch_size", "Batch size (prompts per step)", 8, "int", "ge1"),
    Param("max_completion_length", "Max completion tokens", 16, "int", "ge1",
          info="Arithmetic answers are short; use 256+ for step-by-step math."),
    Param("temperature", "Sampling temperature", 1.0, "float", "pos"),
    Param("num_train_epochs", "Epochs", 3.0, "float", "pos", advanced=True),
    Param("max_prompt_length", "Max prompt tokens", 512, "int", "ge1", advanced=True),
    Param("top_p", "top-p", 1.0, "float", "prob", advanced=True),
    Param("top_k", "top-k (0: off)", 0, "int", "ge0", advanced=True),
    Param("gradient_accumulation_steps", "Gradient accumulation steps", 1, "int", "ge1", advanced=True),
    Param("value_batch_size", "Stage-1 prompts per batch (0: 256 sequences)", 0, "int", "ge0", advanced=True),
    Param("logging_steps", "Log every N steps", 1, "int", "ge1", advanced=True),
    Param("eval_steps", "Evaluate every N steps (0: only at the end)", 0, "int", "ge0", advanced=True),
    Param("save_steps", "Checkpoint every N steps (0: only at the end)", 0, "int", "ge0", advanced=True),
    Param("seed", "Seed", 0, "int", advanced=True),
    Param("filter_all_incorrect", "Drop prompts no reference sample solved", True, "bool", advanced=True),
    Param("use_cpu", "Force CPU", False, "bool", advanced=True),
]
PARAM_BY_KEY = {p.key: p for p in PARAMS}
ZERO_MEANS_NONE = {"top_k", "value_batch_size", "eval_steps", "save_steps"}

DATASET_DEFAULTS: dict[str, Any] = {
    "dataset_source": "arithmetic", "num_prompts": 128, "difficulty": 2, "operations": "+", "data_seed": 0,
    "eval_size": 32, "hub_name": "openai/gsm8k", "hub_config": "main", "hub_split": "train", "file_path": "",
    "prompt_column": "", "answer_column": "",
}


@dataclass
class FormResult:
    """What validation produced: a spec when `errors` is empty, else the errors keyed by form field."""

    spec: dict[str, Any] | None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


def default_form() -> dict[str, Any]:
    """The values the launch form starts with: offline default model, built-in arithmetic data, exact match."""
    from a2po.models import DEFAULT_MODEL

    form: dict[str, Any] = {"name": "arithmetic-demo", "action": "train", "model": DEFAULT_MODEL,
                            **DATASET_DEFAULTS, "rewards": {"exact_match": 1.0}, "lora": False, "lora_r": 16,
                            "lora_alpha": 32}
    form.update({p.key: p.default for p in PARAMS})
    return form


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool) or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _check_param(param: Param, value: Any) -> tuple[Any, str | None]:
    """Convert a raw form value for `param`; returns (value, error message or None)."""
    if param.kind == "bool":
        return bool(value), None
    number = _number(value)
    if number is None:
        return None, f"{param.label}: enter a number."
    if param.kind == "int":
        if number != int(number):
            return None, f"{param.label} must be a whole number (got {number:g})."
        number = int(number)
    message = {
        "pos": "must be > 0" if not number > 0 else None,
        "ge1": "must be at least 1" if number < 1 else None,
        "ge0": "must be 0 or more" if number < 0 else None,
        "prob": "must be in (0, 1]" if not 0 < number <= 1 else None,
        "steps": "must be -1 (use epochs) or at least 1" if number != -1 and number < 1 else None,
    }.get(param.check)
    if message:
        return None, f"{param.label} {message} (got {number:g})."
    if param.key in ZERO_MEANS_NONE and number == 0:
        return None, None
    return number, None


def check_model(model: str, offline: bool = False) -> str | None:
    """Why `model` cannot be loaded, or None: the built-in default, an existing model folder, or a hub id."""
    from a2po.models import is_default_model

    model = (model or "").strip()
    if not model:
        return "Choose a model: the built-in default, a hub id (org/name) or a local folder."
    if is_default_model(model):
        return None
    path = Path(model).expanduser()
    looks_like_path = model.startswith(("/", ".", "~")) or path.exists()
    if looks_like_path:
        if not path.is_dir():
            return f"No model folder at {model}."
        if not (path / "config.json").is_file():
            return f"{model} is a folder but holds no config.json (not a saved model)."
        return None
    if not HUB_ID.match(model):
        return f"Unknown model {model!r}: not a built-in name, an existing folder, or a hub id like org/name."
    if offline and not _in_hub_cache(model):
        return f"{model} is not in the local Hugging Face cache and the hub is offline (HF_HUB_OFFLINE)."
    return None


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def check_dataset(form: Mapping[str, Any], errors: dict[str, str]) -> dict[str, Any] | None:
    """The spec's `dataset` dict from the form's dataset fields, or None (with `errors` filled in)."""
    source = form.get("dataset_source") or "arithmetic"
    eval_size = _number(form.get("eval_size"))
    if eval_size is None or eval_size < 0 or eval_size != int(eval_size):
        errors["eval_size"] = "Eval size must be a whole number, 0 or more."
    eval_size = int(eval_size or 0)
    if source == "arithmetic":
        num_prompts = _number(form.get("num_prompts"))
        if num_prompts is None or num_prompts < 1 or num_prompts != int(num_prompts):
            errors["num_prompts"] = "Number of prompts must be a whole number, at least 1."
        difficulty = _number(form.get("difficulty"))
        if difficulty is None or not 1 <= difficulty <= MAX_DIFFICULTY or difficulty != int(difficulty):
            errors["difficulty"] = f"Difficulty (digits per operand) must be a whole number, 1 to {MAX_DIFFICULTY}."
        operations = "".join(form.get("operations") or [])
        if not operations or set(operations) - set(ARITHMETIC_OPERATIONS):
            errors["operations"] = f"Pick at least one operation among {' '.join(ARITHMETIC_OPERATIONS)}."
        seed = _number(form.get("data_seed"))
        if seed is None or seed != int(seed):
            errors["data_seed"] = "Seed must be a whole number."
        if errors.keys() & {"num_prompts", "difficulty", "operations", "data_seed", "eval_size"}:
            return None
        return {"source": "arithmetic", "num_prompts": int(num_prompts), "difficulty": int(difficulty),
                "operations": operations, "seed": int(seed), "eval_size": eval_size}
    columns = {"prompt_column": (form.get("prompt_column") or "").strip() or None,
               "answer_column": (form.get("answer_column") or "").strip() or None, "eval_size": eval_size}
    if source == "hub":
        name = (form.get("hub_name") or "").strip()
        if not HUB_ID.match(name) and not re.match(r"^[\w.-]+$", name):
            errors["hub_name"] = "Enter a hub dataset id such as openai/gsm8k."
            return None
        return {"source": "hub", "name": name, "config_name": (form.get("hub_config") or "").strip() or None,
                "split": (form.get("hub_split") or "").strip() or "train", **columns}
    if source == "file":
        path = str(form.get("file_path") or "").strip()
        if not path:
            errors["file_path"] = "Upload a .jsonl, .csv or .parquet file."
            return None
        if not Path(path).is_file():
            errors["file_path"] = f"No file at {path}."
            return None
        if Path(path).suffix.lower() not in DATA_SUFFIXES:
            errors["file_path"] = f"Unsupported file type {Path(path).suffix!r}: use {', '.join(DATA_SUFFIXES)}."
            return None
        return {"source": "file", "path": path, **columns}
    errors["dataset_source"] = f"Unknown dataset source {source!r}."
    return None


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
    """Dataset columns a built-in reward reads: its named parameters besides `completions` and `prompts`."""
    from a2po.rewards import REWARD_FUNCTIONS

    params = inspect.signature(REWARD_FUNCTIONS[name]).parameters.values()
    return [p.name for p in params if p.name not in ("completions", "prompts", "completion_ids")
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _check_rewards(rewards: Any, known: Sequence[str], errors: dict[str, str]) -> list[dict[str, Any]]:
    chosen = dict(rewards or {})
    out = []
    if not chosen:
        errors["rewards"] = "Pick at least one reward function."
    for name, weight in chosen.items():
        if name not in known:
            errors["rewards"] = f"Unknown reward {name!r}: use one of {', '.join(known)}."
            continue
        number = _number(weight)
        if number is None or number <= 0:
            errors["rewards"] = f"Weight of {name} must be a number > 0 (got {weight})."
            continue
        out.append({"name": name, "weight": number})
    return out


def validate_form(form: Mapping[str, Any], *, columns: Sequence[str] | None = None,
                  offline: bool = False) -> FormResult:
    """Check every field of the launch form and build the run spec.

    `form` holds the raw field values (see `default_form` for the keys). `columns` are the dataset's columns
    when the caller could load it (None: not checked). Errors are keyed by form field (`FORM_ERROR` for the rest).
    """
    from a2po.rewards import REWARD_FUNCTIONS

    errors: dict[str, str] = {}
    name = (form.get("name") or "").strip()
    if len(name) > 200:
        errors["name"] = "Run name: at most 200 characters."
    action = form.get("action") or "train"
    if action not in ("values", "train", "evaluate"):
        errors["action"] = f"Unknown action {action!r}."
    model = (form.get("model") or "").strip()
    problem = check_model(model, offline=offline)
    if problem:
        errors["model"] = problem
    dataset = check_dataset(form, errors)
    rewards = _check_rewards(form.get("rewards"), list(REWARD_FUNCTIONS), errors)
    if dataset is not None and columns is not None and dataset["source"] != "arithmetic":
        needs = {r["name"]: reward_columns(r["name"]) for r in rewards}
        errors.update(check_columns(columns, dataset.get("prompt_column"), dataset.get("answer_column"),
                                    [r["name"] for r in rewards], needs))
    config: dict[str, Any] = {}
    for param in PARAMS:
        value, message = _check_param(param, form.get(param.key, param.default))
        if message:
            errors[param.key] = message
        elif value is not None:  # None: the library default (e.g. top_k off)
            config[param.key] = value
    peft = None
    if form.get("lora"):
        r, alpha = _number(form.get("lora_r")), _number(form.get("lora_alpha"))
        if r is None or r < 1 or r != int(r):
            errors["lora_r"] = "LoRA rank must be a whole number, at least 1."
        if alpha is None or alpha <= 0:
            errors["lora_alpha"] = "LoRA alpha must be > 0."
        if "lora_r" not in errors and "lora_alpha" not in errors:
            peft = {"r": int(r), "lora_alpha": alpha}
    if errors:
        return FormResult(None, errors)
    spec = {"name": name or default_run_name(model, dataset), "action": action, "model": model, "dataset": dataset,
            "rewards": rewards, "config": config, "peft": peft}
    problem = library_check(spec)
    if problem:
        return FormResult(None, {FORM_ERROR: problem})
    return FormResult(spec)


def default_run_name(model: str, dataset: Mapping[str, Any]) -> str:
    """A readable run name from the model and dataset, for runs launched without one."""
    short_model = Path(model.rstrip("/")).name or model
    short_data = {"arithmetic": "arithmetic", "hub": str(dataset.get("name", "")).split("/")[-1],
                  "file": Path(str(dataset.get("path", ""))).stem}.get(dataset.get("source"), "data")
    return f"{short_model}-{short_data}"


def library_check(spec: Mapping[str, Any]) -> str | None:
    """The library's own verdict on a spec (`RunSpec.from_dict`), or None when it accepts it."""
    from a2po.runspec import RunSpec

    try:
        RunSpec.from_dict(dict(spec))
    except (ValueError, TypeError, KeyError) as exc:
        return str(exc)
    return None


def command_line(spec: Mapping[str, Any]) -> str:
    """The `python -m a2po ...` command that runs the same spec from a terminal."""
    from a2po.runspec import RunSpec

    return RunSpec.from_dict(dict(spec)).command()


def validate_spec(spec: Mapping[str, Any], offline: bool = False) -> str | None:
    """What is wrong with a run spec given directly (the API's `launch`), or None.

    Checks what the library cannot know about this machine (does the model or data file exist?), then the
    library's own checks.
    """
    if not isinstance(spec, Mapping):
        return "The spec must be a JSON object."
    problems = []
    if "model" in spec:
        problem = check_model(str(spec["model"]), offline=offline)
        if problem:
            problems.append(f"model: {problem}")
    dataset = spec.get("dataset") or {}
    is_file = isinstance(dataset, Mapping) and dataset.get("source") == "file"
    if is_file and not Path(str(dataset.get("path"))).is_file():
        problems.append(f"dataset.path: no file at {dataset.get('path')}.")
    if problems:
        return " ".join(problems)
    return library_check(spec)
