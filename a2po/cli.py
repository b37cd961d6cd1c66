"""Command line: `python -m a2po {train,values,evaluate,sweep} [--method grpo] [--config run.yaml] [--any_field value]`.

    python -m a2po train --model SmolLM2-135M-Instruct --dataset arithmetic --reward exact_match --max_steps 50
    python -m a2po values --dataset data.jsonl --reward math_equivalence      # stage 1 only, saves the V* table
    python -m a2po evaluate --model outputs/demo --dataset arithmetic         # greedy accuracy on held-out prompts
    python -m a2po train --dataset reasoning-gym --task chain_sum --task_settings '{"max_terms": 3}'
    python -m a2po train --dataset reasoning-gym --tasks '[{"task": "chain_sum", "weight": 2}, {"task": "countdown"}]'
    python -m a2po train --num_processes 2 ...    # runs itself again under `accelerate launch` (DDP; gloo on a CPU)
    python -m a2po train ... --resume_from_checkpoint outputs/demo/checkpoint-40   # or `true`: newest in output_dir
    python -m a2po train --method grpo --num_generations 8 --beta 0.0 --loss_type dapo   # GRPO, same engine
    python -m a2po train --method grpo --recipe dr-grpo        # a named GRPO variant's settings (a2po.recipes)
    python -m a2po train --reward-module my_rewards.py --reward my_check   # a reward of your own (a file's function)
    python -m a2po train --reward my_lib.rewards.check                      # ... or its dotted import path
    python -m a2po sweep --grid beta2=1e-3,1e-2 --grid learning_rate=1e-5,2e-5 --seeds 0 1 2   # a2po.sweep

Every field of the method's config (`A2POConfig`, or `GRPOConfig` with `--method grpo`) is a flag; `--config` reads
a YAML file of the same names (flags override it). `--recipe` sets the settings of a named GRPO variant that no flag
sets (a flag wins over the recipe, the recipe over the preset).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from transformers import HfArgumentParser

from a2po.checkpoints import checkpoint_folders, newest_complete
from a2po.config import A2POConfig, ConfigError, GRPOConfig
from a2po.device import precision_summary, warn_unused_gpu
from a2po.names import ACTIONS
from a2po.presets import DEFAULT_PRESET, NO_PRESET, PRESETS
from a2po.recipes import RECIPES
from a2po.runspec import CONFIG_CLASSES, METHODS, RunSpec, SpecError, with_defaults
from a2po.shown import shown
from a2po.tasks import TASK_SOURCE, TASKS
from a2po.values import save_optimal_values, summarize


@dataclass
class ScriptArguments:
    """What to train on: method, model, data and rewards (the rest is the method's config)."""

    method: str = field(default="a2po", metadata={"help": "a2po (A*-PO, the default) or grpo (GRPO on the same "
                                                          "engine, for comparison): which config's flags apply."})
    recipe: str | None = field(default=None, metadata={"help": "GRPO: a named variant whose GRPOConfig settings "
                                                               "fill what no flag sets (a2po.recipes: "
                                                               f"{', '.join(RECIPES)})."})
    preset: str = field(default=DEFAULT_PRESET, metadata={"help": "The run to start from (a2po.presets: "
                                                                  f"{', '.join([*PRESETS, NO_PRESET])}; none: the "
                                                                  "library's defaults); flags change it."})
    model: str | None = field(default=None, metadata={"help": "Hub id, local path, or SmolLM2-135M-Instruct (the "
                                                              "offline default)."})
    dataset: str | None = field(default=None, metadata={"help": "'arithmetic', 'reasoning-gym', a "
                                                                ".jsonl/.csv/.parquet file, or a hub dataset id."})
    dataset_split: str = field(default="train", metadata={"help": "Split of a file or hub dataset."})
    config_name: str | None = field(default=None, metadata={"help": "Hub dataset configuration (e.g. 'main')."})
    prompt_column: str | None = field(default=None, metadata={"help": "Column holding the prompts."})
    answer_column: str | None = field(default=None, metadata={"help": "Column holding the reference answers."})
    num_prompts: int | None = field(default=None, metadata={"help": "Training prompts (the preset's: 256)."})
    difficulty: int | None = field(default=None, metadata={"help": "Arithmetic: digits per operand."})
    operations: str | None = field(default=None, metadata={"help": "Arithmetic: operations, e.g. '+-*'."})
    dataset_seed: int | None = field(default=None, metadata={"help": "Generator / split seed."})
    eval_size: int | None = field(default=None, metadata={"help": "Prompts held out for evaluation (0: none; "
                                                                  "the preset's: 64)."})
    system_prompt: str | None = field(default=None, metadata={"help": "A system message for every conversational "
                                                                      "prompt ('' for an empty one; unset: the "
                                                                      "preset's, or the chat template's own)."})
    task: str | None = field(default=None, metadata={"help": "reasoning-gym: the task, e.g. chain_sum (a2po.tasks)."})
    task_settings: str | None = field(default=None, metadata={"help": "reasoning-gym: the task's settings as JSON, "
                                                                      "e.g. '{\"max_terms\": 3}'."})
    answer_format: str | None = field(default=None, metadata={"help": "reasoning-gym: 'tags' (the answer between "
                                                                      "<answer> tags; the default) or 'number' (the "
                                                                      "last number; numeric tasks)."})
    tasks: str | None = field(default=None, metadata={"help": "reasoning-gym: a weighted mix as JSON, e.g. "
                                                              "'[{\"task\": \"chain_sum\", \"weight\": 2}]'."})
    reward: list[str] = field(default_factory=list, metadata={"help": "Reward functions: exact_match (the default), "
                                                                      "math_equivalence; task_checker (reasoning-gym's "
                                                                      "default and only reward); a function of a "
                                                                      "--reward-module file; an installed a2po.rewards "
                                                                      "entry point; or a dotted import path such as "
                                                                      "my_lib.rewards.check."})
    reward_module: list[str] = field(default_factory=list, metadata={"help": "A .py file of reward functions "
                                                                             "(repeatable): its public functions that "
                                                                             "take `completions` become rewards named "
                                                                             "after them (a2po.reward_registry)."})
    lora_r: int = field(default=0, metadata={"help": "LoRA rank; 0 trains all weights."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    num_processes: int = field(default=1, metadata={"help": "Processes: more than 1 runs the command again under "
                                                            "`accelerate launch` (DDP, one process per GPU; on a "
                                                            "machine without GPUs, gloo processes on the CPU)."})


def spec_from_args(command: str, script: ScriptArguments, config_fields: dict) -> RunSpec:
    """The run the flags describe: the preset, changed by every flag given (and only those)."""
    given = {"num_prompts": script.num_prompts, "eval_size": script.eval_size, "seed": script.dataset_seed,
             "system_prompt": script.system_prompt}
    given = {k: v for k, v in given.items() if v is not None}
    if script.dataset in (None, "arithmetic"):
        dataset = {**given, **{k: v for k, v in (("difficulty", script.difficulty), ("operations", script.operations))
                               if v is not None}}
        if script.dataset:
            dataset["source"] = "arithmetic"
    elif script.dataset == TASK_SOURCE:
        if not (script.task or script.tasks):
            raise SystemExit(f"--dataset {TASK_SOURCE} needs --task NAME (one of {', '.join(TASKS)}) or --tasks JSON.")
        dataset = {"source": TASK_SOURCE, "num_prompts": 256, "eval_size": 64, "seed": 0, **given}
        if script.answer_format is not None:
            dataset["answer_format"] = script.answer_format
        if script.tasks:
            dataset["tasks"] = _json_flag("--tasks", script.tasks)
        else:
            dataset.update(task=script.task, settings=_json_flag("--task_settings", script.task_settings) or {})
    else:
        is_file = Path(script.dataset).exists()
        dataset = {"source": "file" if is_file else "hub", ("path" if is_file else "name"): script.dataset,
                   "split": script.dataset_split, "config_name": script.config_name,
                   "prompt_column": script.prompt_column, "answer_column": script.answer_column,
                   "num_prompts": None, "eval_size": 64, "seed": 0, **given}
    run_name = config_fields.pop("run_name", None)
    partial: dict = {"action": command, "config": config_fields}
    if script.method != "a2po":
        partial["method"] = script.method
    if script.recipe:
        partial["recipe"] = script.recipe  # RunSpec.from_dict refuses an unknown one, or one for A*-PO
    if dataset:
        partial["dataset"] = dataset
    if script.model:
        partial["model"] = script.model
    if script.reward or config_fields.get("reward_weights"):
        names = script.reward or ["exact_match"]
        weights = config_fields.pop("reward_weights", None) or [1.0] * len(names)
        if len(weights) != len(names):
            raise SystemExit(f"--reward_weights has {len(weights)} values for {len(names)} rewards.")
        partial["rewards"] = [{"name": n, "weight": float(w)} for n, w in zip(names, weights)]
    if script.lora_r:
        partial["peft"] = {"r": script.lora_r, "lora_alpha": script.lora_alpha}
    if script.num_processes != 1:
        partial["num_processes"] = script.num_processes
    try:
        spec = with_defaults(partial, script.preset)
    except ValueError as error:
        raise SystemExit(f"--preset: {error}") from None
    spec["name"] = run_name or f"{command}-{Path(spec['model']).name}"
    return RunSpec.from_dict(spec)


def _json_flag(flag: str, value: str | dict | list | None):
    """A JSON flag's value (a YAML config may give it already parsed)."""
    if value is None or isinstance(value, (dict, list)):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise SystemExit(f"{flag} must be JSON, e.g. '{{\"max_terms\": 3}}' (got {value!r}: {error}).") from None


def _recipe_flag(recipe: str, method: str) -> str:
    """`--recipe`'s name as `a2po.recipes` spells it; exits naming the recipes, or the method, before anything runs."""
    from a2po.recipes import RecipeError, canonical_name

    if method != "grpo":
        raise SystemExit(f"--recipe {recipe} names a GRPO variant: add --method grpo (this run's method is {method}).")
    try:
        return canonical_name(recipe)
    except RecipeError as error:
        raise SystemExit(f"--recipe: {error}") from None


def _method_of(rest: list[str], from_file: dict) -> str:
    """The `--method` of the command line (else of the YAML file, else "a2po"): it decides which config parses."""
    method = from_file.get("method", "a2po")
    for i, arg in enumerate(rest):
        if arg == "--method" and i + 1 < len(rest):
            method = rest[i + 1]
        elif arg.startswith("--method="):
            method = arg.split("=", 1)[1]
    if method not in METHODS:
        raise SystemExit(f"--method must be one of {', '.join(METHODS)} (got {method!r}).")
    return method


def parse(argv: list[str]) -> tuple[str, ScriptArguments, A2POConfig | GRPOConfig, dict]:
    if not argv or argv[0] not in ACTIONS:
        commands = ",".join((*ACTIONS, "sweep"))
        raise SystemExit(f"usage: python -m a2po {{{commands}}} [--method grpo] [--config run.yaml] "
                         "[options]\nRun `python -m a2po train --help` (or `train --method grpo --help`) for every "
                         "option.")
    command, rest = argv[0], argv[1:]
    from_file = {}
    rest, modules = _reward_module_flags(rest)
    if modules:
        rest += ["--reward_module", *modules]
    if "--config" in rest:
        i = rest.index("--config")
        try:
            from_file = read_config_file(rest[i + 1]) or {}
        except ValueError as error:
            raise SystemExit(str(error)) from None
        rest = rest[:i] + rest[i + 2:]
    config_class = CONFIG_CLASSES[_method_of(rest, from_file)]
    parser = HfArgumentParser((ScriptArguments, config_class))
    parser.prog = f"python -m a2po {command}"
    parser.set_defaults(**from_file)
    parser.set_defaults(output_dir=None)
    script, config = parser.parse_args_into_dataclasses(args=rest)
    if script.recipe:
        script.recipe = _recipe_flag(script.recipe, script.method)
    # Only fields the user set (flags or YAML) go into the spec; defaults stay defaults.
    defaults = config_class.__dataclass_fields__
    given = {action.dest for action in parser._actions if action.dest in defaults and
             any(opt in rest for opt in action.option_strings)}
    given |= {k for k in parser._defaults if k in defaults} - {"output_dir"}
    fields = {k: getattr(config, k) for k in given}
    return command, script, config, fields


REWARD_MODULE_FLAGS = ("--reward-module", "--reward_module")


def _reward_module_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """`args` without their `--reward-module` flags, and the files those name: the flag may be repeated (argparse
    would keep only the last one) and take several files."""
    rest, modules, taking = [], [], False
    for arg in args:
        flag, equals, value = arg.partition("=")
        if flag in REWARD_MODULE_FLAGS:
            taking = not equals
            if equals:
                modules.append(value)
        elif taking and not arg.startswith("--"):
            modules.append(arg)
        else:
            taking = False
            rest.append(arg)
    return rest, modules


def register_rewards(script: ScriptArguments) -> None:
    """Register the files of `--reward-module` and the dotted paths of `--reward` (`my_lib.rewards.check`) for this
    process and those it starts (`accelerate launch`); a bad one exits with the reason."""
    from a2po.reward_registry import RewardRegistryError, read_registry, register_modules
    from a2po.rewards import REWARD_FUNCTIONS

    try:
        register_modules(script.reward_module)
        registry = read_registry()
        dotted = [n for n in script.reward if "." in n and n.strip().lower() not in REWARD_FUNCTIONS
                  and n.strip() not in registry.rewards]
        register_modules(dotted)
    except RewardRegistryError as error:
        raise SystemExit(f"--reward-module / --reward: {error}") from None


def resume_checkpoint(command: str, value: str | None, output_dir: str) -> str | None:
    """The checkpoint folder `--resume_from_checkpoint` names, as `trainer.train(resume_from_checkpoint=...)` takes
    it: a folder, or `true` for the newest complete checkpoint in `output_dir` (transformers' `True`). Exits naming
    the problem when there is none to resume, before anything is written."""
    if value is None or (str(value).strip().lower() in ("", "false", "none") and not Path(str(value)).exists()):
        return None
    if command != "train":
        raise SystemExit(f"--resume_from_checkpoint continues training: it applies to `train`, not `{command}` "
                         "(to use a checkpoint's weights, pass it as --model).")
    value = str(value).strip()
    if value.lower() == "true" and not Path(value).exists():
        newest = newest_complete(checkpoint_folders(output_dir))
        if newest is None:
            raise SystemExit(f"--resume_from_checkpoint true: no complete checkpoint (a checkpoint-N folder with "
                             f"trainer_state.json and the weights) in the output directory {output_dir}; pass "
                             "--output_dir of the run to resume, or the checkpoint folder itself.")
        return str(newest)
    folder = Path(value).expanduser()
    if not folder.is_dir():
        raise SystemExit(f"--resume_from_checkpoint {value}: no such folder. Pass a checkpoint folder of an earlier "
                         "run (e.g. outputs/my-run/checkpoint-40), or `true` for the newest one in --output_dir.")
    if not (folder / "trainer_state.json").is_file():
        raise SystemExit(f"--resume_from_checkpoint {value}: not a complete checkpoint (it has no "
                         "trainer_state.json, written last by a save). Pass a checkpoint-N folder of an earlier "
                         "run, or `true` for the newest complete one in --output_dir.")
    return str(folder)


def launch_command(num_processes: int, argv: list[str]) -> list[str]:
    """`python -m a2po ARGV` under `accelerate launch` with `num_processes` processes (DDP; gloo on the CPU without
    GPUs): every setting explicit, so an accelerate config file of the user's changes nothing; port 0 lets the
    launcher pick a free port."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(num_processes),
            "--num_machines", "1", "--multi_gpu", "--gpu_ids", "all", "--mixed_precision", "no", "--dynamo_backend",
            "no", "--main_process_port", "0", "--module", "a2po", *argv]


def main(argv: list[str] | None = None) -> int:
    """`python -m a2po`: a setting the config or the run spec refuses ends the command with its sentence, not a
    traceback (the flags are checked before any model or data is loaded)."""
    try:
        return run(list(sys.argv[1:] if argv is None else argv))
    except (ConfigError, SpecError) as error:
        raise SystemExit(f"python -m a2po: {error}") from None


def run(argv: list[str]) -> int:
    command, script, config, fields = parse(argv)
    warn_unused_gpu(bool(config.use_cpu))  # before any data or model is loaded
    output_dir = config.output_dir or str(Path("outputs") / (fields.get("run_name") or f"{command}-run"))
    # Checked before anything is written: a wrong folder must not start a fresh run that overwrites the checkpoints.
    resume = resume_checkpoint(command, fields.pop("resume_from_checkpoint", None), output_dir)
    register_rewards(script)
    if script.num_processes < 1:
        raise SystemExit(f"--num_processes must be >= 1 (got {script.num_processes}).")
    if script.num_processes > 1 and "LOCAL_RANK" not in os.environ:
        # Not under a launcher yet: become one (the same command in every process; this branch is then skipped).
        launch = launch_command(script.num_processes, argv)
        print(f"Running under accelerate: {shlex.join(launch)}", file=sys.stderr, flush=True)
        os.execv(sys.executable, launch)
    fields.pop("output_dir", None)
    spec = spec_from_args(command, script, fields)
    trainer = spec.build_trainer(output_dir=output_dir)
    main_process = trainer.accelerator.is_main_process  # under several processes, only it writes and prints
    say = print if main_process else (lambda *_, **__: None)
    say(f"Device and precision: {precision_summary(trainer)}", file=sys.stderr, flush=True)
    if command == "values":
        for split in ["train", *trainer.eval_sets()]:
            table = trainer.estimate_optimal_values(split=split)
            path = Path(output_dir) / f"optimal_values_{split}.jsonl"
            if main_process:
                save_optimal_values(table, path)
            say(json.dumps({"split": split, **summarize(table.to_list(), trainer.args.num_value_samples)}))
            say(f"V* table: {path}")
    elif command == "train":
        # Evaluates at step 0 first when prompts are held out (`eval_on_start`); a resumed run had that evaluation.
        trainer.train(resume_from_checkpoint=resume)
        trainer.save_model(output_dir)
        if trainer.eval_dataset is not None:
            after = trainer.evaluate()
            before = next((h for h in trainer.state.log_history if h.get("step") == 0 and "eval_accuracy" in h), {})
            say(json.dumps(after))
            if before:
                say(f"Held-out greedy accuracy: {before['eval_accuracy']:.1%} before training -> "
                    f"{after['eval_accuracy']:.1%} after ({len(trainer.eval_dataset)} prompts).")
    else:
        if trainer.eval_dataset is None:
            raise SystemExit("evaluate needs held-out prompts: set --eval_size > 0.")
        say(json.dumps(trainer.evaluate()))
    say(f"Output directory: {Path(output_dir).resolve()}")
    # Under several processes, a process group left to the interpreter's exit can abort in gloo's threads.
    trainer.accelerator.end_training()
    return 0


MAX_CONFIG_BYTES = 64_000  # a config file is a few dozen flags
MAX_CONFIG_NODES = 4_000
MAX_CONFIG_DEPTH = 8


class _ConfigLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` for config files: no aliases (a few lines of them describe billions of values, which PyYAML
    keeps as shared references until something walks them), at most `MAX_CONFIG_NODES` values, `MAX_CONFIG_DEPTH`
    levels deep."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._nodes = self._depth = 0

    def compose_node(self, parent, index):
        mark = self.peek_event().start_mark
        where = f"line {mark.line + 1}"
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError(f"{where}: aliases (*name, <<: *name) are not accepted in a config file; write "
                                 "the value out")
        self._nodes += 1
        if self._nodes > MAX_CONFIG_NODES:
            raise yaml.YAMLError(f"{where}: more than {MAX_CONFIG_NODES} values; a config file is a mapping of flags")
        self._depth += 1
        try:
            if self._depth > MAX_CONFIG_DEPTH:
                raise yaml.YAMLError(f"{where}: nested more than {MAX_CONFIG_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def read_config_file(path: str | os.PathLike[str]) -> Any:
    """A `--config` YAML file's content, read within bounds (`_ConfigLoader`, `MAX_CONFIG_BYTES`): ValueError naming
    the problem for a file too large, not UTF-8, not YAML, with aliases, too many values or too deep."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ValueError(f"Not a readable file: {error.strerror or error}.") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"The config file is larger than {MAX_CONFIG_BYTES // 1000} kB: a config file is a mapping of "
                         "flags, e.g. `learning_rate: 2.0e-5`.")
    try:
        return yaml.load(raw.decode("utf-8"), Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader, bounded
    except UnicodeDecodeError:
        raise ValueError("The config file is not UTF-8 text.") from None
    except ValueError:  # Python's limit on the digits of an integer read from text
        raise ValueError("The config file holds a number too long to read; write numbers such as 2.0e-5.") from None
    except (yaml.YAMLError, RecursionError) as error:
        raise ValueError(f"Not a readable YAML config file: {str(error)[:300]}") from None


def spec_from_config_file(path: str, command: str = "train") -> RunSpec:
    """The run a `--config` YAML file describes (as `python -m a2po <command> --config FILE` would run it): for the
    dashboard's "Load YAML". Bad files raise ValueError naming the problem."""
    loaded = read_config_file(path)
    if not isinstance(loaded, dict):
        raise ValueError("A config file is a YAML mapping of flags, e.g. `learning_rate: 2.0e-5`.")
    config_class = CONFIG_CLASSES.get(loaded.get("method", "a2po"), A2POConfig)
    known = {f.name for f in fields(ScriptArguments)} | set(config_class.__dataclass_fields__) | {"run_name"}
    unknown = sorted((str(k) for k in set(loaded) - known), key=len)
    if unknown:
        raise ValueError(f"Unknown settings in the config file: {', '.join(shown(k)[1:-1] for k in unknown[:5])}"
                         f"{f' and {len(unknown) - 5} more' if len(unknown) > 5 else ''}.")
    try:
        command, script, _, config_fields = parse([command, "--config", path])
        return spec_from_args(command, script, config_fields)
    except SystemExit as error:  # argparse and our own checks exit with a message
        raise ValueError(str(error)) from None
