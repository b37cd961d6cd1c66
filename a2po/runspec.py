"""A run as plain data: model, dataset, rewards, A2POConfig fields, LoRA. One spec drives the CLI and the dashboard.

    {"name": "demo", "action": "train",            # "values" (stage 1 only) | "train" | "evaluate"
     "model": "SmolLM2-135M-Instruct",             # the offline default, a hub id or a local path
     "dataset": {"source": "arithmetic", "num_prompts": 256, "difficulty": 1, "operations": "+", "seed": 0,
                 "eval_size": 64},                 # or {"source": "file"|"hub", "path"/"name": ..., "split": ...,
                                                   #     "prompt_column": ..., "answer_column": ..., "eval_size": ...}
                                                   # or {"source": "reasoning-gym", "task": ..., ...} (a2po.tasks)
     "rewards": [{"name": "exact_match", "weight": 1.0}],
     "config": {"num_value_samples": 8, "max_steps": 50, ...},   # any A2POConfig field
     "peft": None or {"r": 16, "lora_alpha": 32}}
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from a2po.config import A2POConfig

ACTIONS = ("values", "train", "evaluate")
SAMPLING_FIELDS = ("num_value_samples", "temperature", "top_p", "top_k", "max_prompt_length", "max_completion_length")
DATASET_DEFAULTS = {"source": "arithmetic", "num_prompts": 256, "difficulty": 1, "operations": "+", "seed": 0,
                    "eval_size": 64}
CONFIG_FIELDS = {f.name for f in dataclasses.fields(A2POConfig)}
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
    num_devices: int = 1  # GPUs the run takes (the studio's scheduler); on a CPU-only machine the machine

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> RunSpec:
        """Validate a spec; every problem is reported at once, naming the field and the fix."""
        from a2po.rewards import REWARD_FUNCTIONS

        unknown = set(spec) - {f.name for f in dataclasses.fields(cls)}
        problems = [f"unknown spec keys {sorted(unknown)}"] if unknown else []
        run = cls(**{k: copy.deepcopy(v) for k, v in spec.items() if k not in unknown})
        run.dataset = {**DATASET_DEFAULTS, **run.dataset} if run.dataset.get("source", "arithmetic") == "arithmetic" \
            else dict(run.dataset)
        if run.action not in ACTIONS:
            problems.append(f"action must be one of {ACTIONS} (got {run.action!r})")
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
        if isinstance(run.num_devices, bool) or not isinstance(run.num_devices, int) or run.num_devices < 1:
            problems.append(f"num_devices must be a whole number >= 1 (got {run.num_devices!r})")
        bad_fields = set(run.config) - CONFIG_FIELDS
        if bad_fields:
            problems.append(f"unknown A2POConfig fields {sorted(bad_fields)}")
        if problems:
            raise ValueError("Invalid run spec: " + "; ".join(problems) + ".")
        run.build_config("/tmp/a2po-spec-check")  # A2POConfig's own checks (beta1 > 0, ...)
        return run

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # -- building the pieces ---------------------------------------------------------------------------------

    def build_config(self, output_dir: str, **overrides: Any) -> A2POConfig:
        """The `A2POConfig` of this run. Durable by default: a checkpoint (weights, optimizer, scheduler, RNG and
        data position) every `save_steps` steps and every `save_every_seconds` (5 min) of training, the newest two
        kept; `eval_steps` alone turns on periodic evaluation, as `save_steps` alone turns on step checkpoints."""
        values = {**RUN_CONFIG_DEFAULTS, **self.config, **overrides}
        if self.config.get("eval_steps") and "eval_strategy" not in self.config:
            values["eval_strategy"] = "steps"
        values["output_dir"] = output_dir
        values["reward_weights"] = [float(r.get("weight", 1.0)) for r in self.rewards]
        values.setdefault("run_name", self.name)
        return A2POConfig(**values)

    def build_datasets(self):
        """(train, eval) datasets; eval is held out from the same source (`eval_size` rows) or None."""
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
        """An `A2POTrainer` for this spec (datasets may be passed in, e.g. with known `v_star` values)."""
        from a2po.trainer import A2POTrainer

        if train_dataset is None and eval_dataset is None:
            train_dataset, eval_dataset = self.build_datasets()
        return A2POTrainer(model=self.model, reward_funcs=self.reward_funcs(),
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

    def to_cli_args(self) -> list[str]:
        """The `python -m a2po` arguments that run this spec."""
        command = {"values": "values", "train": "train", "evaluate": "evaluate"}[self.action]
        args = [command, "--model", self.model, "--run_name", self.name]
        d = self.dataset
        if d["source"] == "arithmetic":
            args += ["--dataset", "arithmetic"]
            for key in ("num_prompts", "difficulty", "operations", "seed"):
                if key in d:
                    args += [f"--{'dataset_seed' if key == 'seed' else key}", str(d[key])]
        elif d["source"] == "reasoning-gym":
            args += ["--dataset", "reasoning-gym"]
            if d.get("tasks"):
                args += ["--tasks", json.dumps(d["tasks"])]
            else:
                args += ["--task", str(d.get("task"))] + (["--task_settings", json.dumps(d["settings"])]
                                                          if d.get("settings") else [])
            for key in ("num_prompts", "seed"):
                if d.get(key) is not None:
                    args += [f"--{'dataset_seed' if key == 'seed' else key}", str(d[key])]
        else:
            args += ["--dataset", str(d.get("path") or d.get("name"))]
            for key in ("split", "config_name", "prompt_column", "answer_column", "num_prompts"):
                if d.get(key):
                    args += [f"--{'dataset_split' if key == 'split' else key}", str(d[key])]
        args += ["--eval_size", str(d.get("eval_size") or 0)]
        args += ["--reward", *[r["name"] for r in self.rewards]]
        if any(float(r.get("weight", 1.0)) != 1.0 for r in self.rewards):
            args += ["--reward_weights", *[str(float(r.get("weight", 1.0))) for r in self.rewards]]
        for key, value in self.config.items():
            args += [f"--{key}", json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
        if self.peft:
            args += ["--lora_r", str(self.peft.get("r", 16)), "--lora_alpha", str(self.peft.get("lora_alpha", 32))]
        return args

    def command(self) -> str:
        return "python -m a2po " + shlex.join(self.to_cli_args())
