"""Command line: `python -m a2po {train,values,evaluate} [--config run.yaml] [--any_A2POConfig_field value]`.

    python -m a2po train --model SmolLM2-135M-Instruct --dataset arithmetic --reward exact_match --max_steps 50
    python -m a2po values --dataset data.jsonl --reward math_equivalence      # stage 1 only, saves the V* table
    python -m a2po evaluate --model outputs/demo --dataset arithmetic         # greedy accuracy on held-out prompts
    python -m a2po train --dataset reasoning-gym --task chain_sum --task_settings '{"max_terms": 3}'
    python -m a2po train --dataset reasoning-gym --tasks '[{"task": "chain_sum", "weight": 2}, {"task": "countdown"}]'

Every `A2POConfig` field is a flag; `--config` reads a YAML file of the same names (flags override it).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from transformers import HfArgumentParser

from a2po.config import A2POConfig
from a2po.runspec import RunSpec
from a2po.tasks import TASK_REWARD, TASK_SOURCE, TASKS
from a2po.values import save_optimal_values, summarize

COMMANDS = ("train", "values", "evaluate")


@dataclass
class ScriptArguments:
    """What to train on: model, data and rewards (the rest is `A2POConfig`)."""

    model: str = field(default="SmolLM2-135M-Instruct",
                       metadata={"help": "Hub id, local path, or SmolLM2-135M-Instruct (offline default)."})
    dataset: str = field(default="arithmetic", metadata={"help": "'arithmetic', 'reasoning-gym', a "
                                                                 ".jsonl/.csv/.parquet file, or a hub dataset id."})
    dataset_split: str = field(default="train", metadata={"help": "Split of a file or hub dataset."})
    config_name: str | None = field(default=None, metadata={"help": "Hub dataset configuration (e.g. 'main')."})
    prompt_column: str | None = field(default=None, metadata={"help": "Column holding the prompts."})
    answer_column: str | None = field(default=None, metadata={"help": "Column holding the reference answers."})
    num_prompts: int | None = field(default=None, metadata={"help": "Training prompts (arithmetic: 256)."})
    difficulty: int = field(default=1, metadata={"help": "Arithmetic: digits per operand."})
    operations: str = field(default="+", metadata={"help": "Arithmetic: operations, e.g. '+-*'."})
    dataset_seed: int = field(default=0, metadata={"help": "Arithmetic generator / split seed."})
    eval_size: int = field(default=64, metadata={"help": "Prompts held out for evaluation (0: none)."})
    task: str | None = field(default=None, metadata={"help": "reasoning-gym: the task, e.g. chain_sum (a2po.tasks)."})
    task_settings: str | None = field(default=None, metadata={"help": "reasoning-gym: the task's settings as JSON, "
                                                                      "e.g. '{\"max_terms\": 3}'."})
    tasks: str | None = field(default=None, metadata={"help": "reasoning-gym: a weighted mix as JSON, e.g. "
                                                              "'[{\"task\": \"chain_sum\", \"weight\": 2}]'."})
    reward: list[str] = field(default_factory=list, metadata={"help": "Reward functions: exact_match (the default), "
                                                                      "math_equivalence; task_checker (reasoning-gym's "
                                                                      "default and only reward)."})
    lora_r: int = field(default=0, metadata={"help": "LoRA rank; 0 trains all weights."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})


def spec_from_args(command: str, script: ScriptArguments, config_fields: dict) -> RunSpec:
    if script.dataset == "arithmetic":
        dataset = {"source": "arithmetic", "num_prompts": script.num_prompts or 256, "difficulty": script.difficulty,
                   "operations": script.operations, "seed": script.dataset_seed, "eval_size": script.eval_size}
    elif script.dataset == TASK_SOURCE:
        if not (script.task or script.tasks):
            raise SystemExit(f"--dataset {TASK_SOURCE} needs --task NAME (one of {', '.join(TASKS)}) or --tasks JSON.")
        dataset = {"source": TASK_SOURCE, "num_prompts": script.num_prompts or 256, "eval_size": script.eval_size,
                   "seed": script.dataset_seed}
        if script.tasks:
            dataset["tasks"] = _json_flag("--tasks", script.tasks)
        else:
            dataset.update(task=script.task, settings=_json_flag("--task_settings", script.task_settings) or {})
    else:
        is_file = Path(script.dataset).exists()
        dataset = {"source": "file" if is_file else "hub", ("path" if is_file else "name"): script.dataset,
                   "split": script.dataset_split, "config_name": script.config_name,
                   "prompt_column": script.prompt_column, "answer_column": script.answer_column,
                   "num_prompts": script.num_prompts, "eval_size": script.eval_size, "seed": script.dataset_seed}
    names = script.reward or [TASK_REWARD if script.dataset == TASK_SOURCE else "exact_match"]
    weights = config_fields.pop("reward_weights", None) or [1.0] * len(names)
    if len(weights) != len(names):
        raise SystemExit(f"--reward_weights has {len(weights)} values for {len(names)} rewards.")
    rewards = [{"name": n, "weight": float(w)} for n, w in zip(names, weights)]
    peft = {"r": script.lora_r, "lora_alpha": script.lora_alpha} if script.lora_r else None
    name = config_fields.pop("run_name", None) or f"{command}-{Path(script.model).name}"
    return RunSpec.from_dict({"name": name, "action": command, "model": script.model, "dataset": dataset,
                              "rewards": rewards, "config": config_fields, "peft": peft})


def _json_flag(flag: str, value: str | dict | list | None):
    """A JSON flag's value (a YAML config may give it already parsed)."""
    if value is None or isinstance(value, (dict, list)):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise SystemExit(f"{flag} must be JSON, e.g. '{{\"max_terms\": 3}}' (got {value!r}: {error}).") from None


def parse(argv: list[str]) -> tuple[str, ScriptArguments, A2POConfig, dict]:
    if not argv or argv[0] not in COMMANDS:
        raise SystemExit(f"usage: python -m a2po {{{','.join(COMMANDS)}}} [--config run.yaml] [options]\n"
                         "Run `python -m a2po train --help` for every option.")
    command, rest = argv[0], argv[1:]
    parser = HfArgumentParser((ScriptArguments, A2POConfig))
    parser.prog = f"python -m a2po {command}"
    if "--config" in rest:
        i = rest.index("--config")
        with open(rest[i + 1]) as f:
            parser.set_defaults(**(yaml.safe_load(f) or {}))
        rest = rest[:i] + rest[i + 2:]
    parser.set_defaults(output_dir=None)
    script, config = parser.parse_args_into_dataclasses(args=rest)
    # Only fields the user set (flags or YAML) go into the spec; defaults stay defaults.
    defaults = A2POConfig.__dataclass_fields__
    given = {action.dest for action in parser._actions if action.dest in defaults and
             any(opt in rest for opt in action.option_strings)}
    given |= {k for k in parser._defaults if k in defaults} - {"output_dir"}
    fields = {k: getattr(config, k) for k in given}
    return command, script, config, fields


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command, script, config, fields = parse(argv)
    output_dir = config.output_dir or str(Path("outputs") / (fields.get("run_name") or f"{command}-run"))
    fields.pop("output_dir", None)
    spec = spec_from_args(command, script, fields)
    trainer = spec.build_trainer(output_dir=output_dir)
    if command == "values":
        for split in ["train", *trainer.eval_sets()]:
            table = trainer.estimate_optimal_values(split=split)
            path = Path(output_dir) / f"optimal_values_{split}.jsonl"
            save_optimal_values(table, path)
            print(json.dumps({"split": split, **summarize(table.to_list(), trainer.args.num_value_samples)}))
            print(f"V* table: {path}")
    elif command == "train":
        if trainer.eval_dataset is not None:
            before = trainer.evaluate(metric_key_prefix="eval_before")
            print(json.dumps(before))
        trainer.train()
        trainer.save_model(output_dir)
        if trainer.eval_dataset is not None:
            print(json.dumps(trainer.evaluate()))
    else:
        if trainer.eval_dataset is None:
            raise SystemExit("evaluate needs held-out prompts: set --eval_size > 0.")
        print(json.dumps(trainer.evaluate()))
    print(f"Output directory: {Path(output_dir).resolve()}")
    return 0
