"""A run as plain data: method, model, dataset, rewards, config fields, LoRA. One spec drives the CLI and the dashboard.

    {"name": "demo", "action": "train",            # "values" (stage 1 only) | "train" | "evaluate"
     "model": "SmolLM2-135M-Instruct",             # the offline default, a hub id or a local path
     "dataset": {"source": "arithmetic", "num_prompts": 256, "difficulty": 1, "operations": "+", "seed": 0,
                 "eval_size": 64},                 # or {"source": "file"|"hub", "path"/"name": ..., "split": ...,
                                                   #     "prompt_column": ..., "answer_column": ..., "eval_size": ...}
                                                   # or {"source": "reasoning-gym", "task": ..., ...} (a2po.tasks)
     "rewards": [{"name": "exact_match", "weight": 1.0}],   # built-in names, or registered ones (a2po.reward_registry),
                                                   # with the "source" the studio records: {"file", "sha256", ...}
     "config": {"num_value_samples": 8, "max_steps": 50, ...},   # any A2POConfig field (GRPOConfig's for grpo)
     "peft": None or {"r": 16, "lora_alpha": 32},
     "num_processes": 1,                           # >1: `accelerate launch` (DDP on GPUs, gloo on the CPU)
     "fsdp": None,                                 # or "FULL_SHARD", ...: FSDP instead of DDP (GPUs only)
     "runner": "worker",                           # the studio's: one long worker process, or "chunked":
                                                   # short chunks that each resume from disk (app.runtime.chunks)
     "method": "a2po",                             # or "grpo": GRPOTrainer, `config` holds GRPOConfig fields;
                                                   # a spec without the key is A*-PO (and `to_dict` leaves it out)
     "recipe": None}                               # GRPO: a named recipe (a2po.recipes, e.g. "dapo") whose
                                                   # settings fill what `config` leaves out
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from a2po.config import MAX_SEED, A2POConfig, ConfigError, GRPOConfig, real_number, whole_number
from a2po.names import ACTIONS
from a2po.presets import DEFAULT_PRESET, NO_PRESET, PRESETS
from a2po.settings import RUN_CONFIG_DEFAULTS, STAGE_ONE_FIELDS, samples_stage_one, stage_one_fields
from a2po.shown import shown

CONFIG_CLASSES = {"a2po": A2POConfig, "grpo": GRPOConfig}  # one config class per method, as in TRL
METHODS = tuple(CONFIG_CLASSES)
# How the studio executes a run (`app.runtime.scheduler`, `app.runtime.chunks`); the CLI ignores it.
RUNNERS = ("worker", "chunked")
FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD")  # `accelerate launch --fsdp_sharding_strategy`
SAMPLING_FIELDS = ("num_value_samples", "temperature", "top_p", "top_k", "max_prompt_length", "max_completion_length")
DATASET_DEFAULTS = {"source": "arithmetic", "num_prompts": 256, "difficulty": 1, "operations": "+", "seed": 0,
                    "eval_size": 64}
# The keys of a dataset of each source ("reasoning-gym": `a2po.tasks.SPEC_KEYS`).
DATASET_KEYS = {
    "arithmetic": {"source", "num_prompts", "difficulty", "operations", "seed", "eval_size", "system_prompt"},
    "file": {"source", "path", "split", "config_name", "prompt_column", "answer_column", "num_prompts", "eval_size",
             "seed", "system_prompt"},
    "hub": {"source", "name", "split", "config_name", "prompt_column", "answer_column", "num_prompts", "eval_size",
            "seed", "system_prompt"},
}
PEFT_KEYS = ("r", "lora_alpha", "lora_dropout")
CONFIG_FIELDS = {f.name for f in dataclasses.fields(A2POConfig)}
# A method's fields in a run spec whatever its other settings: GRPO takes stage 1's only where it samples one
# (`method_config_fields`).
METHOD_CONFIG_FIELDS = {method: {f.name for f in dataclasses.fields(cls)} - set(STAGE_ONE_FIELDS)
                        | set(stage_one_fields(method, {})) for method, cls in CONFIG_CLASSES.items()}
_CHECK_DIR = "/tmp/a2po-spec-check"  # an output_dir for building a config only to check it (nothing is written)
# What building a config only to check it overrides, so that the check touches no device: TrainingArguments sets up
# its device, checks bf16 support and (with TF32 or torch_compile) the GPU's generation through CUDA, and the studio
# checks specs in the process it forks chunked runs from, where a started CUDA cannot be used by a forked child.
# These settings are still type-checked here; what they need of the device is checked where the run trains.
_DEVICE_FREE_CHECK = {"use_cpu": True, "tf32": None, "torch_compile": False, "torch_compile_backend": None,
                      "torch_compile_mode": None}


def _small_label(value: Any, depth: int = 0) -> bool:
    """A study label's value: a short text, a number or a bool, or (three levels deep at most) an object or a list of
    at most 12 of them: a sweep's grid point and grid (whose values may be lists, e.g. pass-rate bands)."""
    if value is None or isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, str):
        return len(value) <= 120
    if depth >= 4 or not isinstance(value, (dict, list)) or len(value) > 12:
        return False
    if isinstance(value, dict):
        return all(isinstance(k, str) and len(k) <= 40 and _small_label(v, depth + 1) for k, v in value.items())
    return all(_small_label(v, depth + 1) for v in value)


class SpecError(ValueError):
    """An invalid run spec: `problems` maps each field's path (`config.beta1`, `dataset.num_prompts`, `rewards`) to
    a sentence that names the field and the fix."""

    def __init__(self, problems: dict[str, str]) -> None:
        self.problems = dict(problems)
        super().__init__("Invalid run spec: " + "; ".join(f"{path}: {message}"
                                                          for path, message in self.problems.items()) + ".")


def _spec_keys() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(RunSpec))


def _default_model() -> str:
    from a2po.models import DEFAULT_MODEL

    return DEFAULT_MODEL


@dataclass
class RunSpec:
    name: str = "a2po-run"
    action: str = "train"
    model: str = field(default_factory=_default_model)
    dataset: dict[str, Any] = field(default_factory=lambda: dict(DATASET_DEFAULTS))
    rewards: list[dict[str, Any]] = field(default_factory=lambda: [{"name": "exact_match", "weight": 1.0}])
    config: dict[str, Any] = field(default_factory=dict)
    peft: dict[str, Any] | None = None
    # Processes of the run: 1, or several under `accelerate launch` (DDP: one per GPU; on a machine without GPUs,
    # gloo processes on the CPU). Stage 1 is sharded across them, stage 2 splits each global batch between them.
    num_processes: int = 1
    # With several GPUs, FSDP instead of DDP for a model whose weights, gradients and optimizer do not fit on one:
    # a sharding strategy of `accelerate launch --use_fsdp` (FSDP_STRATEGIES), or None (DDP). GPUs only, untested.
    fsdp: str | None = None
    # How the studio runs it: "worker" (one process from start to end) or "chunked" (a sequence of short chunks,
    # each restoring the run from its checkpoint and stored V*, as on a ZeroGPU Space; `app.runtime.chunks`). One
    # process.
    runner: str = "worker"
    # The method: "a2po" (A*-PO) or "grpo" (GRPO on the same engine, for comparison); `config` holds that method's
    # config fields (A2POConfig's or GRPOConfig's).
    method: str = "a2po"
    # The studio's: the study a run belongs to (several runs launched and read together: an "A*-PO vs GRPO" pair,
    # run seeds), a label of short values, e.g. {"id": "3f9c0a1b2e", "kind": "pair", "protocol": "paper", "seed": 0}.
    # Training ignores it; the CLI leaves it out.
    study: dict[str, Any] | None = None
    # GRPO's named recipe (`a2po.recipes`: "dapo", "dr-grpo", "gspo", ...) or None: its GRPOConfig settings fill what
    # `config` leaves out, so a validated spec's `config` holds them and `recipe` records where they came from.
    recipe: str | None = None

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> RunSpec:
        """Validate a spec (the library's rules, for the CLI and the studio alike); every problem is reported at
        once (`SpecError`), keyed by the field's path. The run it returns has its numbers converted (8.0 -> 8)."""
        if not isinstance(spec, dict):
            raise SpecError({"spec": f"a run spec is an object of {', '.join(_spec_keys())} (got {shown(spec)})"})
        if "num_devices" in spec:  # specs stored before the field was renamed
            spec = {**{k: v for k, v in spec.items() if k != "num_devices"},
                    "num_processes": spec.get("num_processes", spec["num_devices"])}
        problems = {str(k): f"unknown spec key; use {', '.join(_spec_keys())}" for k in spec if k not in _spec_keys()}
        run = cls(**{k: copy.deepcopy(v) for k, v in spec.items() if k in _spec_keys()})
        if not isinstance(run.name, str) or not run.name.strip() or any(ord(c) < 32 for c in run.name):
            problems["name"] = f"name must be text on one line, not empty (got {shown(run.name)})"
        if run.method not in METHODS:
            problems["method"] = f"method must be one of {', '.join(METHODS)} (got {shown(run.method)})"
            run.method = "a2po"  # check the rest against A*-PO's fields
        if run.action not in ACTIONS:
            problems["action"] = f"action must be one of {', '.join(ACTIONS)} (got {shown(run.action)})"
        elif run.action == "values" and run.method != "a2po":
            problems["action"] = ("action 'values' is A*-PO's stage 1 (V* estimation), and GRPO has no stage 1: use "
                                  "'train' or 'evaluate'")
        if not isinstance(run.model, str) or not run.model.strip():
            problems["model"] = (f"model is empty: give a hub id (org/name), a model folder or 'SmolLM2-135M-Instruct' "
                                 f"(got {shown(run.model)})")
        problems.update(run._dataset_problems())
        source = run.dataset.get("source") if isinstance(run.dataset, dict) else None
        from a2po.tasks import TASK_REWARD, TASK_SOURCE

        if source == TASK_SOURCE and "rewards" not in spec:  # a task is scored by its own checker
            run.rewards = [{"name": TASK_REWARD, "weight": 1.0}]
        problems.update(run._reward_problems(source))
        problems.update(run._peft_problems())
        processes = whole_number(run.num_processes)
        if processes is None or processes < 1:
            problems["num_processes"] = f"num_processes must be a whole number >= 1 (got {shown(run.num_processes)})"
        else:
            run.num_processes = processes
        if run.fsdp is not None and run.fsdp not in FSDP_STRATEGIES:
            problems["fsdp"] = f"fsdp must be None (DDP) or one of {', '.join(FSDP_STRATEGIES)} (got {shown(run.fsdp)})"
        elif run.fsdp is not None and processes is not None and processes < 2:
            problems["fsdp"] = "fsdp shards the model across processes: set num_processes >= 2 (or fsdp None)"
        problems.update(run._runner_problems())
        problems.update(run._recipe_problems())
        if run.study is not None and not (isinstance(run.study, dict) and _small_label(run.study)):
            problems["study"] = ("study must be None or a small object of short texts and numbers, and of small "
                                 "objects and lists of them (the studio's label)")
        problems.update(run._config_problems(valid=not {p.split(".")[0] for p in problems} & {"name", "dataset",
                                                                                               "rewards"}))
        if problems:
            raise SpecError(problems)
        return run

    def with_runner(self, runner: str) -> RunSpec:
        """This run as `runner` executes it (a studio whose backend runs every run one way); `SpecError` where that
        runner cannot."""
        run = dataclasses.replace(self, runner=runner)
        problems = run._runner_problems()
        if problems:
            raise SpecError(problems)
        return run

    def _runner_problems(self) -> dict[str, str]:
        if self.runner not in RUNNERS:
            return {"runner": f"runner must be one of {', '.join(RUNNERS)} (got {shown(self.runner)})"}
        if self.runner == "chunked" and whole_number(self.num_processes) not in (None, 1):
            return {"runner": "the chunked runner runs one process: set num_processes to 1 (or runner 'worker')"}
        return {}

    def _recipe_problems(self) -> dict[str, str]:
        """Problems of `recipe` (a GRPO run's, one of `a2po.recipes.RECIPES`); fills `config` with its settings where
        `config` has none of its own, and spells its name as the table does."""
        from a2po.recipes import RecipeError, apply_recipe, canonical_name

        if self.recipe is None:
            return {}
        if self.method != "grpo":
            return {"recipe": f"recipe names a GRPO variant (got {shown(self.recipe)}) and this run's method is "
                              f"{self.method!r}: set \"method\": \"grpo\", or remove the recipe"}
        try:
            self.recipe = canonical_name(self.recipe)
        except RecipeError as error:
            return {"recipe": str(error).rstrip(".")}
        if isinstance(self.config, dict):
            self.config = apply_recipe(self.recipe, self.config)
        return {}

    def _dataset_problems(self) -> dict[str, str]:
        """Problems of `dataset`, by path (`dataset.num_prompts`); converts its numbers in place."""
        from a2po.data import MAX_DIFFICULTY, OPERATIONS
        from a2po.tasks import TASK_SOURCE, validate_task_spec

        if not isinstance(self.dataset, dict):
            return {"dataset": f"dataset must be an object such as {DATASET_DEFAULTS} (got {shown(self.dataset)})"}
        if self.dataset.get("source", "arithmetic") == "arithmetic":
            self.dataset = {**DATASET_DEFAULTS, **self.dataset}
        d, problems = self.dataset, {}
        source = d.get("source")
        if source == TASK_SOURCE:
            for problem in validate_task_spec(d):
                path, _, message = problem.partition(" ")
                key = path if path.startswith("dataset.") and not path.endswith(":") else "dataset"
                problems[key] = f"{problems[key]}; {problem}" if key in problems else problem
            return problems
        if source not in DATASET_KEYS:
            return {"dataset.source": f"dataset.source must be one of {', '.join([*DATASET_KEYS, TASK_SOURCE])} "
                                      f"(got {shown(source)})"}
        unknown = set(d) - DATASET_KEYS[source]
        if unknown:
            problems["dataset"] = f"dataset has keys {sorted(unknown)} that a {source} source does not use; use " \
                                  f"{sorted(DATASET_KEYS[source])}"
        wholes = {"eval_size": (0, None), "seed": (0, MAX_SEED), "num_prompts": (1, None)}
        if source == "arithmetic":
            wholes["difficulty"] = (1, MAX_DIFFICULTY)
            operations = d.get("operations")
            if not isinstance(operations, str) or not operations or set(operations) - set(OPERATIONS):
                problems["dataset.operations"] = (f"dataset.operations must be some of {''.join(OPERATIONS)}, e.g. "
                                                  f"'+-' (got {shown(operations)})")
        optional = {"eval_size"} if source == "arithmetic" else {"eval_size", "num_prompts"}
        for key, (low, high) in wholes.items():
            if d.get(key) is None and key in optional:
                continue  # no held-out prompts; every row of the data
            number = whole_number(d.get(key))
            if number is None or number < low or (high is not None and number > high):
                bounds = f"from {low} to {high}" if high is not None else f">= {low}"
                problems[f"dataset.{key}"] = f"dataset.{key} must be a whole number {bounds} (got {shown(d.get(key))})"
            else:
                d[key] = number
        required = {"file": "path", "hub": "name"}.get(source)
        if required and (not isinstance(d.get(required), str) or not d[required].strip()):
            what = "a .jsonl, .json, .csv or .parquet file (or upload one)" if source == "file" else \
                "a hub dataset id such as openai/gsm8k"
            problems[f"dataset.{required}"] = f"dataset.{required} is empty: give {what}"
        for key in ("prompt_column", "answer_column", "split", "config_name"):
            if d.get(key) is not None and not isinstance(d[key], str):
                problems[f"dataset.{key}"] = f"dataset.{key} must be text or null (got {shown(d[key])})"
        if not isinstance(d.get("system_prompt", ""), (str, type(None))):
            problems["dataset.system_prompt"] = ("dataset.system_prompt must be a string (\"\" for an empty system "
                                                 "message) or null")
        return problems

    def _reward_problems(self, source: str | None) -> dict[str, str]:
        """Problems of `rewards` (under "rewards"): each a built-in reward or one the operator registered
        (`a2po.reward_registry`, read without importing it); gives each reward its weight as a float. A reward's
        `source` (what scored a stored run: its file and sha256) is a record, never used to find the function."""
        from a2po.reward_registry import read_registry, unknown_message
        from a2po.rewards import REWARD_FUNCTIONS
        from a2po.tasks import reward_problems

        registry = read_registry()
        known = ", ".join([*REWARD_FUNCTIONS, *registry.names()])
        if not isinstance(self.rewards, list) or not self.rewards:
            return {"rewards": f"rewards is empty: choose at least one of {known}"}
        problems, seen = [], set()
        for reward in self.rewards:
            name = reward.get("name") if isinstance(reward, dict) else None
            weight = real_number(reward.get("weight", 1.0)) if isinstance(reward, dict) else None
            if not isinstance(reward, dict) or set(reward) - {"name", "weight", "source"}:
                problems.append(f"each reward is {{\"name\": ..., \"weight\": ...}} (got {shown(reward, 60)})")
            elif name not in REWARD_FUNCTIONS and name not in registry.rewards:
                problems.append(unknown_message(name, registry))
            elif weight is None or weight <= 0:
                problems.append(f"the weight of {name} must be a number > 0 (got {shown(reward.get('weight'))})")
            elif name in seen:
                problems.append(f"reward {name} is listed twice")
            elif not isinstance(reward.get("source"), (dict, type(None))):
                problems.append(f"the source of {name} is a record {{\"file\": ..., \"sha256\": ...}} or null")
            seen.add(name)
        if not problems:
            self.rewards = [{"name": r["name"], "weight": float(r.get("weight", 1.0)),
                             **({"source": r["source"]} if r.get("source") else {})} for r in self.rewards]
            problems = reward_problems(source, self.rewards)
        return {"rewards": "; ".join(problems)} if problems else {}

    def _peft_problems(self) -> dict[str, str]:
        """Problems of `peft` (None, or LoRA's r, lora_alpha and lora_dropout), by path."""
        if self.peft is None or self.peft is False:
            self.peft = None
            return {}
        if not isinstance(self.peft, dict) or set(self.peft) - set(PEFT_KEYS):
            return {"peft": f"peft must be null (no LoRA), or an object with r, lora_alpha and optionally lora_dropout "
                            f"(got {shown(self.peft, 60)})"}
        problems = {}
        rank = whole_number(self.peft.get("r", 16))
        if rank is None or rank < 1:
            problems["peft.r"] = f"peft.r (the LoRA rank) must be a whole number >= 1 (got {shown(self.peft.get('r'))})"
        elif "r" in self.peft:
            self.peft["r"] = rank
        alpha = real_number(self.peft.get("lora_alpha", 32))
        if alpha is None or alpha <= 0:
            problems["peft.lora_alpha"] = (f"peft.lora_alpha must be a number > 0 (got "
                                           f"{shown(self.peft.get('lora_alpha'))})")
        dropout = real_number(self.peft.get("lora_dropout", 0.0))
        if dropout is None or not 0 <= dropout < 1:
            problems["peft.lora_dropout"] = (f"peft.lora_dropout must be in [0, 1) (got "
                                             f"{shown(self.peft.get('lora_dropout'))})")
        return problems

    def _config_problems(self, valid: bool) -> dict[str, str]:
        """Problems of `config`, by path (`config.beta1`: the method's config's own checks); converts its values to
        their fields' types. `valid`: the name, dataset and rewards it is built with are valid (else stand-ins are)."""
        from a2po.config import coerce_field

        name = self.config_class.__name__
        if not isinstance(self.config, dict):
            return {"config": f"config must be an object of {name} fields (got {shown(self.config)})"}
        fields = method_config_fields(self.method, self.config)
        problems = {f"config.{k}": f"{k} is not a {name} field" + (
            " without pass_rate_band (GRPO samples stage 1 only to select prompts by pass rate): set "
            f"pass_rate_band, or remove {k}" if k in STAGE_ONE_FIELDS else "") for k in self.config if k not in fields}
        known = {k: v for k, v in self.config.items() if k in fields}
        probe = self if valid else dataclasses.replace(self, name="a2po-run", dataset={}, rewards=[])
        problems.update({f"config.{k}": problem for k in _DEVICE_FREE_CHECK.keys() & known
                         if (problem := coerce_field(k, known[k], self.config_class)[1])})
        try:
            dataclasses.replace(probe, config=known).build_config(_CHECK_DIR, **_DEVICE_FREE_CHECK)
        except ConfigError as error:
            problems.update({f"config.{k}": message for k, message in error.problems.items()})
        except (ValueError, TypeError) as error:  # TrainingArguments' own checks, which name no field
            problems["config"] = str(error)
        self.config = {k: coerce_field(k, v, self.config_class)[0] for k, v in self.config.items()}
        return problems

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if out["method"] == "a2po":  # specs stored before GRPO existed are A*-PO: keep them as they were
            del out["method"]
        if out["study"] is None:  # as are specs of runs launched alone
            del out["study"]
        if out["recipe"] is None:  # and specs of runs without a recipe
            del out["recipe"]
        return out

    @property
    def config_class(self) -> type[A2POConfig] | type[GRPOConfig]:
        return CONFIG_CLASSES[self.method]

    # -- building the pieces ---------------------------------------------------------------------------------

    def build_config(self, output_dir: str, **overrides: Any) -> A2POConfig | GRPOConfig:
        """The `A2POConfig` (or `GRPOConfig`) of this run. Durable by default: a checkpoint (weights, optimizer,
        scheduler, RNG and data position) every `save_steps` steps and every `save_every_seconds` (5 min) of training,
        the newest two kept; `eval_steps` alone turns on periodic evaluation, as `save_steps` alone turns on step
        checkpoints."""
        values = {**RUN_CONFIG_DEFAULTS, **self.config, **overrides}
        if self.config.get("eval_steps") and "eval_strategy" not in self.config:
            values["eval_strategy"] = "steps"
        if self.action == "train" and self.dataset.get("eval_size"):
            values.setdefault("eval_on_start", True)  # accuracy before training, logged at step 0
        values["output_dir"] = output_dir
        values["reward_weights"] = [float(r.get("weight", 1.0)) for r in self.rewards]
        values.setdefault("run_name", self.name)
        return self.config_class(**values)

    def build_datasets(self):
        """(train, eval) datasets; eval is held out from the same source (`eval_size` rows) or None."""
        from a2po import data

        train, held_out = self._raw_datasets()
        system_prompt = self.dataset.get("system_prompt")
        return (data.with_system_prompt(train, system_prompt),
                None if held_out is None else data.with_system_prompt(held_out, system_prompt))

    def _raw_datasets(self):
        from a2po import data

        d = self.dataset
        if d["source"] == "reasoning-gym":  # held out from its own seeds (a2po.tasks)
            from a2po.tasks import datasets_from_spec

            return datasets_from_spec(d)
        if d["source"] == "arithmetic":
            full = data.arithmetic_dataset(num_prompts=int(d["num_prompts"]) + int(d.get("eval_size") or 0),
                                           operations=d.get("operations", "+"), difficulty=int(d.get("difficulty", 1)),
                                           seed=int(d.get("seed", 0)))
        else:
            source = d.get("path") if d["source"] == "file" else d.get("name")
            full = data.load_prompt_dataset(source, split=d.get("split", "train"),
                                            prompt_column=d.get("prompt_column"),
                                            answer_column=d.get("answer_column"), config_name=d.get("config_name"))
            if d.get("num_prompts"):
                full = full.select(range(min(len(full), int(d["num_prompts"]) + int(d.get("eval_size") or 0))))
        eval_size = d.get("eval_size") or 0
        if not eval_size:
            return full, None
        return data.train_eval_split(full, eval_size, seed=int(d.get("seed", 0)))

    def reward_funcs(self) -> list:
        from a2po.reward_registry import get_reward_function

        return [get_reward_function(r["name"]) for r in self.rewards]

    def peft_config(self):
        if not self.peft:
            return None
        from peft import LoraConfig

        options = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear",
                   "task_type": "CAUSAL_LM", **self.peft}
        return LoraConfig(**options)

    def build_trainer(self, output_dir: str, callbacks: list | None = None, train_dataset=None, eval_dataset=None,
                      **config_overrides: Any):
        """An `A2POTrainer` (or `GRPOTrainer`) for this spec (datasets may be passed in, e.g. with known `v_star`
        values)."""
        if self.method == "grpo":
            from a2po.grpo_trainer import GRPOTrainer as trainer_class
        else:
            from a2po.trainer import A2POTrainer as trainer_class

        if train_dataset is None and eval_dataset is None:
            train_dataset, eval_dataset = self.build_datasets()
        return trainer_class(model=self.model, reward_funcs=self.reward_funcs(),
                           args=self.build_config(output_dir, **config_overrides), train_dataset=train_dataset,
                           eval_dataset=eval_dataset, callbacks=callbacks, peft_config=self.peft_config())

    # -- identity and rendering -------------------------------------------------------------------------------

    def value_fingerprint(self) -> str:
        """Identifies a V* set: the same model, dataset, rewards, sampling settings and seed give the same V*
        samples (each is a function of the seed, the prompt and the sample index)."""
        from a2po.device import bf16_by_default
        from a2po.values import loading_key

        defaults = self.config_class.__dataclass_fields__
        sampling = {k: self.config.get(k, defaults[k].default) for k in (*SAMPLING_FIELDS, "seed")}
        sampling["top_k"] = sampling["top_k"] or None  # GRPO's 0 and A*-PO's None both turn top-k off
        if self.config.get("values_seed") is not None:  # stage 1's own seed (a sweep's runs share one)
            sampling["seed"] = self.config["values_seed"]
        # A registered function counts by its source's hash: edited, it scores differently (built-ins: by name).
        rewards = [{**{k: v for k, v in r.items() if k != "source"},
                    **({"sha256": r["source"].get("sha256")} if isinstance(r.get("source"), dict) else {})}
                   for r in self.rewards]
        key = {"model": self.model, "dataset": self.dataset, "rewards": rewards, "sampling": sampling}
        # How the model loads (revision, dtype, ...), the sampler and the precision it samples in, `bf16`'s default
        # resolved as the run will (on a GPU: bf16), so a CPU set and a GPU set of one spec are two sets.
        resolved = {**self.config, "bf16": bf16_by_default(self.config)}
        if loading := loading_key(resolved.get):
            key["loading"] = loading
        return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def to_config_dict(self) -> dict[str, Any]:
        """The flags of `python -m a2po` that run this spec, as a mapping: the format of the `--config` YAML file
        (`to_yaml`), and what `to_cli_args` renders."""
        default = preset_spec(DEFAULT_PRESET)
        out: dict[str, Any] = {"model": self.model, "run_name": self.name}
        if self.method != "a2po":
            out["method"] = self.method
        if self.recipe is not None:
            out["recipe"] = self.recipe
        # The CLI starts from the default preset (the fields of this run's method): a spec that leaves some of its
        # settings out says so.
        if (set(default["config"]) & METHOD_CONFIG_FIELDS[self.method]) - set(self.config):
            out["preset"] = NO_PRESET
        d = self.dataset
        if d["source"] == "arithmetic":
            out["dataset"] = "arithmetic"
            out.update({"dataset_seed" if k == "seed" else k: d[k] for k in ("num_prompts", "difficulty",
                                                                               "operations", "seed") if k in d})
        elif d["source"] == "reasoning-gym":
            out["dataset"] = "reasoning-gym"
            if d.get("tasks"):
                out["tasks"] = json.dumps(d["tasks"])
            else:
                out["task"] = str(d.get("task"))
                if d.get("settings"):
                    out["task_settings"] = json.dumps(d["settings"])
            out.update({"dataset_seed" if k == "seed" else k: d[k] for k in ("num_prompts", "seed")
                        if d.get(k) is not None})
            if d.get("answer_format") is not None:
                out["answer_format"] = d["answer_format"]
        else:
            out["dataset"] = str(d.get("path") or d.get("name"))
            out.update({"dataset_split" if k == "split" else k: d[k] for k in ("split", "config_name", "prompt_column",
                                                                                "answer_column", "num_prompts")
                        if d.get(k)})
        out["eval_size"] = d.get("eval_size") or 0
        if d.get("system_prompt") is not None:
            out["system_prompt"] = d["system_prompt"]
        elif d["source"] == default["dataset"]["source"] and default["dataset"].get("system_prompt") is not None:
            out["preset"] = NO_PRESET  # else the CLI would take the preset's system prompt for this dataset
        out["reward"] = [r["name"] for r in self.rewards]
        modules = [r["source"]["file"] for r in self.rewards if isinstance(r.get("source"), dict)
                   and r["source"].get("origin") == "file" and r["source"].get("file")]
        if modules:
            out["reward_module"] = list(dict.fromkeys(modules))
        if any(float(r.get("weight", 1.0)) != 1.0 for r in self.rewards):
            out["reward_weights"] = [float(r.get("weight", 1.0)) for r in self.rewards]
        out.update(self.config)
        if self.peft:
            out.update(lora_r=self.peft.get("r", 16), lora_alpha=self.peft.get("lora_alpha", 32))
        if getattr(self, "num_processes", 1) != 1:
            out["num_processes"] = self.num_processes
        return out

    def to_cli_args(self) -> list[str]:
        """The `python -m a2po` arguments that run this spec."""
        args = [self.action]
        for key, value in self.to_config_dict().items():
            if key in ("reward", "reward_weights", "reward_module", "pass_rate_band") and value is not None:
                args += [f"--{key}", *map(str, value)]
            else:
                args += [f"--{key}", json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
        return args

    def to_yaml(self) -> str:
        """This spec as a YAML file for `python -m a2po <action> --config FILE` (and the dashboard's Load)."""
        import yaml

        method = {"a2po": "A*-PO", "grpo": "GRPO"}[self.method]
        header = f"# {method} run '{self.name}': python -m a2po {self.action} --config <this file>\n"
        return header + yaml.safe_dump(self.to_config_dict(), sort_keys=False, allow_unicode=True)

    def command(self) -> str:
        return "python -m a2po " + shlex.join(self.to_cli_args())


# ------------------------------------------------------------------------------------------------- presets

def method_config_fields(method: str, config: dict[str, Any]) -> set[str]:
    """The fields a run spec of `method` with `config` may set: its method's, and stage 1's where it samples one."""
    return METHOD_CONFIG_FIELDS.get(method, set()) | set(stage_one_fields(method, config))


def value_fingerprint_of(spec: dict[str, Any]) -> str | None:
    """The V* set a stored run spec samples or reads (`RunSpec.value_fingerprint`); None for a run without stage 1
    (GRPO that does not select by pass rate), an evaluation, or a spec that no longer reads."""
    action, config = spec.get("action", "train"), spec.get("config")
    if action not in ("train", "values") or not samples_stage_one(spec.get("method", "a2po"), config or {}, action):
        return None
    try:
        return RunSpec.from_dict(spec).value_fingerprint()
    except ValueError:
        return None


def preset_spec(name: str = DEFAULT_PRESET) -> dict[str, Any]:
    """A copy of preset `name` (a complete run spec; "none": the library's defaults, `RunSpec()`, with an empty
    config, so every setting is A2POConfig's)."""
    if name == NO_PRESET:
        library = RunSpec().to_dict()
        return {k: library[k] for k in ("name", "action", "model", "dataset", "rewards", "config", "peft")}
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}: use one of {', '.join([*PRESETS, NO_PRESET])}.")
    return copy.deepcopy(PRESETS[name])


def with_defaults(spec: dict[str, Any], preset: str | None = None) -> dict[str, Any]:
    """`spec` completed from a preset (`preset`, else `spec["preset"]`, else the default): keys it gives win;
    its `config` is merged key by key (for a method other than A*-PO, only the preset's settings that method has);
    a `dataset` of the preset's source is merged, one of another source replaces the preset's; a GRPO spec's
    `recipe` (`a2po.recipes`) sets what its `config` leaves out, over the preset's. The result has no "preset" key."""
    spec = dict(spec)
    name = preset or spec.get("preset") or DEFAULT_PRESET
    spec.pop("preset", None)
    base = preset_spec(name)
    out = {**base, **{k: copy.deepcopy(v) for k, v in spec.items() if k not in ("config", "dataset")}}
    method = spec.get("method", "a2po")
    if method != "a2po":  # a preset's A*-PO-only settings (N, beta1, ...) mean nothing to another method
        fields = METHOD_CONFIG_FIELDS.get(method, set())
        if isinstance(spec.get("config"), dict):
            fields = method_config_fields(method, spec["config"])
        out["config"] = base["config"] = {k: v for k, v in base["config"].items() if k in fields}
    if isinstance(spec.get("config"), dict):
        out["config"] = {**base["config"], **copy.deepcopy(spec["config"])}
    elif "config" in spec:
        out["config"] = spec["config"]  # not a dict: left for validation to report
    if method == "grpo" and spec.get("recipe") is not None and isinstance(out["config"], dict):
        from a2po.recipes import RecipeError, apply_recipe

        try:  # a recipe wins over the preset, the spec's own settings over the recipe
            out["config"] = {**base["config"], **apply_recipe(spec["recipe"], spec.get("config") or {})}
        except RecipeError:
            pass  # validation names it
    dataset = spec.get("dataset")
    if isinstance(dataset, dict) and dataset.get("source", base["dataset"]["source"]) == base["dataset"]["source"]:
        out["dataset"] = {**base["dataset"], **copy.deepcopy(dataset)}
    elif "dataset" in spec:
        out["dataset"] = copy.deepcopy(dataset)
    if "rewards" not in spec and isinstance(out["dataset"], dict) and out["dataset"].get("source") == "reasoning-gym":
        out["rewards"] = [{"name": "task_checker", "weight": 1.0}]  # a task is scored by its own checker
    return out
