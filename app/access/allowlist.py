"""The one allow-list of run specs: what a spec may ask of this studio.

Every way to start a run (the launch form, the named API, a YAML config loaded in the form, "clone this run")
goes through `check_spec(spec, policy)`. A missing key takes its preset's value (`a2po.runspec.with_defaults`;
a setting the preset does not name, the library's own default). Whether a spec is *valid* is the library's
verdict (`a2po.runspec.RunSpec.from_dict`, which the CLI runs too); this module adds only the studio's *policy*:

- in `config`, only the form's hyper-parameters (`PARAMS`: config fields, whose types, vocabularies, defaults and
  methods are `a2po.settings`', with the form's labels), each bounded by the studio's `Limits`; fields that
  reach outside the run (remote code, hub pushes) only when the operator allowed them with a flag, and nothing
  else: `values_path`, `output_dir`, `report_to`, `deepspeed`, ... are refused;
- datasets from the built-in generators, files inside `<data-dir>/datasets/` or received by Gradio's upload route
  (the form's file box), hub ids that look like hub ids (when the hub is allowed); models built in, under a model
  root, or hub ids; at most the studio's numbers of prompts, samples, tokens, steps, processes...;
- `use_vllm` only where the studio's machine has vLLM, outside a ZeroGPU Space, in one process and not in chunks.

Every problem, the library's and the policy's, is reported at once, each once, keyed by the field's path
(`config.beta1`, `dataset.path`); the form shows each next to its field. Apart from looking at the file system,
everything here is a pure function.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from a2po.reward_registry import stamp_sources
from a2po.settings import (
    CHOICES,
    VLLM_FIELDS,
    config_default,
    methods_of,
    setting_kind,
    stage_one_fields,
    vllm_install_problem,
    vllm_run_problem,
)
from a2po.shown import shown
from app.access.policy import Limits, Policy

if TYPE_CHECKING:
    from a2po.runspec import RunSpec

DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
MAX_CONFIG_KEYS = 200  # settings one spec may name (A2POConfig and TrainingArguments have about 150)
MAX_LISTED = 20  # problems one refusal lists
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
HUB_DATASET = re.compile(r"^([A-Za-z0-9][\w.-]{0,95}/)?[\w.-]{1,96}$")  # "gsm8k" or "openai/gsm8k"
SAFE_NAME = re.compile(r"^[\w.-]{1,64}$")  # a hub config or split name
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
STUDY_LEFT_OUT = ("The spec's \"study\" label was left out: only the studio puts runs into a study (an \"A*-PO vs "
                  "GRPO\" pair, seeds or a sweep, launched together). This run is launched on its own, outside any "
                  "study.")


@dataclass(frozen=True)
class Param:
    """One setting of the form: a config field, whose type, vocabulary, default and methods are the library's
    (`a2po.settings`; its validity too), and what only the form needs: its label, whether it sits under "Advanced",
    its help and the `Limits` field bounding it from above."""

    key: str
    label: str
    advanced: bool = False
    info: str = ""
    limit: str = ""  # the `Limits` field bounding it from above
    narrowed: tuple[str, ...] = ()  # the choices this studio offers, where fewer than the field takes
    whole: bool = False  # a float field the form takes in whole numbers

    @property
    def kind(self) -> str:
        """The form's input: "int", "float", "bool", "choice" or "band" ([low, high], on the form "low, high")."""
        if self.narrowed:
            return "choice"
        kind = setting_kind(self.key)
        return "int" if self.whole and kind == "float" else kind

    @property
    def choices(self) -> tuple[str, ...]:
        return self.narrowed or CHOICES.get(self.key, ())

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods (`RunSpec.method`) whose config has the setting."""
        return methods_of(self.key)


PARAMS: list[Param] = [
    Param("num_value_samples", "N: reference samples per prompt", limit="max_value_samples",
          info="Stage 1 samples N completions per prompt to estimate V*."),
    Param("pass_rate_band", "Pass-rate band: low, high (empty: every prompt)",
          info="Train only on prompts whose reference pass rate (stage 1: correct of N) lies in the band, e.g. "
               "0.125, 0.875. GRPO then samples stage 1 for it, on its clock."),
    Param("beta1", "β₁ (V* temperature)", info="Soft-max temperature of the V* estimate."),
    Param("beta2", "β₂ (KL temperature)", info="Scale of the implicit reward in stage 2."),
    # GRPO's own settings (TRL's GRPOConfig names); G is bounded as N is: both are samples per prompt.
    Param("num_generations", "G: completions per prompt per step", limit="max_value_samples",
          info="GRPO samples G completions of each prompt at every step."),
    Param("beta", "β (KL coefficient; 0: no reference model)"),
    Param("loss_type", "Loss aggregation"),
    Param("scale_rewards", "Advantage scaling", advanced=True),
    Param("epsilon", "ε (lower clipping bound)", advanced=True),
    Param("epsilon_high", "ε high (upper clipping bound; 0: ε)", advanced=True),
    Param("num_iterations", "Optimizer steps per generation (μ)", advanced=True, limit="max_epochs"),
    # The rest of the settings the named recipes (a2po.recipes) set, with TRL's names.
    Param("mask_truncated_completions", "Leave truncated completions (no EOS) out of the loss", advanced=True),
    Param("importance_sampling_level", "Importance ratio per token, or per sequence (GSPO)", advanced=True,
          info="Acts only off-policy: with μ = 1 every ratio is 1 when the gradient is taken."),
    Param("multi_objective_aggregation", "Several rewards: sum then normalize, or normalize each (GDPO)",
          advanced=True),
    Param("top_entropy_quantile", "Train on the top-entropy share of tokens (1: all)", advanced=True),
    Param("sapo_temperature_pos", "SAPO: gate temperature, positive advantages", advanced=True),
    Param("sapo_temperature_neg", "SAPO: gate temperature, other advantages", advanced=True),
    Param("learning_rate", "Learning rate"),
    Param("max_steps", "Max steps", limit="max_steps", info="-1: train for num_train_epochs."),
    Param("per_device_train_batch_size", "Batch size (prompts per step; GRPO: completions, G per prompt)",
          limit="max_batch_size", info="GRPO counts completions, as TRL does: G × the prompts per step."),
    Param("max_completion_length", "Max completion tokens", limit="max_completion_length",
          info="Arithmetic answers are short; use 256+ for step-by-step math."),
    Param("temperature", "Sampling temperature"),
    Param("num_train_epochs", "Epochs", advanced=True, limit="max_epochs"),
    Param("lr_scheduler_type", "Learning-rate schedule", advanced=True, narrowed=SCHEDULERS),
    Param("warmup_steps", "Warm-up (steps, or a fraction < 1 of all steps)", advanced=True, limit="max_steps"),
    Param("weight_decay", "Weight decay", advanced=True),
    Param("max_grad_norm", "Gradient clipping (max norm; 0: off)", advanced=True),
    Param("max_prompt_length", "Max prompt tokens", advanced=True, limit="max_prompt_length"),
    Param("top_p", "top-p", advanced=True),
    Param("top_k", "top-k (0: off)", advanced=True),
    Param("gradient_accumulation_steps", "Gradient accumulation steps", advanced=True, limit="max_batch_size"),
    Param("gradient_checkpointing", "Gradient checkpointing (less memory, slower)", advanced=True),
    Param("value_batch_size", "Stage-1 prompts per batch (0: 256 sequences)", advanced=True, limit="max_batch_size"),
    Param("per_device_eval_batch_size", "Evaluation batch size", advanced=True, limit="max_batch_size"),
    Param("logging_steps", "Log every N steps", advanced=True, whole=True),
    Param("eval_steps", "Evaluate every N steps, or a fraction < 1 of all steps (0: only at the end)",
          advanced=True),
    Param("save_steps", "Checkpoint every N steps", advanced=True, whole=True),
    Param("save_every_seconds", "Checkpoint every N seconds of training (0: off)", advanced=True, whole=True),
    Param("max_train_seconds", "Training-time budget in seconds, stage 1 included (0: none)",
          advanced=True, info="Stops when the run's clock (stage 1 + training steps) reaches it."),
    Param("eval_every_seconds", "Evaluate every N seconds of training (0: off)", advanced=True),
    Param("max_train_flops", "Compute budget in FLOPs, stage 1 included (0: none)", advanced=True,
          info="Stops when the run's compute (FLOPs from the tokens it processed: the same on every machine) reaches "
               "it, e.g. 2e15."),
    Param("eval_every_flops", "Evaluate every N FLOPs of compute (0: off)", advanced=True),
    Param("seed", "Seed", advanced=True, info="Stage-1 samples and training follow from it."),
    Param("filter_all_incorrect", "Drop prompts no reference sample solved", advanced=True),
    Param("values_seed", "Stage-1 seed (empty: the run seed)", advanced=True,
          info="Runs with one stage-1 seed share one V* set; a sweep sets it for all its runs."),
    Param("use_cpu", "Force CPU", advanced=True),
    # vLLM as the sampler (TRL's names): only where this studio's machine has it (`vllm_problem`).
    Param("use_vllm", "Sample with vLLM (colocated)", advanced=True,
          info="Stage 1, the rollouts and evaluation sample with a vLLM engine in the training process; the loss's "
               "log-probabilities stay the trainer's own."),
    Param("vllm_gpu_memory_utilization", "vLLM: share of the GPU's memory", advanced=True,
          info="With vLLM: the share of the GPU's memory its engine takes (weights and KV cache)."),
]
PARAM_BY_KEY = {p.key: p for p in PARAMS}
# Settings an empty form field leaves out of the spec (their library default is another setting's value).
EMPTY_MEANS_UNSET = {"values_seed", "pass_rate_band"}
# The form's settings that only vLLM reads: honoured with `use_vllm`, so refused without it unless left at their
# default.
VLLM_ONLY = tuple(p.key for p in PARAMS if p.key in VLLM_FIELDS and p.key != "use_vllm")
VLLM_OFF = "Turn use_vllm off (\"Sample with vLLM\" on the form): the native decoder samples."
# Settings whose 0 on the form means None (off, or the library's automatic choice).
ZERO_MEANS_NONE = {"top_k", "value_batch_size", "eval_steps", "epsilon_high", "max_train_seconds",
                   "eval_every_seconds", "max_train_flops", "eval_every_flops"}


def method_params(method: str) -> list[Param]:
    """The form's settings a run of `method` has (whatever its other settings)."""
    return [p for p in PARAMS if method in p.methods]


@dataclass
class SpecResult:
    """A clean spec when `errors` is empty, else the problems keyed by field path (`config.beta1`). An accepted
    run spec comes with the run the library parsed it into (`run`, an `a2po.runspec.RunSpec`): what the gate queues,
    as it is, so that a spec is parsed and checked once."""

    spec: dict[str, Any] | None
    errors: dict[str, str] = field(default_factory=dict)
    # Accepted, but worth saying: a registered reward that changed since the spec recorded it (a clone).
    warnings: list[str] = field(default_factory=list)
    run: RunSpec | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    def message(self) -> str:
        """Every problem in one line, for an API error (the first `MAX_LISTED` of them, and how many more)."""
        listed = list(self.errors.items())[:MAX_LISTED]
        more = len(self.errors) - len(listed)
        return ("Invalid run spec: " + " ".join(f"{path}: {message}" for path, message in listed)
                + (f" And {more} more problem(s)." if more else ""))


# ---------------------------------------------------------------------------------------------------------- values

def _number(value: Any) -> float | None:
    """A number to hold against a limit (None: not a number, which the library reports)."""
    from a2po.config import real_number

    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 1e300:
        return math.inf if value > 0 else -math.inf  # past float's range: still held against its limit
    return real_number(value)


def check_param(param: Param, value: Any, limits: Limits) -> tuple[Any, str | None]:
    """The studio's policy on a value for `param`: at most its limit, one of the form's choices; 0 means None
    (off) for the `ZERO_MEANS_NONE` settings. Returns (value, problem or None); whether the value is valid at all
    is the library's to say."""
    if param.kind == "choice" and value not in param.choices:
        return value, f"{param.label}: one of {', '.join(param.choices)} on this studio (got {shown(value)})."
    number = _number(value) if param.kind in ("int", "float") else None
    high = getattr(limits, param.limit) if param.limit else None
    if number is not None and high is not None and number > high:
        return value, f"{param.label} must be at most {high:g} on this studio (got {number:g})."
    if param.key in ZERO_MEANS_NONE and number == 0:
        return None, None
    return value, None


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


def full_finetune_problem(model: str, policy: Policy) -> str | None:
    """Why `model` may not be trained without LoRA here, or None (`Limits.max_full_finetune_params`; a ZeroGPU Space
    sets it: each chunk restores and saves the whole model with its optimizer state, docs/spaces.md). Called after
    `check_model` accepted the model; a size that cannot be read (the default model before its first conversion,
    SmolLM2-135M) is not refused here."""
    from a2po.models import DEFAULT_MODEL, default_cache_dir, is_default_model

    high = policy.limits.max_full_finetune_params
    if high is None:
        return None
    if is_default_model(model):
        config: str | Path | None = default_cache_dir() / DEFAULT_MODEL / "config.json"
    elif model.startswith(("/", ".", "~")):
        config = policy.inside(model, policy.local_model_roots()) / "config.json"
    else:
        config = _hub_cache_file(model, "config.json")
    if config is None or not Path(config).is_file():
        return None
    try:
        count = model_parameters(Path(config))
    except Exception:  # noqa: BLE001 - check_model's size check names it where a size limit applies
        return None
    if count > high:
        return (f"{model} has {count / 1e9:.2f}B parameters; this studio trains every weight of models up to "
                f"{high / 1e9:.2f}B only: train it with LoRA (the form's LoRA box, or \"peft\" in a spec).")
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
MAX_COLUMN_NAME = 200  # characters
MAX_PROCESSES = 64  # per run, whatever the machine (the scheduler also holds a run to the machine's devices)


def _check_dataset(dataset: Any, policy: Policy, errors: dict[str, str]) -> Any:
    """The dataset as the studio states it (the API's "file" key read as "path", a file's path resolved, the
    system prompt always said, a file or hub dataset at most the prompt limit long), with `errors` filled in for
    what the studio's policy refuses (keys `dataset.<field>`). Whether it is valid is the library's to say."""
    if not isinstance(dataset, Mapping):
        return dataset
    limits, out = policy.limits, dict(dataset)
    for key, label, high in (("num_prompts", "Number of prompts", limits.max_prompts),
                             ("eval_size", "Eval size", limits.max_eval_size)):
        number = _number(out.get(key))
        if number is not None and number > high:
            errors[f"dataset.{key}"] = f"{label} must be at most {high} on this studio (got {number:g})."
    system_prompt = out.get("system_prompt")
    if isinstance(system_prompt, str) and len(system_prompt) > MAX_SYSTEM_PROMPT:
        errors["dataset.system_prompt"] = (f"The system prompt is text of at most {MAX_SYSTEM_PROMPT} characters on "
                                           "this studio (empty: an empty system message; null: the chat template's "
                                           "own).")
    # Always said (None: the chat template's own), so a stored spec keeps meaning the same under any preset.
    out["system_prompt"] = system_prompt
    source = out.get("source", "arithmetic")
    if source == "reasoning-gym" and not out.get("settings"):
        out.pop("settings", None)  # {} and no settings are the same task defaults: one spec for both
    if source == "arithmetic" and isinstance(out.get("operations"), list):
        out["operations"] = "".join(map(str, out["operations"]))  # the form's check boxes
    if source not in ("file", "hub"):
        return out
    # What the library reads where these are left out, said explicitly; at most the studio's prompt limit, even
    # when the data has more rows.
    if out.get("num_prompts") in (None, ""):
        out["num_prompts"] = limits.max_prompts
    out.setdefault("eval_size", 0)
    out.setdefault("seed", 0)
    out["split"] = out.get("split") or "train"
    out["config_name"] = out.get("config_name") or None
    for key in ("prompt_column", "answer_column"):
        out[key] = out.get(key) or None
        if isinstance(out[key], str) and len(out[key]) > MAX_COLUMN_NAME:
            errors[f"dataset.{key}"] = f"A column name: text of at most {MAX_COLUMN_NAME} characters on this studio."
    if source == "file":
        # "file" is the API's name (gradio_client would take any {"path": ...} object for a file to download).
        path = out.pop("file", out.get("path"))
        out["path"] = path
        if isinstance(path, str) and path.strip():
            out["path"] = _check_data_file(path, policy, errors)
        out.pop("config_name")
        return out
    name = out.get("name")
    if isinstance(name, str) and name.strip():
        if not HUB_DATASET.match(name) or ".." in name:
            errors["dataset.name"] = "Enter a hub dataset id such as openai/gsm8k (a local path is not a hub id)."
        elif not policy.allow_hub:
            errors["dataset.name"] = "Hub datasets are off on this studio: upload a file instead."
    for key in ("config_name", "split"):
        if isinstance(out[key], str) and not SAFE_NAME.match(out[key]):
            errors[f"dataset.{key}"] = "Letters, digits, '.', '_' or '-' only."
    return out


def _check_data_file(path: str, policy: Policy, errors: dict[str, str]) -> str:
    """A data file's resolved path when the studio lets runs read it (in `<data-dir>/datasets`, or received by
    Gradio's upload route), else `path` with the reason in `errors["dataset.path"]`."""
    resolved = policy.inside(path, policy.dataset_roots()) or policy.received_upload(path)
    if resolved is None:
        errors["dataset.path"] = (f"{path} is not an uploaded file or a file in {policy.datasets_dir}: upload it "
                                  "(the form's file box, or the API's /upload_dataset).")
        return path
    if not resolved.is_file():
        errors["dataset.path"] = f"No file at {path}."
    elif resolved.suffix.lower() not in DATA_SUFFIXES:
        errors["dataset.path"] = f"Unsupported file type {resolved.suffix!r}: use {', '.join(DATA_SUFFIXES)}."
    return str(resolved)


# ---------------------------------------------------------------------------------------------------------- spec

METHOD_NAMES = {"a2po": "A*-PO", "grpo": "GRPO"}


def _check_config(config: Any, policy: Policy, errors: dict[str, str], method: str = "a2po") -> Any:
    """The settings the studio lets a spec make (the form's, and those the operator's flags open), within its
    limits; a refused one is left out, with the reason in `errors` (keys `config.<field>`)."""
    from a2po.runspec import CONFIG_FIELDS, METHOD_CONFIG_FIELDS

    if not isinstance(config, Mapping):
        return config
    if len(config) > MAX_CONFIG_KEYS:
        errors["config"] = (f"config has {len(config):,} settings; a spec sets at most {MAX_CONFIG_KEYS} (the form has "
                            f"{len(PARAMS)}).")
        return {}
    out: dict[str, Any] = {}
    allowed_outside = policy.allowed_operator_fields()
    stage_one = stage_one_fields(method, config) if method in METHOD_NAMES else ()
    for key, value in config.items():
        path = f"config.{key}"
        param = PARAM_BY_KEY.get(key)
        if param is not None and method in METHOD_NAMES and method not in param.methods and key not in stage_one:
            owner = " and ".join(METHOD_NAMES[m] for m in param.methods)
            errors[path] = (f"{param.label} is a setting of {owner} runs, not of {METHOD_NAMES[method]} runs: "
                            f"remove it, or set \"method\" to {param.methods[0]!r}.")
        elif key in PARAM_BY_KEY:
            if method == "grpo" and key == "per_device_train_batch_size":
                param = replace(param, limit="")  # completions, not prompts: `_check_grpo_batch` bounds it
            clean, message = check_param(param, value, policy.limits)
            if message:
                errors[path] = message
            elif clean is not None or key not in ZERO_MEANS_NONE:  # else off: the library's default
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
        elif key in CONFIG_FIELDS | METHOD_CONFIG_FIELDS.get(method, set()):
            errors[path] = ("not a setting of this studio (the form's settings are: "
                            f"{', '.join(p.key for p in method_params(method))}).")
        else:
            errors[path] = "unknown setting."
    return out


def _operator_reason(key: str) -> str:
    if key in ("trust_remote_code", "model_init_kwargs"):
        return "a model repository's own Python code would run in the worker"
    return "the run would write to the Hugging Face hub with the server's token"


def _check_operator_value(key: str, value: Any) -> str | None:
    if key == "model_init_kwargs":
        if not isinstance(value, Mapping) or set(value) - set(SAFE_MODEL_INIT_KWARGS):
            return f"an object with some of {', '.join(SAFE_MODEL_INIT_KWARGS)}."
        return None
    if key == "hub_model_id":
        return None if isinstance(value, str) and HUB_ID.match(value) else "a hub id like org/name."
    if key in ("hub_strategy", "hub_revision"):
        return None if not isinstance(value, str) or len(value) <= 200 else "text of at most 200 characters."
    return None  # a flag (trust_remote_code, push_to_hub, ...): its type is the library's to check


def check_spec(spec: Any, policy: Policy, *, offline: bool = False) -> SpecResult:
    """Check a run spec: the library's verdict on it (`RunSpec.from_dict`) and the studio's policy (see the module
    docstring); a missing key takes its preset's value (`preset` picks one; the default: the teaching demo), a
    setting the preset does not name the library's default. Returns the clean spec, or every problem, each once."""
    from a2po.runspec import RunSpec, SpecError, with_defaults

    if not isinstance(spec, Mapping):
        return SpecResult(None, {"spec": "The spec must be a JSON object."})
    if "num_devices" in spec:  # the old name of num_processes (specs stored, exported or cloned before the rename)
        spec = {k: v for k, v in spec.items() if k != "num_devices"} | {
            "num_processes": spec.get("num_processes", spec["num_devices"])}
    try:
        full = with_defaults(dict(spec))
    except ValueError as error:
        return SpecResult(None, {"preset": str(error)})
    errors: dict[str, str] = {}
    limits = policy.limits
    name, model = full.get("name"), full.get("model")
    if isinstance(name, str) and len(name) > limits.max_name_length:
        errors["name"] = f"Run name: at most {limits.max_name_length} characters on this studio (got {len(name)})."
    if isinstance(model, str) and model.strip():
        problem = check_model(model, policy, offline=offline)
        if problem:
            errors["model"] = problem
        elif full.get("peft") is None and (problem := full_finetune_problem(model.strip(), policy)):
            errors["peft"] = problem
    # Every form setting, explicit: a stored spec says what ran (the preset's value, else the library's default),
    # whatever the library's defaults become.
    method = full.get("method", "a2po")
    known = method if method in METHOD_NAMES else "a2po"  # an unknown method is the library's to name
    given = full.get("config")
    if isinstance(given, Mapping):
        given = {**{p.key: config_default(p.key, known) for p in method_params(known)
                    if p.key not in EMPTY_MEANS_UNSET}, **given}
    candidate = {**full, "dataset": _check_dataset(full.get("dataset"), policy, errors),
                 "config": _check_config(given, policy, errors, method)}
    if method == "grpo" and isinstance(candidate["config"], Mapping):
        _check_grpo_batch(candidate["config"], policy.limits, errors)
    if isinstance(candidate["config"], Mapping):
        _check_vllm(full, candidate["config"], policy, errors)
    peft = full.get("peft")
    rank = _number(peft.get("r")) if isinstance(peft, Mapping) else None
    if rank is not None and rank > limits.max_lora_rank:
        errors["peft.r"] = f"LoRA rank must be at most {limits.max_lora_rank} on this studio (got {rank:g})."
    processes = _number(full.get("num_processes"))
    if processes is not None and processes > MAX_PROCESSES:
        errors["num_processes"] = f"Processes / GPUs: at most {MAX_PROCESSES} per run (got {processes:g})."
    try:
        run = RunSpec.from_dict(candidate)
    except SpecError as invalid:
        for path, message in invalid.problems.items():
            message += "."
            errors[path] = f"{errors[path]} {message}" if path in errors else message
        return SpecResult(None, errors)
    if errors:
        return SpecResult(None, errors)
    # A registered reward's source is the studio's record, never a spec's: what the operator registered now.
    rewards, warnings = stamp_sources(run.rewards)
    clean = {"name": run.name.strip(), "action": run.action, "model": run.model.strip(), "dataset": run.dataset,
             "rewards": rewards, "config": run.config, "peft": run.peft, "num_processes": run.num_processes}
    if run.fsdp is not None:
        clean["fsdp"] = run.fsdp
    if run.runner != "worker":
        clean["runner"] = run.runner
    if run.method != "a2po":  # a spec stored before GRPO existed is A*-PO: A*-PO specs keep that shape
        clean["method"] = run.method
    if run.recipe is not None:  # the named GRPO recipe its settings came from (a2po.recipes), as RunSpec spells it
        clean["recipe"] = run.recipe
    if run.study is not None:
        # Study membership is nothing but this label: kept from a spec, it would put a run into anyone's study.
        warnings = [*warnings, STUDY_LEFT_OUT]
    run = replace(run, name=clean["name"], model=clean["model"], rewards=rewards, study=None)
    return SpecResult(copy.deepcopy(clean), warnings=warnings, run=run)


def _check_grpo_batch(config: Mapping[str, Any], limits: Limits, errors: dict[str, str]) -> None:
    """GRPO's batch counts completions (G per prompt), so the studio's batch limit, on prompts per step for A*-PO,
    bounds its prompts per step too: batch / G; the batch must hold whole groups, which the library checks."""
    batch, group = _number(config.get("per_device_train_batch_size")), _number(config.get("num_generations"))
    key = "config.per_device_train_batch_size"
    if batch is not None and group and key not in errors and batch / group > limits.max_batch_size:
        errors[key] = (f"GRPO's batch counts completions: {batch:g} / G={group:g} is {batch / group:g} prompts per "
                       f"step, and this studio allows at most {limits.max_batch_size} prompts per step.")


def vllm_problem(policy: Policy) -> str | None:
    """Why no run of this studio may sample with vLLM, or None: on a ZeroGPU Space, or without vLLM beside the
    studio (its workers run the studio's Python)."""
    if policy.zerogpu:
        return ("vLLM is not offered on a ZeroGPU Space: a run there is a series of short GPU calls (chunks), and "
                "each would start a vLLM engine again.")
    missing = vllm_install_problem("beside this studio")
    if missing:
        return (f"{missing}. Its workers run the studio's Python: the operator installs it there and restarts the "
                "studio.")
    return None


def _check_vllm(spec: Mapping[str, Any], config: dict[str, Any], policy: Policy, errors: dict[str, str]) -> None:
    """`use_vllm` only where its run can have it (`vllm_problem`, `a2po.settings.vllm_run_problem`), and the
    settings only vLLM reads only with it. A refused `use_vllm` is left out of `config`, so its reason is said once."""
    if config.get("use_vllm") is not True:
        for key in VLLM_ONLY:
            value, default = config.get(key), config_default(key)
            if value is not None and value != default and _number(value) != default and f"config.{key}" not in errors:
                errors[f"config.{key}"] = (f"{PARAM_BY_KEY[key].label} is read only when vLLM samples: turn use_vllm "
                                           f"on, or leave it at {shown(default)}.")
        return
    problem = vllm_problem(policy)
    processes = _number(spec.get("num_processes"))
    if problem is not None:
        problem = f"{problem} {VLLM_OFF}"
    else:
        problem = vllm_run_problem(processes or 1, spec.get("runner") or "worker")
    if problem is not None:
        errors["config.use_vllm"] = problem
        del config["use_vllm"]


def check_dataset(dataset: Any, policy: Policy) -> SpecResult:
    """A dataset alone, as `check_spec` checks it in a spec (for a preview while other fields have problems): the
    clean dataset in `spec`, or its problems."""
    result = check_spec({"preset": "none", "dataset": dataset}, policy)
    errors = {k: v for k, v in result.errors.items() if k.split(".")[0] == "dataset"}
    if errors or result.spec is None:
        return SpecResult(None, errors or result.errors)
    return SpecResult(result.spec["dataset"])
