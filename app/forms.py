"""The one allow-list of run specs, and the launch form on top of it.

Every way to start a run (the launch form, the named API, a YAML config loaded in the form, "clone this run")
goes through `check_spec(spec, policy)`. What it accepts:

- top-level keys `name, action, model, dataset, rewards, config, peft, num_processes, fsdp, runner` (and `preset`, which
  `a2po.presets.with_defaults` resolves first; `num_devices` is the old name of `num_processes`);
- in `config`, the form's hyper-parameters (`PARAMS`), each type-checked and bounded by the studio's `Limits`;
  fields that reach outside the run (remote code, hub pushes) only when the operator allowed them with a flag,
  and nothing else: `values_path`, `output_dir`, `report_to`, `deepspeed`, ... are refused;
- datasets from the built-in generators, files inside `<data-dir>/datasets/` or received by Gradio's upload route
  (the form's file box), hub ids that look like hub ids (when the hub is allowed); models built in, under a model
  root, or hub ids;
- the rewards the library knows (a reasoning-gym task is scored by its own checker).

Every problem is reported at once, keyed by the field's path (`config.beta1`, `dataset.path`); the form shows
each next to its field. Apart from looking at the file system, everything here is a pure function.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from a2po.data import MAX_DIFFICULTY
from a2po.presets import DEFAULT_PRESET, preset_spec, with_defaults
from app.policy import Limits, Policy

DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
HUB_DATASET = re.compile(r"^([A-Za-z0-9][\w.-]{0,95}/)?[\w.-]{1,96}$")  # "gsm8k" or "openai/gsm8k"
SAFE_NAME = re.compile(r"^[\w.-]{1,64}$")  # a hub config or split name
ARITHMETIC_OPERATIONS = "+-*"
ACTIONS = ("values", "train", "evaluate")
FORM_ERROR = "_form"
"""Error key for problems that belong to no single field."""
SPEC_KEYS = ("name", "action", "model", "dataset", "rewards", "config", "peft", "num_processes", "fsdp", "runner")
SCHEDULERS = ("constant", "constant_with_warmup", "linear", "cosine")
# Config fields that reach outside the run: the studio sets them itself (or they read and write where a stranger
# must not point them), so a spec never does.
OUTSIDE_FIELDS = {
    "values_path": "reads a file of the server", "output_dir": "writes where the studio did not choose",
    "logging_dir": "writes where the studio did not choose", "report_to": "sends metrics to outside services",
    "resume_from_checkpoint": "reads a folder of the server (Resume continues a run)",
    "deepspeed": "reads a config file of the server", "fsdp": "changes how the worker's processes run",
    "fsdp_config": "reads a config file of the server", "hub_token": "is a credential: never part of a spec",
    "push_to_hub_token": "is a credential: never part of a spec",
    "dataloader_num_workers": "starts processes in the worker", "torch_compile": "compiles code in the worker",
    "save_strategy": "is the studio's (it checkpoints every few minutes)", "save_values": "is the studio's",
}
SAFE_MODEL_INIT_KWARGS = ("revision", "attn_implementation", "dtype", "torch_dtype", "trust_remote_code")


@dataclass(frozen=True)
class Param:
    """One hyper-parameter of the form: an A2POConfig field with its default and how to check it."""

    key: str
    label: str
    default: Any
    kind: str  # "int", "float", "bool" or "choice"
    # "pos" (> 0), "ge1" (>= 1), "ge0" (>= 0), "prob" (in (0, 1]), "steps" (-1 or >= 1)
    check: str = ""
    advanced: bool = False
    info: str = ""
    limit: str = ""  # the `Limits` field bounding it from above
    choices: tuple[str, ...] = ()


PARAMS: list[Param] = [
    Param("num_value_samples", "N: reference samples per prompt", 8, "int", "ge1", limit="max_value_samples",
          info="Stage 1 samples N completions per prompt to estimate V*."),
    Param("beta1", "β₁ (V* temperature)", 0.5, "float", "pos", info="Soft-max temperature of the V* estimate."),
    Param("beta2", "β₂ (KL temperature)", 1e-3, "float", "pos", info="Scale of the implicit reward in stage 2."),
    Param("learning_rate", "Learning rate", 2e-5, "float", "pos"),
    Param("max_steps", "Max steps", -1, "int", "steps", limit="max_steps", info="-1: train for num_train_epochs."),
    Param("per_device_train_batch_size", "Batch size (prompts per step)", 8, "int", "ge1", limit="max_batch_size"),
    Param("max_completion_length", "Max completion tokens", 16, "int", "ge1", limit="max_completion_length",
          info="Arithmetic answers are short; use 256+ for step-by-step math."),
    Param("temperature", "Sampling temperature", 1.0, "float", "pos"),
    Param("num_train_epochs", "Epochs", 3.0, "float", "pos", advanced=True, limit="max_epochs"),
    Param("lr_scheduler_type", "Learning-rate schedule", "constant", "choice", advanced=True, choices=SCHEDULERS),
    Param("warmup_steps", "Warm-up (steps, or a fraction < 1 of all steps)", 0.0, "float", "ge0", advanced=True,
          limit="max_steps"),
    Param("weight_decay", "Weight decay", 0.0, "float", "ge0", advanced=True),
    Param("max_grad_norm", "Gradient clipping (max norm)", 1.0, "float", "pos", advanced=True),
    Param("max_prompt_length", "Max prompt tokens", 512, "int", "ge1", advanced=True, limit="max_prompt_length"),
    Param("top_p", "top-p", 1.0, "float", "prob", advanced=True),
    Param("top_k", "top-k (0: off)", 0, "int", "ge0", advanced=True),
    Param("gradient_accumulation_steps", "Gradient accumulation steps", 1, "int", "ge1", advanced=True,
          limit="max_batch_size"),
    Param("gradient_checkpointing", "Gradient checkpointing (less memory, slower)", False, "bool", advanced=True),
    Param("value_batch_size", "Stage-1 prompts per batch (0: 256 sequences)", 0, "int", "ge0", advanced=True,
          limit="max_batch_size"),
    Param("per_device_eval_batch_size", "Evaluation batch size", 8, "int", "ge1", advanced=True,
          limit="max_batch_size"),
    Param("logging_steps", "Log every N steps", 1, "int", "ge1", advanced=True),
    Param("eval_steps", "Evaluate every N steps (0: only at the end)", 0, "int", "ge0", advanced=True),
    Param("save_steps", "Checkpoint every N steps (0: by time only)", 0, "int", "ge0", advanced=True),
    Param("save_every_seconds", "Checkpoint every N seconds of training (0: off)", 300, "int", "ge0",
          advanced=True),
    Param("seed", "Seed", 0, "int", advanced=True, info="Stage-1 samples and training follow from it."),
    Param("filter_all_incorrect", "Drop prompts no reference sample solved", True, "bool", advanced=True),
    Param("use_cpu", "Force CPU", False, "bool", advanced=True),
]
PARAM_BY_KEY = {p.key: p for p in PARAMS}
ZERO_MEANS_NONE = {"top_k", "value_batch_size", "eval_steps", "save_steps"}
DATASET_KEYS = {
    "arithmetic": {"source", "num_prompts", "difficulty", "operations", "seed", "eval_size", "system_prompt"},
    "file": {"source", "path", "file", "prompt_column", "answer_column", "num_prompts", "eval_size", "seed", "split",
             "system_prompt"},
    "hub": {"source", "name", "config_name", "split", "prompt_column", "answer_column", "num_prompts", "eval_size",
            "seed", "system_prompt"},
}
# Where each spec field is shown on the form (config fields keep their own names).
FORM_KEYS = {"dataset.source": "dataset_source", "dataset.num_prompts": "num_prompts",
             "dataset.difficulty": "difficulty", "dataset.operations": "operations", "dataset.seed": "data_seed",
             "dataset.eval_size": "eval_size", "dataset.name": "hub_name", "dataset.config_name": "hub_config",
             "dataset.split": "hub_split", "dataset.path": "file_path", "dataset.prompt_column": "prompt_column",
             "dataset.answer_column": "answer_column", "dataset.task": "task", "dataset.tasks": "task",
             "dataset.settings": "task_settings", "dataset.system_prompt": "system_prompt",
             "dataset.answer_format": "answer_format", "peft.r": "lora_r",
             "peft.lora_alpha": "lora_alpha",
             "peft": "lora_r"}
FORM_FIELDS_DEFAULTS: dict[str, Any] = {
    "hub_name": "openai/gsm8k", "hub_config": "main", "hub_split": "train", "file_path": "", "prompt_column": "",
    "answer_column": "", "task": "chain_sum", "task_settings": "{}", "lora": False, "lora_r": 16, "lora_alpha": 32,
    "template_system_prompt": True, "system_prompt": "", "answer_format": "tags",
}


@dataclass
class SpecResult:
    """A clean spec when `errors` is empty, else the problems keyed by field path (`config.beta1`)."""

    spec: dict[str, Any] | None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def message(self) -> str:
        """Every problem in one line, for an API error."""
        return "Invalid run spec: " + " ".join(f"{path}: {message}" for path, message in self.errors.items())


@dataclass
class FormResult:
    """What form validation produced: a spec when `errors` is empty, else the errors keyed by form field."""

    spec: dict[str, Any] | None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


# ---------------------------------------------------------------------------------------------------------- values

def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool) or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _whole(value: Any, low: int | None = None, high: int | None = None) -> int | None:
    number = _number(value)
    if number is None or number != int(number):
        return None
    number = int(number)
    if (low is not None and number < low) or (high is not None and number > high):
        return None
    return number


def check_param(param: Param, value: Any, limits: Limits) -> tuple[Any, str | None]:
    """Convert and check a value for `param`; returns (value, error message or None)."""
    if param.kind == "bool":
        if not isinstance(value, bool):
            return None, f"{param.label}: true or false (got {value!r:.40})."
        return value, None
    if param.kind == "choice":
        if value not in param.choices:
            return None, f"{param.label}: one of {', '.join(param.choices)} (got {value!r:.40})."
        return value, None
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
    high = getattr(limits, param.limit) if param.limit else None
    if high is not None and number > high:
        return None, f"{param.label} must be at most {high:g} on this studio (got {number:g})."
    if param.key in ZERO_MEANS_NONE and number == 0:
        return None, None
    return number, None


def limit_info(param: Param, limits: Limits) -> str:
    """The param's help text with its limit, as the form shows it."""
    high = getattr(limits, param.limit) if param.limit else None
    bound = f"At most {high:g} here." if high is not None else ""
    return " ".join(x for x in (param.info, bound) if x)


# ---------------------------------------------------------------------------------------------------------- model

def check_model(model: str, policy: Policy, offline: bool = False) -> str | None:
    """Why `model` may not be used, or None: the built-in default, a model folder under a model root (resolved:
    symlinks and `..` followed), or a hub id (when the studio allows the hub), never a local path in disguise."""
    from a2po.models import is_default_model

    model = (model or "").strip() if isinstance(model, str) else ""
    if not model:
        return "Choose a model: the built-in default, a hub id (org/name) or a model folder."
    if is_default_model(model):
        return None
    roots = policy.local_model_roots()
    if model.startswith(("/", ".", "~")):
        path = policy.inside(model, roots)
        if path is None:
            return (f"{model} is not under a model folder of this studio ({', '.join(str(r) for r in roots[:2])}"
                    "; the operator adds others with --model-root).")
        if not path.is_dir():
            return f"No model folder at {model}."
        if not (path / "config.json").is_file():
            return f"{model} is a folder but holds no config.json (not a saved model)."
        return _size_problem(model, path / "config.json", policy)
    if not HUB_ID.match(model) or ".." in model:
        return f"Unknown model {model!r}: not a built-in name, a model folder (an absolute path), or a hub id like " \
               "org/name."
    if not policy.allow_hub:
        return (f"Hub models are off on this studio: use the built-in model or a folder in {roots[0]} (the operator "
                "allows the hub with --allow-hub).")
    if offline and not _in_hub_cache(model):
        return f"{model} is not in the local Hugging Face cache and the hub is offline (HF_HUB_OFFLINE)."
    if policy.limits.max_model_params is not None:
        config = _hub_cache_file(model, "config.json")
        if config is None:
            return (f"{model}: this studio allows models of at most {policy.limits.max_model_params:.3g} parameters, "
                    "and the size of a model not yet downloaded cannot be checked: use the built-in model or a "
                    "folder of this studio.")
        return _size_problem(model, Path(config), policy)
    return None


def model_parameters(config_file: Path) -> int:
    """A model's parameter count from its config.json alone: the architecture built on the meta device (no
    weights read, no memory used, no computation)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_file.parent)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _size_problem(model: str, config_file: Path, policy: Policy) -> str | None:
    high = policy.limits.max_model_params
    if high is None:
        return None
    try:
        count = model_parameters(config_file)
    except Exception as error:  # noqa: BLE001 - an unknown architecture is a refusal, with the reason
        return f"{model}: could not count its parameters from config.json ({short_error(error)})."
    if count > high:
        return f"{model} has {count / 1e9:.2f}B parameters; this studio allows at most {high / 1e9:.2f}B per model."
    return None


def short_error(error: Exception) -> str:
    return " ".join(str(error).split())[:200]


def _in_hub_cache(repo_id: str) -> bool:
    return _hub_cache_file(repo_id, "config.json") is not None


def _hub_cache_file(repo_id: str, name: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, name)
    return found if isinstance(found, str) else None


# ---------------------------------------------------------------------------------------------------------- dataset

MAX_SYSTEM_PROMPT = 4000  # characters


def _check_dataset(dataset: Any, policy: Policy, errors: dict[str, str]) -> dict[str, Any] | None:
    """The clean `dataset` of a spec, or None with `errors` filled in (keys `dataset.<field>`)."""
    out = _check_dataset_source(dataset, policy, errors)
    system_prompt = dataset.get("system_prompt") if isinstance(dataset, Mapping) else None
    if system_prompt is not None and (not isinstance(system_prompt, str) or len(system_prompt) > MAX_SYSTEM_PROMPT):
        errors["dataset.system_prompt"] = (f"The system prompt is text of at most {MAX_SYSTEM_PROMPT} characters "
                                           "(empty: an empty system message; null: the chat template's own).")
        return None
    if out is not None:
        # Always said (None: the chat template's own), so a stored spec keeps meaning the same under any preset.
        out["system_prompt"] = system_prompt
    return out


def _check_dataset_source(dataset: Any, policy: Policy, errors: dict[str, str]) -> dict[str, Any] | None:
    limits = policy.limits
    if not isinstance(dataset, Mapping):
        errors["dataset"] = "must be an object such as {\"source\": \"arithmetic\", \"num_prompts\": 128}."
        return None
    source = dataset.get("source", "arithmetic")
    if source == "reasoning-gym":
        return _check_task_dataset(dataset, limits, errors)
    if source not in DATASET_KEYS:
        errors["dataset.source"] = (f"Unknown dataset source {source!r}: use arithmetic, file, hub or "
                                    "reasoning-gym.")
        return None
    unknown = set(dataset) - DATASET_KEYS[source]
    if unknown:
        errors["dataset"] = (f"unknown keys {sorted(unknown)} for a {source} dataset; use "
                             f"{sorted(DATASET_KEYS[source])}.")
    out: dict[str, Any] = {"source": source}
    eval_size = _whole(dataset.get("eval_size", 0), 0, limits.max_eval_size)
    if eval_size is None:
        errors["dataset.eval_size"] = f"Eval size must be a whole number from 0 to {limits.max_eval_size}."
    seed = _whole(dataset.get("seed", 0), -2**31, 2**31 - 1)
    if seed is None:
        errors["dataset.seed"] = "Seed must be a whole number."
    if source == "arithmetic":
        num_prompts = _whole(dataset.get("num_prompts"), 1, limits.max_prompts)
        if num_prompts is None:
            errors["dataset.num_prompts"] = (f"Number of prompts must be a whole number from 1 to "
                                             f"{limits.max_prompts}.")
        difficulty = _whole(dataset.get("difficulty", 1), 1, MAX_DIFFICULTY)
        if difficulty is None:
            errors["dataset.difficulty"] = (f"Difficulty (digits per operand) must be a whole number, 1 to "
                                            f"{MAX_DIFFICULTY}.")
        operations = dataset.get("operations", "+")
        operations = "".join(operations) if isinstance(operations, list) else operations
        if not isinstance(operations, str) or not operations or set(operations) - set(ARITHMETIC_OPERATIONS):
            errors["dataset.operations"] = f"Pick at least one operation among {' '.join(ARITHMETIC_OPERATIONS)}."
        out.update(num_prompts=num_prompts, difficulty=difficulty, operations=operations, seed=seed,
                   eval_size=eval_size)
        return out
    # file and hub: at most the studio's prompt limit, even when the data has more rows
    num_prompts = dataset.get("num_prompts")
    num_prompts = limits.max_prompts if num_prompts in (None, "") else _whole(num_prompts, 1, limits.max_prompts)
    if num_prompts is None:
        errors["dataset.num_prompts"] = f"Number of prompts must be a whole number from 1 to {limits.max_prompts}."
    columns = {}
    for key in ("prompt_column", "answer_column"):
        value = dataset.get(key)
        if value not in (None, "") and (not isinstance(value, str) or len(value) > 200):
            errors[f"dataset.{key}"] = "A column name: text of at most 200 characters."
        columns[key] = value or None
    out.update(num_prompts=num_prompts, eval_size=eval_size, seed=seed, **columns)
    if source == "file":
        # "file" is the API's name (gradio_client would take any {"path": ...} object for a file to download).
        path = dataset.get("file", dataset.get("path"))
        if not isinstance(path, str) or not path.strip():
            errors["dataset.path"] = "Upload a .jsonl, .csv or .parquet file."
            return None
        resolved = policy.inside(path, policy.dataset_roots()) or policy.received_upload(path)
        if resolved is None:
            errors["dataset.path"] = (f"{path} is not an uploaded file or a file in {policy.datasets_dir}: upload it "
                                      "(the form's file box, or the API's /upload_dataset).")
        elif not resolved.is_file():
            errors["dataset.path"] = f"No file at {path}."
        elif resolved.suffix.lower() not in DATA_SUFFIXES:
            errors["dataset.path"] = (f"Unsupported file type {resolved.suffix!r}: use {', '.join(DATA_SUFFIXES)}.")
        out["path"] = str(resolved) if resolved is not None else path
        return out
    name = dataset.get("name")
    if not isinstance(name, str) or not HUB_DATASET.match(name) or ".." in name:
        errors["dataset.name"] = "Enter a hub dataset id such as openai/gsm8k (a local path is not a hub id)."
    elif not policy.allow_hub:
        errors["dataset.name"] = "Hub datasets are off on this studio: upload a file instead."
    for key, default in (("config_name", None), ("split", "train")):
        value = dataset.get(key) or default
        if value is not None and (not isinstance(value, str) or not SAFE_NAME.match(value)):
            errors[f"dataset.{key}"] = "Letters, digits, '.', '_' or '-' only."
        out[key] = value
    out["name"] = name
    return out


def _check_task_dataset(dataset: Mapping[str, Any], limits: Limits, errors: dict[str, str]) -> dict[str, Any] | None:
    from a2po import tasks

    problems = tasks.validate_task_spec(dict(dataset))
    for key, high in (("num_prompts", limits.max_prompts), ("eval_size", limits.max_eval_size)):
        value = _number(dataset.get(key))
        if value is not None and value > high:
            problems.append(f"dataset.{key} must be at most {high} on this studio (got {value:g})")
    for problem in problems:
        path, _, message = problem.partition(" ")
        key = path if path.startswith("dataset.") and not path.endswith(":") else "dataset"
        errors[key] = (errors[key] + "; " if key in errors else "") + (message if key != "dataset" else problem)
    if problems:
        return None
    out = dict(dataset)
    if not out.get("settings"):
        out.pop("settings", None)  # {} and no settings are the same task defaults: one spec for both
    return out


# ---------------------------------------------------------------------------------------------------------- spec

def _check_rewards(rewards: Any, errors: dict[str, str]) -> list[dict[str, Any]]:
    from a2po.rewards import REWARD_FUNCTIONS

    if not isinstance(rewards, list) or not rewards:
        errors["rewards"] = f"Pick at least one reward function ({', '.join(REWARD_FUNCTIONS)})."
        return []
    out = []
    for reward in rewards:
        name = reward.get("name") if isinstance(reward, Mapping) else None
        if not isinstance(reward, Mapping) or set(reward) - {"name", "weight"}:
            errors["rewards"] = "Each reward is {\"name\": ..., \"weight\": ...}."
        elif name not in REWARD_FUNCTIONS:
            errors["rewards"] = f"Unknown reward {name!r}: use one of {', '.join(REWARD_FUNCTIONS)}."
        else:
            weight = _number(reward.get("weight", 1.0))
            if weight is None or not 0 < weight <= 100:
                errors["rewards"] = f"Weight of {name} must be a number > 0 and <= 100 (got {reward.get('weight')})."
            elif name in {r["name"] for r in out}:
                errors["rewards"] = f"Reward {name} is listed twice."
            else:
                out.append({"name": name, "weight": weight})
    return out


def _check_config(config: Any, policy: Policy, errors: dict[str, str]) -> dict[str, Any]:
    from a2po.runspec import CONFIG_FIELDS

    if not isinstance(config, Mapping):
        errors["config"] = "must be an object of hyper-parameters, e.g. {\"learning_rate\": 1e-5}."
        return {}
    out: dict[str, Any] = {}
    allowed_outside = policy.allowed_operator_fields()
    for key, value in config.items():
        path = f"config.{key}"
        if key in PARAM_BY_KEY:
            clean, message = check_param(PARAM_BY_KEY[key], value, policy.limits)
            if message:
                errors[path] = message
            elif clean is not None:
                out[key] = clean
        elif key in policy.operator_fields():
            if key not in allowed_outside:
                errors[path] = (f"reaches outside the run ({_operator_reason(key)}); refused unless the operator "
                                f"starts the studio with {policy.operator_fields()[key]}.")
            else:
                problem = _check_operator_value(key, value)
                if problem:
                    errors[path] = problem
                else:
                    out[key] = value
        elif key in OUTSIDE_FIELDS:
            errors[path] = f"not allowed in a run spec: it {OUTSIDE_FIELDS[key]}."
        elif key in CONFIG_FIELDS:
            errors[path] = ("not a setting of this studio (the form's settings are: "
                            f"{', '.join(p.key for p in PARAMS)}).")
        else:
            errors[path] = "unknown setting."
    return out


def _operator_reason(key: str) -> str:
    if key in ("trust_remote_code", "model_init_kwargs"):
        return "a model repository's own Python code would run in the worker"
    return "the run would write to the Hugging Face hub with the server's token"


def _check_operator_value(key: str, value: Any) -> str | None:
    if key in ("trust_remote_code", "push_to_hub", "hub_private_repo", "hub_always_push"):
        return None if isinstance(value, bool) else "true or false."
    if key == "model_init_kwargs":
        if not isinstance(value, Mapping) or set(value) - set(SAFE_MODEL_INIT_KWARGS):
            return f"an object with some of {', '.join(SAFE_MODEL_INIT_KWARGS)}."
        return None
    if key == "hub_model_id":
        return None if isinstance(value, str) and HUB_ID.match(value) else "a hub id like org/name."
    return None if isinstance(value, str) and len(value) <= 200 else "text of at most 200 characters."


def _check_peft(peft: Any, limits: Limits, errors: dict[str, str]) -> dict[str, Any] | None:
    if peft is None or peft is False:
        return None
    if not isinstance(peft, Mapping) or set(peft) - {"r", "lora_alpha", "lora_dropout"}:
        errors["peft"] = "null, or an object with r, lora_alpha and optionally lora_dropout."
        return None
    out: dict[str, Any] = {}
    r = _whole(peft.get("r", 16), 1, limits.max_lora_rank)
    if r is None:
        errors["peft.r"] = f"LoRA rank must be a whole number from 1 to {limits.max_lora_rank}."
    alpha = _number(peft.get("lora_alpha", 32))
    if alpha is None or not 0 < alpha <= 4096:
        errors["peft.lora_alpha"] = "LoRA alpha must be > 0 and at most 4096."
    out.update(r=r, lora_alpha=alpha)
    if "lora_dropout" in peft:
        dropout = _number(peft["lora_dropout"])
        if dropout is None or not 0 <= dropout < 1:
            errors["peft.lora_dropout"] = "LoRA dropout must be in [0, 1)."
        out["lora_dropout"] = dropout
    return out


def check_spec(spec: Any, policy: Policy, *, offline: bool = False) -> SpecResult:
    """Check a run spec against the allow-list and the studio's policy (see the module docstring); a missing key
    takes the default preset's value, `preset` picks another preset. Returns the clean spec or every problem."""
    if not isinstance(spec, Mapping):
        return SpecResult(None, {"spec": "The spec must be a JSON object."})
    errors: dict[str, str] = {}
    if "num_devices" in spec:  # the old name of num_processes (specs stored, exported or cloned before the rename)
        spec = {k: v for k, v in spec.items() if k != "num_devices"} | {
            "num_processes": spec.get("num_processes", spec["num_devices"])}
    unknown = set(spec) - {*SPEC_KEYS, "preset"}
    for key in sorted(unknown):
        errors[key] = f"unknown spec key; use {', '.join(SPEC_KEYS)} (or preset)."
    try:
        full = with_defaults({k: v for k, v in spec.items() if k not in unknown})
    except ValueError as error:
        return SpecResult(None, {**errors, "preset": str(error)})
    limits = policy.limits
    name = full.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > limits.max_name_length \
            or any(ord(c) < 32 for c in name):
        errors["name"] = f"Run name: text of 1 to {limits.max_name_length} characters on one line."
    action = full.get("action")
    if action not in ACTIONS:
        errors["action"] = f"Unknown action {action!r}: use one of {', '.join(ACTIONS)}."
    problem = check_model(full.get("model"), policy, offline=offline)
    if problem:
        errors["model"] = problem
    dataset = _check_dataset(full.get("dataset"), policy, errors)
    rewards = _check_rewards(full.get("rewards"), errors)
    if dataset is not None and rewards:
        from a2po.tasks import reward_problems

        for message in reward_problems(dataset.get("source"), rewards):
            errors["rewards"] = message
    # Every form setting, explicit: a stored spec says what ran (the studio's defaults are the preset's, then the
    # form's), whatever the library's defaults become.
    given = full.get("config")
    config = _check_config({**{p.key: p.default for p in PARAMS}, **given} if isinstance(given, Mapping) else given,
                           policy, errors)
    peft = _check_peft(full.get("peft"), limits, errors)
    num_processes = _whole(full.get("num_processes", 1), 1, 64)
    if num_processes is None:
        errors["num_processes"] = ("Processes / GPUs: a whole number from 1 to 64 (one process per GPU; on a "
                                   "machine without GPUs, processes on the CPU).")
    from a2po.runspec import FSDP_STRATEGIES

    fsdp = full.get("fsdp")
    if fsdp is not None and fsdp not in FSDP_STRATEGIES:
        errors["fsdp"] = f"FSDP: null (DDP) or one of {', '.join(FSDP_STRATEGIES)}."
    elif fsdp is not None and num_processes is not None and num_processes < 2:
        errors["fsdp"] = "FSDP shards the model across processes: set num_processes to 2 or more."
    from a2po.runspec import RUNNERS

    runner = full.get("runner", "worker")
    if runner not in RUNNERS:
        errors["runner"] = f"Runner: one of {', '.join(RUNNERS)} (chunked: short chunks, as on a ZeroGPU Space)."
    elif runner == "chunked" and num_processes not in (None, 1):
        errors["runner"] = "The chunked runner runs one process: set num_processes to 1."
    if errors:
        return SpecResult(None, errors)
    clean = {"name": name.strip(), "action": action, "model": full["model"].strip(), "dataset": dataset,
             "rewards": rewards, "config": config, "peft": peft, "num_processes": num_processes}
    if fsdp is not None:
        clean["fsdp"] = fsdp
    if runner != "worker":
        clean["runner"] = runner
    problem = library_check(clean)
    return SpecResult(None, {"spec": problem}) if problem else SpecResult(clean)


def validate_spec(spec: Any, policy: Policy, offline: bool = False) -> str | None:
    """Every problem of a spec given directly (the API), in one message naming each field; None when valid."""
    result = check_spec(spec, policy, offline=offline)
    return None if result.ok else result.message()


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


def default_run_name(model: str, dataset: Mapping[str, Any]) -> str:
    """A readable run name from the model and dataset, for runs launched without one."""
    short_model = Path(model.rstrip("/")).name or model
    short_data = {"arithmetic": "arithmetic", "hub": str(dataset.get("name", "")).split("/")[-1],
                  "file": Path(str(dataset.get("path", ""))).stem,
                  "reasoning-gym": str(dataset.get("task") or "tasks")}.get(dataset.get("source"), "data")
    return f"{short_model}-{short_data}"


# ---------------------------------------------------------------------------------------------------------- form

def spec_to_form(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The launch form's flat field values for a spec (a preset, a loaded YAML config, a cloned run)."""
    spec = with_defaults(dict(spec))
    form: dict[str, Any] = {**FORM_FIELDS_DEFAULTS, "name": spec["name"], "action": spec["action"],
                            "model": spec["model"],
                            "num_processes": spec.get("num_processes", spec.get("num_devices", 1))}
    form.update({p.key: p.default for p in PARAMS})
    form.update({k: (0 if v is None and k in ZERO_MEANS_NONE else v) for k, v in spec["config"].items()
                 if k in PARAM_BY_KEY})
    dataset = spec["dataset"]
    source = dataset.get("source", "arithmetic")
    form.update(dataset_source=source, num_prompts=dataset.get("num_prompts", 128),
                difficulty=dataset.get("difficulty", 2), operations=dataset.get("operations", "+"),
                data_seed=dataset.get("seed", 0), eval_size=dataset.get("eval_size", 0))
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
    return form


def default_form(preset: str = DEFAULT_PRESET) -> dict[str, Any]:
    """The values the launch form starts with: those of `preset` (the default: the teaching demo)."""
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
    config = {p.key: form.get(p.key, p.default) for p in PARAMS}
    model = (form.get("model") or "").strip()
    name = (form.get("name") or "").strip()
    rewards = [{"name": n, "weight": w} for n, w in (form.get("rewards") or {}).items()]
    peft = {"r": form.get("lora_r"), "lora_alpha": form.get("lora_alpha")} if form.get("lora") else None
    spec = {"name": name or default_run_name(model, dataset), "action": form.get("action") or "train",
            "model": model, "dataset": dataset, "rewards": rewards, "config": config, "peft": peft}
    if form.get("num_processes") not in (None, ""):
        spec["num_processes"] = form["num_processes"]
    return spec


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
            key = FORM_KEYS.get(path, path if path in ("name", "model", "rewards", "action", "num_processes")
                                else FORM_ERROR)
        out[key] = f"{out[key]} {message}" if key in out else message
    return out


def validate_form(form: Mapping[str, Any], policy: Policy, *, columns: Sequence[str] | None = None,
                  offline: bool = False) -> FormResult:
    """Check every field of the launch form and build the run spec (through `check_spec`, like the API).

    `columns` are the dataset's columns when the caller could load them (None: not checked). Errors are keyed by
    form field (`FORM_ERROR` for the rest).
    """
    spec = form_to_spec(form)
    result = check_spec(spec, policy, offline=offline)
    errors = form_errors(result.errors)
    if result.ok and columns is not None and result.spec["dataset"]["source"] in ("file", "hub"):
        dataset = result.spec["dataset"]
        needs = {r["name"]: reward_columns(r["name"]) for r in result.spec["rewards"]}
        errors.update(check_columns(columns, dataset.get("prompt_column"), dataset.get("answer_column"),
                                    [r["name"] for r in result.spec["rewards"]], needs))
    return FormResult(None if errors else result.spec, errors)


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
