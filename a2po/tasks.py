"""Reasoning tasks from `reasoning-gym`: procedural prompts, each scored by its own task's answer checker, offline.

A task couples its prompts and its checker. Every prompt is the task's question followed by `ANSWER_INSTRUCTION`
(reasoning-gym's `<answer>` tag convention); the reward `task_checker` (registered in `a2po.rewards`) takes the
content of the completion's last `<answer>` tag, asks the task's own `score_answer`, and makes the score binary:
1.0 only for a full score. A*-PO assumes r in {0, 1}, and several checkers give partial credit (countdown 0.05 for
using the right numbers, gsm_symbolic 0.01 for any number, the default checker len(answer)/len(text) when the answer
is part of the text), which would otherwise count as "partly solved" in V*.

Dataset spec (`RunSpec.dataset`; `num_prompts`, `eval_size` and `seed` default to 256, 64 and 0):

    {"source": "reasoning-gym", "task": "chain_sum", "settings": {"max_terms": 3},
     "num_prompts": 256, "eval_size": 64, "seed": 0}
    {"source": "reasoning-gym", "tasks": [{"task": "chain_sum", "weight": 2, "settings": {"max_terms": 3}},
                                          {"task": "leg_counting", "weight": 1}], "num_prompts": 300, ...}

Rows have `prompt` (one user message), `ground_truth` (the task's reference answer), `task`, and the JSON strings
`task_entry` (the reasoning-gym entry the checker reads) and `task_settings`, so they survive Arrow, JSON and
database round trips unchanged. reasoning-gym is an optional extra, imported only to generate or score prompts.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from a2po.answers import CORRECT_THRESHOLD, completion_text, extract_final_answer

if TYPE_CHECKING:
    from datasets import Dataset

TASK_SOURCE = "reasoning-gym"
TASK_REWARD = "task_checker"  # the only reward a task source accepts
INSTALL_HINT = "pip install 'a2po-studio[tasks]'"
ANSWER_INSTRUCTION = "Give your final answer between <answer> and </answer> tags."
NUMBER_INSTRUCTION = "Answer with just the number."
# How a prompt asks for its answer and where the checker finds it: "tags" (reasoning-gym's convention) or "number"
# (the last number of the completion, for tasks whose answers are numbers). Small instruct models rarely write the
# tags (SmolLM2-135M almost never does, even on 1-digit chain sums) but do end with a number (docs/benchmarks.md).
ANSWER_FORMATS = ("tags", "number")
MAX_PROMPTS = 100_000
MAX_TASKS = 16
SPEC_DEFAULTS = {"num_prompts": 256, "eval_size": 64, "seed": 0}
SPEC_KEYS = {"system_prompt", "answer_format", "source", "task", "tasks", "settings", *SPEC_DEFAULTS}
# reasoning-gym seeds entry i with Random(seed + i): each (spec seed, task, split) gets its own block of generator
# seeds, larger than any split can use, so training and held-out prompts never come from the same generator state.
SEED_BLOCK = 1 << 20
MAX_FAILURES = 10  # generator failures in a row before the settings are deemed impossible
_ANSWER_TAG = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class Setting:
    """A difficulty setting: a field of the task's reasoning-gym config dataclass and the values accepted here."""

    name: str
    kind: str  # "int" (low..high), "bool", "choice" (one of choices) or "subset" (a non-empty list from choices)
    default: Any
    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] = ()
    help: str = ""

    def allowed(self) -> str:
        return {"int": f"an integer in {self.low}..{self.high}", "bool": "true or false",
                "choice": f"one of {list(self.choices)}",
                "subset": f"a non-empty list drawn from {list(self.choices)}"}[self.kind]

    def normalize(self, value: Any) -> Any:
        """The value in the form reasoning-gym takes; ValueError naming the setting and its allowed values."""
        if self.kind == "int" and isinstance(value, float) and value.is_integer():
            value = int(value)  # form fields and JSON may give 3.0
        if self.kind == "subset" and isinstance(value, str):
            value = [c for c in value if c not in " ,"]  # "+-*" or "+, -"
        ok = {"int": lambda v: _is_int(v) and self.low <= v <= self.high,
              "bool": lambda v: isinstance(v, bool),
              "choice": lambda v: v in self.choices,
              "subset": lambda v: isinstance(v, (list, tuple)) and v and all(x in self.choices for x in v)}[self.kind]
        if not ok(value):
            raise ValueError(f"settings.{self.name} must be {self.allowed()} (got {value!r})")
        return list(dict.fromkeys(value)) if self.kind == "subset" else value

    def default_value(self) -> Any:
        return list(self.default) if self.kind == "subset" else self.default


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    settings: tuple[Setting, ...] = ()
    # Answers must match this before the checker sees them: countdown's checker runs sympy's parse_expr (an eval).
    answer_pattern: str | None = None
    numeric: bool = True  # the answer is a number (answer_format "number" is possible)

    def setting(self, name: str) -> Setting | None:
        return next((s for s in self.settings if s.name == name), None)


def _range(what: str, default: tuple[int, int], low: int, high: int, help: str) -> tuple[Setting, Setting]:
    """The `min_<what>` / `max_<what>` pair of a reasoning-gym config (checked: min <= max)."""
    return (Setting(f"min_{what}", "int", default[0], low, high, help=f"fewest {help}"),
            Setting(f"max_{what}", "int", default[1], low, high, help=f"most {help}"))


OPERATORS = ("+", "-", "*", "/")
# reasoning-gym finds a divisor for '/' by trial division up to the square root of the left operand, so a prompt of
# many long terms can take minutes. With '/', (max_terms - 1) * max_digits <= 12 keeps every prompt quick to make
# (figures: docs/benchmarks.md, "Design figures").
MAX_DIVISION_SPAN = 12
# Names, types and defaults are those of reasoning-gym 0.1.25's config dataclasses (tests/a2po/test_tasks.py checks),
# except basic_arithmetic's operators (no '/' by default, see above); the ranges are what a run sensibly uses
# (reasoning-gym's curricula) and what its generators handle.
TASKS: dict[str, Task] = {task.name: task for task in [
    Task("basic_arithmetic", "An integer expression with + - * and parentheses, e.g. 'Calculate -5 * (3 + 4).'", (
        *_range("terms", (2, 6), 2, 10, "numbers in the expression"),
        *_range("digits", (1, 4), 1, 6, "digits per number"),
        Setting("operators", "subset", ("+", "-", "*"), choices=OPERATORS,
                help="operators used; '/' is floor division in reasoning-gym (about 1% of answers are floored) and "
                     f"needs (max_terms - 1) * max_digits <= {MAX_DIVISION_SPAN}"),
        Setting("allow_negation", "bool", True, help="allow negated groups '-( ... )'"),
        Setting("format_style", "choice", "simple", choices=("simple", "natural"),
                help="'simple': 'Calculate ...'; 'natural': varied wordings"),
        Setting("whitespace", "choice", "single", choices=("no_space", "single", "random"),
                help="spacing between numbers and operators"))),
    Task("chain_sum", "A chain of additions and subtractions, e.g. '12 + 7 - 3 ='.", (
        *_range("terms", (2, 6), 2, 12, "numbers in the chain"),
        *_range("digits", (1, 4), 1, 10, "digits per number"),
        Setting("allow_negation", "bool", False, help="allow negative numbers"))),
    Task("leg_counting", "Count the legs of a list of animals, e.g. '3 spiders, 2 ducks'.", (
        *_range("animals", (3, 10), 1, 37, "kinds of animals (37 exist)"),
        *_range("instances", (1, 15), 1, 1024, "animals of each kind"))),
    Task("gsm_symbolic", "Grade-school word problems from GSM-Symbolic templates (no settings: reasoning-gym "
                         "supports only difficulty 1.0)."),
    Task("countdown", "Reach a target with given numbers and + - * /; the answer is an expression.", (
        *_range("numbers", (4, 6), 2, 10, "numbers given"),
        *_range("value", (1, 100), 1, 1000, "value of a given number"),
        *_range("target", (100, 999), 1, 100_000, "target value"),
        Setting("operators", "subset", OPERATORS, choices=OPERATORS, help="operators in the solutions"),
        Setting("shuffle", "bool", True, help="shuffle the numbers (else they appear in solution order)")),
        answer_pattern=r"(?!.*\*\*)[\d\s+\-*/().]{1,200}", numeric=False),
]}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_int(value: Any) -> int | None:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if _is_int(value) else None


def _require_reasoning_gym():
    try:
        import reasoning_gym
    except ImportError as error:
        raise ImportError(f"Reasoning tasks need the reasoning-gym package: {INSTALL_HINT}") from error
    return reasoning_gym


def _task(name: Any) -> Task:
    if name not in TASKS:
        raise ValueError(f"Unknown reasoning-gym task {name!r}; supported: {', '.join(TASKS)}.")
    return TASKS[name]


# -- settings ------------------------------------------------------------------------------------------------------

def settings_schema(task: str) -> list[dict[str, Any]]:
    """The task's settings as plain dicts (name, kind, default, low, high, choices, help, allowed), for a form."""
    return [{**asdict(s), "choices": list(s.choices), "allowed": s.allowed()} for s in _task(task).settings]


def settings_problems(task: str, settings: dict[str, Any] | None, where: str = "settings") -> list[str]:
    """Everything wrong with `settings` for `task`, each naming the setting and what it accepts."""
    return [p.replace("settings.", f"{where}.", 1) for p in _check_settings(task, settings)[1]]


def normalize_settings(task: str, settings: dict[str, Any] | None) -> dict[str, Any]:
    """Every setting of the task, defaults filled in, in reasoning-gym's form ("+-" -> ["+", "-"], 3.0 -> 3);
    ValueError lists every problem."""
    out, problems = _check_settings(task, settings)
    if problems:
        raise ValueError(f"Invalid {task} settings: " + "; ".join(problems) + ".")
    return out


def _check_settings(task: str, settings: Any) -> tuple[dict[str, Any], list[str]]:
    info, settings = _task(task), settings or {}
    if not isinstance(settings, dict):
        return {}, [f"settings must be a dict of setting names to values (got {settings!r})"]
    names = [s.name for s in info.settings]
    out, problems = {}, []
    for name, value in settings.items():
        setting = info.setting(name)
        if setting is None:
            fix = "set it at the dataset level, not in settings" if name in ("seed", "size") else (
                f"{task}'s settings are {names}" if names else f"{task} has no settings")
            problems.append(f"settings.{name} is not a setting of {task}: {fix}")
            continue
        try:
            out[name] = setting.normalize(value)
        except ValueError as error:
            problems.append(str(error))
    for low in [s for s in info.settings if s.name.startswith("min_")]:
        high = info.setting("max_" + low.name[4:])
        if {low.name, high.name} & (set(settings) - set(out)):
            continue  # one of them is already reported
        a, b = out.get(low.name, low.default), out.get(high.name, high.default)
        if a > b:
            problems.append(f"settings.{low.name} ({a}) must be <= {high.name} ({b})")
    full = {s.name: out.get(s.name, s.default_value()) for s in info.settings}
    if task == "basic_arithmetic" and "/" in full["operators"] \
            and (full["max_terms"] - 1) * full["max_digits"] > MAX_DIVISION_SPAN:
        problems.append(f"settings.operators includes '/', which needs (max_terms - 1) * max_digits <= "
                        f"{MAX_DIVISION_SPAN} (got ({full['max_terms']} - 1) * {full['max_digits']}): reasoning-gym's "
                        "divisor search can take minutes on longer expressions; lower max_terms or max_digits")
    return full, problems


# -- prompts -------------------------------------------------------------------------------------------------------

def format_prompt(question: str, answer_format: str = "tags") -> str:
    """The question, then how to answer: inside `<answer>` tags (the checker reads only those), or with just the
    number (the checker reads the last number)."""
    if answer_format == "number":
        return f"{question.strip()} {NUMBER_INSTRUCTION}"
    return f"{question.strip()}\n\n{ANSWER_INSTRUCTION}"


def _entries(task: str, settings: dict, seed: int, size: int):
    """reasoning-gym entries 0..size-1 of the task at `seed`, generated lazily (countdown entries are slow to make).

    An entry the generator fails on (a rare division by zero in basic_arithmetic) is skipped, deterministically;
    a run of failures means the settings cannot be met (e.g. a countdown target out of reach).
    """
    reasoning_gym = _require_reasoning_gym()
    dataset = reasoning_gym.create_dataset(task, seed=seed, size=size, **settings)
    failures = 0
    for i in range(size):
        try:
            entry = dataset[i]
        except (ValueError, ArithmeticError) as error:
            failures += 1
            if failures == MAX_FAILURES:
                raise ValueError(f"{task} could not generate prompts with settings {settings}: {error}. Widen the "
                                 "settings (e.g. countdown's target range).") from error
            continue
        failures = 0
        yield entry


def _take(task: str, settings: dict, seed: int, count: int, exclude: set[str] | None = None,
          answer_format: str = "tags") -> list[dict]:
    """`count` rows of the task from generator seed `seed` on, skipping prompts whose text is in `exclude`."""
    if not count:
        return []
    settings_json, tries, rows = json.dumps(settings, sort_keys=True), min(SEED_BLOCK, 4 * count + 100), []
    for entry in _entries(task, settings, seed, tries):
        row = _row(task, settings_json, entry, answer_format)
        if not exclude or row["prompt"][0]["content"] not in exclude:
            rows.append(row)
            if len(rows) == count:
                return rows
    raise ValueError(f"{task} with settings {settings} gave only {len(rows)} of {count} prompts"
                     f"{' unlike every training prompt' if exclude else ''} in {tries} tries: the settings allow "
                     "few distinct prompts. Widen them (more terms or digits) or lower num_prompts or eval_size.")


def _row(task: str, settings_json: str, entry: dict, answer_format: str = "tags") -> dict[str, Any]:
    return {"prompt": [{"role": "user", "content": format_prompt(entry["question"], answer_format)}],
            "ground_truth": str(entry["answer"]), "task": task,
            # default=str: gsm_symbolic's metadata holds Fractions; the checkers read only JSON-native fields.
            "task_entry": json.dumps(entry, default=str, sort_keys=True), "task_settings": settings_json,
            "answer_format": answer_format}


def _apportion(total: int, weights: Sequence[float]) -> list[int]:
    """`total` split in proportion to `weights` (largest remainders first, ties to the earlier task)."""
    quotas = [total * w / sum(weights) for w in weights]
    counts = [int(q) for q in quotas]
    by_remainder = sorted(range(len(weights)), key=lambda i: (counts[i] - quotas[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _parts(tasks: Sequence[dict[str, Any]]) -> list[tuple[str, dict, float]]:
    problems = _tasks_problems(tasks)
    if problems:
        raise ValueError("Invalid tasks: " + "; ".join(problems) + ".")
    return [(t["task"], normalize_settings(t["task"], t.get("settings")), float(t.get("weight", 1.0)))
            for t in tasks]


def _generate(parts: list[tuple[str, dict, float]], num_prompts: int, seed: int,
              eval_size: int, answer_format: str = "tags") -> tuple[Dataset, Dataset | None]:
    from datasets import Dataset

    if _as_int(num_prompts) is None or not 1 <= num_prompts <= MAX_PROMPTS:
        raise ValueError(f"num_prompts must be an integer in 1..{MAX_PROMPTS} (got {num_prompts!r})")
    if _as_int(eval_size) is None or not 0 <= eval_size <= MAX_PROMPTS:
        raise ValueError(f"eval_size must be an integer in 0..{MAX_PROMPTS} (got {eval_size!r})")
    if _as_int(seed) is None or seed < 0:
        raise ValueError(f"seed must be an integer >= 0 (got {seed!r})")
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {ANSWER_FORMATS} (got {answer_format!r})")
    words = [task for task, _, _ in parts if not _task(task).numeric]
    if answer_format == "number" and words:
        raise ValueError(f"answer_format 'number' needs tasks whose answers are numbers; {', '.join(words)} "
                         "answers are not: use answer_format 'tags'")
    weights = [w for _, _, w in parts]
    bases = [(seed * MAX_TASKS + p) * 2 * SEED_BLOCK for p in range(len(parts))]  # held out: base + SEED_BLOCK
    train = [row for (task, settings, _), base, count in zip(parts, bases, _apportion(int(num_prompts), weights))
             for row in _take(task, settings, base, count, answer_format=answer_format)]
    seen = {row["prompt"][0]["content"] for row in train}
    held_out = [row for (task, settings, _), base, count in zip(parts, bases, _apportion(int(eval_size), weights))
                for row in _take(task, settings, base + SEED_BLOCK, count, exclude=seen,
                                 answer_format=answer_format)]
    if len(parts) > 1:  # mix the tasks within batches
        random.Random(seed).shuffle(train)
        random.Random(seed + 1).shuffle(held_out)
    return Dataset.from_list(train), (Dataset.from_list(held_out) if held_out else None)


def task_dataset(task: str, num_prompts: int, seed: int = 0, settings: dict[str, Any] | None = None,
                 eval_size: int = 0, answer_format: str = "tags") -> tuple[Dataset, Dataset | None]:
    """`(train, eval)` prompts of one reasoning-gym task; eval is None when `eval_size` is 0.

    Deterministic in the arguments. Held-out prompts come from generator seeds disjoint from the training ones,
    and any whose text is also a training prompt is replaced, so no prompt text is in both.
    """
    return _generate([(task, normalize_settings(task, settings), 1.0)], num_prompts, seed, eval_size,
                     answer_format)


def mixed_task_dataset(tasks: Sequence[dict[str, Any]], num_prompts: int, seed: int = 0,
                       eval_size: int = 0, answer_format: str = "tags") -> tuple[Dataset, Dataset | None]:
    """`(train, eval)` mixing tasks, `[{"task": "chain_sum", "weight": 2, "settings": {...}}, ...]`, with counts
    proportional to the weights, rows shuffled (reproducibly) and tagged with their `task`."""
    return _generate(_parts(tasks), num_prompts, seed, eval_size, answer_format)


def datasets_from_spec(spec: dict[str, Any]) -> tuple[Dataset, Dataset | None]:
    """`(train, eval)` for a dataset spec with source 'reasoning-gym' (see the module docstring)."""
    problems = validate_task_spec(spec)
    if problems:
        raise ValueError("Invalid reasoning-gym dataset spec: " + "; ".join(problems) + ".")
    spec = {**SPEC_DEFAULTS, **{k: v for k, v in spec.items() if v is not None}}
    tasks = spec.get("tasks") or [{"task": spec["task"], "settings": spec.get("settings")}]
    return mixed_task_dataset(tasks, int(spec["num_prompts"]), int(spec["seed"]), int(spec["eval_size"]),
                              spec.get("answer_format", "tags"))


def preview_tasks(spec: str | dict[str, Any], n: int = 5) -> list[dict[str, Any]]:
    """The first `n` training prompts of a task name or a dataset spec, as `{"task", "prompt", "answer"}` (the
    prompt as the model sees it), for a UI preview. For a mix, the tasks of an `n`-prompt mix of the same weights."""
    spec = {"source": TASK_SOURCE, "task": spec} if isinstance(spec, str) else dict(spec)
    train, _ = datasets_from_spec({**spec, "num_prompts": max(1, n), "eval_size": 0})
    return [{"task": r["task"], "prompt": r["prompt"][0]["content"], "answer": r["ground_truth"]}
            for r in train.to_list()[:n]]


# -- spec validation -----------------------------------------------------------------------------------------------

def _tasks_problems(tasks: Any, where: str = "tasks") -> list[str]:
    if not isinstance(tasks, (list, tuple)) or not tasks:
        return [f"{where} must be a non-empty list like [{{'task': 'chain_sum', 'weight': 1}}] (got {tasks!r})"]
    if len(tasks) > MAX_TASKS:
        return [f"{where} has {len(tasks)} entries; at most {MAX_TASKS}"]
    problems = []
    for i, item in enumerate(tasks):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            problems.append(f"{at} must be a dict like {{'task': 'chain_sum', 'weight': 1}} (got {item!r})")
            continue
        unknown = set(item) - {"task", "weight", "settings"}
        if unknown:
            problems.append(f"{at} has unknown keys {sorted(unknown)}; use task, weight and settings")
        if item.get("task") not in TASKS:
            problems.append(f"{at}.task {item.get('task')!r} is not a supported task; use one of {list(TASKS)}")
            continue
        weight = item.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
            problems.append(f"{at}.weight must be a finite number > 0 (got {weight!r})")
        problems += settings_problems(item["task"], item.get("settings"), where=f"{at}.settings")
    return problems


def validate_task_spec(spec: dict[str, Any]) -> list[str]:
    """Problems of a reasoning-gym dataset spec, each naming the field and the fix; [] when it is valid."""
    problems = []
    if spec.get("source") != TASK_SOURCE:
        problems.append(f"dataset.source must be {TASK_SOURCE!r} (got {spec.get('source')!r})")
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        problems.append(f"dataset has keys {sorted(unknown)} that a {TASK_SOURCE} source does not use; "
                        f"use {sorted(SPEC_KEYS)}")
    has_task, has_tasks = spec.get("task") is not None, spec.get("tasks") is not None
    if has_task == has_tasks:
        problems.append(f"give dataset.task (one of {list(TASKS)}) or dataset.tasks (a weighted mix), "
                        f"{'not both' if has_task else 'one of them'}")
    elif has_task and spec["task"] not in TASKS:
        problems.append(f"dataset.task {spec['task']!r} is not a supported task; use one of {list(TASKS)}")
    elif has_task:
        problems += settings_problems(spec["task"], spec.get("settings"), where="dataset.settings")
    else:
        problems += _tasks_problems(spec["tasks"], where="dataset.tasks")
        if spec.get("settings"):
            problems.append("dataset.settings is for a single task; put settings inside each dataset.tasks entry")
    answer_format = spec.get("answer_format")
    if answer_format is not None and answer_format not in ANSWER_FORMATS:
        problems.append(f"dataset.answer_format must be one of {list(ANSWER_FORMATS)} (got {answer_format!r})")
    elif answer_format == "number":
        names = [spec.get("task")] if has_task else [t.get("task") for t in spec.get("tasks") or []
                                                     if isinstance(t, dict)]
        words = [n for n in names if n in TASKS and not TASKS[n].numeric]
        if words:
            problems.append(f"dataset.answer_format 'number' needs tasks whose answers are numbers; {', '.join(words)}"
                            " answers are expressions: use 'tags'")
    for key, low in (("num_prompts", 1), ("eval_size", 0), ("seed", 0)):
        value = spec.get(key)
        high = MAX_PROMPTS if key != "seed" else None
        if value is not None and (_as_int(value) is None or value < low or (high and value > high)):
            bounds = f"in {low}..{high}" if high else f">= {low}"
            problems.append(f"dataset.{key} must be an integer {bounds} (got {value!r})")
    return problems


def reward_problems(source: str | None, rewards: Sequence[dict[str, Any]]) -> list[str]:
    """A task source is scored by its task's checker alone, and the checker needs a task source."""
    names = [r.get("name") for r in rewards]
    if source == TASK_SOURCE and (names != [TASK_REWARD] or rewards[0].get("weight", 1.0) != 1):
        return [f"a {TASK_SOURCE} dataset is scored by its task's own answer checker, made binary (1 only for a full "
                f"score, as A*-PO assumes r in {{0, 1}}): set rewards to [{{'name': '{TASK_REWARD}', 'weight': 1.0}}] "
                f"(got {list(rewards)})"]
    if source != TASK_SOURCE and TASK_REWARD in names:
        return [f"reward {TASK_REWARD!r} scores reasoning-gym tasks and needs dataset.source {TASK_SOURCE!r} "
                f"(got {source!r}); use exact_match or math_equivalence"]
    return []


# -- scoring -------------------------------------------------------------------------------------------------------

def extract_answer(text: str) -> str | None:
    """Content of the last `<answer>...</answer>` in `text`, stripped; None when there is none."""
    matches = _ANSWER_TAG.findall(completion_text(text))
    return matches[-1].strip() if matches else None


@lru_cache(maxsize=128)
def _score_function(task: str, settings_json: str):
    """The task's `score_answer`, built once per (task, settings): checking is then a plain method call."""
    return _require_reasoning_gym().create_dataset(task, seed=0, size=1, **json.loads(settings_json)).score_answer


def score_answer(task: str, entry: dict[str, Any] | str, answer: str | None,
                 settings: dict[str, Any] | str | None = None) -> float:
    """1.0 when the task's checker gives `answer` (already extracted) a full score, else 0.0."""
    info = _task(task)
    entry = json.loads(entry) if isinstance(entry, str) else entry
    settings_json = settings if isinstance(settings, str) else json.dumps(settings or {}, sort_keys=True)
    if answer is None or (info.answer_pattern and not re.fullmatch(info.answer_pattern, answer)):
        return 0.0
    check = _score_function(task, settings_json)
    try:
        return 1.0 if check(answer, entry) >= CORRECT_THRESHOLD else 0.0
    except Exception:  # a checker must not crash training on one odd completion
        return 0.0


def score_completions(completions: Sequence[Any], task: Sequence[str], task_entry: Sequence[Any],
                      task_settings: Sequence[Any] | None = None,
                      answer_format: Sequence[str | None] | None = None) -> list[float]:
    """Binary scores of completions (strings or conversations) against their rows' tasks; each row's answer is read
    as its `answer_format` says (the last `<answer>` tag by default, else the last number)."""
    if len(task) != len(completions) or len(task_entry) != len(completions):
        raise ValueError(f"task and task_entry need one value per completion ({len(completions)}); got "
                         f"{len(task)} and {len(task_entry)}.")
    settings = task_settings if task_settings is not None else [None] * len(completions)
    formats = answer_format if answer_format is not None else [None] * len(completions)
    return [score_answer(t, e, (extract_final_answer if f == "number" else extract_answer)(completion_text(c)), s)
            for c, t, e, s, f in zip(completions, task, task_entry, settings, formats)]
