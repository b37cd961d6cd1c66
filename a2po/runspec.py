"""A run as plain data: method, model, dataset, rewards, config fields, LoRA. One spec drives the CLI and the dashboard.

    {"name": "demo", "action": "train",            # "values" (stage 1 only) | "train" | "evaluate"
     "model": "SmolLM2-135M-Instruct",             # the offline default, a hub id or a local path
     "dataset": {"source": "arithmetic", "num_prompts": 256, "difficulty": 1, "operations": "+", "seed": 0,
                 "eval_size": 64},                 # or {"source": "file"|"hub", "path"/"name": ..., "split": ...,
                                                   #     "prompt_column": ..., "answer_column": ..., "eval_size": ...}
                                                   # or {"source": "reasoning-gym", "task": ..., ...} (a2po.tasks)
     "rewards": [{"name": "exact_match", "weight": 1.0}],
     "config": {"num_value_samples": 8, "max_steps": 50, ...},   # any A2POConfig field (GRPOConfig's for grpo)
     "peft": None or {"r": 16, "lora_alpha": 32},
     "num_processes": 1,                           # >1: `accelerate launch` (DDP on GPUs, gloo on the CPU)
     "fsdp": None,                                 # or "FULL_SHARD", ...: FSDP instead of DDP (GPUs only)
     "runner": "worker",                           # the studio's: one long worker process, or "chunked":
                                                   # short chunks that each resume from disk (app.chunks)
     "method": "a2po"}                             # or "grpo": GRPOTrainer, `config` holds GRPOConfig fields;
                                                   # a spec without the key is A*-PO (and `to_dict` leaves it out)
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from a2po.config import A2POConfig, GRPOConfig

ACTIONS = ("values", "train", "evaluate")
CONFIG_CLASSES = {"a2po": A2POConfig, "grpo": GRPOConfig}  # one config class per method, as in TRL
METHODS = tuple(CONFIG_CLASSES)
RUNNERS = ("worker", "chunked")  # how the studio executes a run (`app.jobs`, `app.chunks`); the CLI ignores it
FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD")  # `accelerate launch --fsdp_sharding_strategy`
SAMPLING_FIELDS = ("num_value_samples", "temperature", "top_p", "top_k", "max_prompt_length", "max_completion_length")
DATASET_DEFAULTS = {"source": "arithmetic", "num_prompts": 256, "difficulty": 1, "operations": "+", "seed": 0,
                    "eval_size": 64}
CONFIG_FIELDS = {f.name for f in dataclasses.fields(A2POConfig)}
METHOD_CONFIG_FIELDS = {method: {f.name for f in dataclasses.fields(cls)} for method, cls in CONFIG_CLASSES.items()}
# What a studio or CLI run uses where its spec says nothing (A2POConfig itself keeps TRL's defaults).
RUN_CONFIG_DEFAULTS: dict[str, Any] = {"report_to": "none", "logging_steps": 1, "save_strategy": "steps",
                                       "save_every_seconds": 300.0, "save_total_limit": 2}


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
    # each restoring the run from its checkpoint and stored V*, as on a ZeroGPU Space; `app.chunks`). One process.
    runner: str = "worker"
    # The method: "a2po" (A*-PO) or "grpo" (GRPO on the same engine, for comparison); `config` holds that method's
    # config fields (A2POConfig's or GRPOConfig's).
    method: str = "a2po"

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> RunSpec:
        """Validate a spec; every problem is reported at once, naming the field and the fix."""
        from a2po.rewards import REWARD_FUNCTIONS

        if "num_devices" in spec:  # specs stored before the field was renamed
            spec = {**{k: v for k, v in spec.items() if k != "num_devices"},
                    "num_processes": spec.get("num_processes", spec["num_devices"])}
        unknown = set(spec) - {f.name for f in dataclasses.fields(cls)}
        problems = [f"unknown spec keys {sorted(unknown)}"] if unknown else []
        run = cls(**{k: copy.deepcopy(v) for k, v in spec.items() if k not in unknown})
        run.dataset = {**DATASET_DEFAULTS, **run.dataset} if run.dataset.get("source", "arithmetic") == "arithmetic" \
            else dict(run.dataset)
        if run.method not in METHODS:
            problems.append(f"method must be one of {METHODS} (got {run.method!r})")
            run.method = "a2po"  # check the rest against A*-PO's fields
        if run.action not in ACTIONS:
            problems.append(f"action must be one of {ACTIONS} (got {run.action!r})")
        elif run.action == "values" and run.method != "a2po":
            problems.append("action 'values' is A*-PO's stage 1 (V* estimation), and GRPO has no stage 1: use "
                            "'train' or 'evaluate'")
        if not str(run.model).strip():
            problems.append("model is empty: give a hub id, a local path or 'SmolLM2-135M-Instruct'")
        from a2po.tasks import TASK_REWARD, TASK_SOURCE, reward_problems, validate_task_spec

        source = run.dataset.get("source")
        if source == TASK_SOURCE and "rewards" not in spec:  # a task is scored by its own checker
            run.rewards = [{"name": TASK_REWARD, "weight": 1.0}]
        if source not in ("arithmetic", "file", "hub", TASK_SOURCE):
            problems.append(f"dataset.source must be 'arithmetic', 'file', 'hub' or {TASK_SOURCE!r} (got {source!r})")
        elif source == TASK_SOURCE:
            problems += validate_task_spec(run.dataset)
        problems += reward_problems(source, run.rewards)
        if not run.rewards:
            problems.append(f"rewards is empty: choose at least one of {sorted(REWARD_FUNCTIONS)}")
        for reward in run.rewards:
            if reward.get("name") not in REWARD_FUNCTIONS:
                problems.append(f"unknown reward {reward.get('name')!r}; known: {sorted(REWARD_FUNCTIONS)}")
        if isinstance(run.num_processes, bool) or not isinstance(run.num_processes, int) or run.num_processes < 1:
            problems.append(f"num_processes must be a whole number >= 1 (got {run.num_processes!r})")
        if run.fsdp is not None and run.fsdp not in FSDP_STRATEGIES:
            problems.append(f"fsdp must be None (DDP) or one of {FSDP_STRATEGIES} (got {run.fsdp!r})")
        elif run.fsdp is not None and run.num_processes < 2:
            problems.append("fsdp shards the model across processes: set num_processes >= 2 (or fsdp None)")
        if run.runner not in RUNNERS:
            problems.append(f"runner must be one of {RUNNERS} (got {run.runner!r})")
        elif run.runner == "chunked" and run.num_processes != 1:
            problems.append("the chunked runner runs one process: set num_processes to 1 (or runner 'worker')")
        if not isinstance(run.dataset.get("system_prompt", ""), (str, type(None))):
            problems.append("dataset.system_prompt must be a string (\"\" for an empty system message) or null")
        bad_fields = set(run.config) - METHOD_CONFIG_FIELDS[run.method]
        if bad_fields:
            problems.append(f"unknown {run.config_class.__name__} fields {sorted(bad_fields)}")
        if problems:
            raise ValueError("Invalid run spec: " + "; ".join(problems) + ".")
        run.build_config("/tmp/a2po-spec-check")  # the config's own checks (beta1 > 0, ...)
        return run

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if out["method"] == "a2po":  # specs stored before GRPO existed are A*-PO: keep them as they were
            del out["method"]
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
        from a2po.rewards import get_reward_function

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
        defaults = A2POConfig.__dataclass_fields__
        sampling = {k: self.config.get(k, defaults[k].default) for k in (*SAMPLING_FIELDS, "seed")}
        key = {"model": self.model, "dataset": self.dataset, "rewards": self.rewards, "sampling": sampling}
        return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def to_config_dict(self) -> dict[str, Any]:
        """The flags of `python -m a2po` that run this spec, as a mapping: the format of the `--config` YAML file
        (`to_yaml`), and what `to_cli_args` renders."""
        from a2po.presets import DEFAULT_PRESET, NO_PRESET, preset_spec

        default = preset_spec(DEFAULT_PRESET)
        out: dict[str, Any] = {"model": self.model, "run_name": self.name}
        if self.method != "a2po":
            out["method"] = self.method
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
            if key in ("reward", "reward_weights"):
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
