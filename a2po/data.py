"""Prompt datasets: an offline arithmetic task generator, loaders that normalise math datasets, and reasoning-gym
tasks (`task_dataset`, `mixed_task_dataset`, `preview_tasks`, from `a2po.tasks`; reasoning-gym is imported only
when they run).

Every dataset returned here has a `prompt` column (a conversational list of messages, or a plain string) and a
`ground_truth` column (the final answer as a string), which is what the reward functions in `a2po.rewards` read.
"""

from __future__ import annotations

import json
import numbers
import operator
import random
from collections.abc import Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from datasets import Dataset, DatasetDict, load_dataset, load_from_disk

from a2po.answers import extract_final_answer, prompt_text
from a2po.shown import shown
from a2po.tasks import TASKS, mixed_task_dataset, preview_tasks, task_dataset  # noqa: F401  (re-exported)

OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
MAX_DIFFICULTY = 4
ARITHMETIC_TEMPLATE = "What is {a} {op} {b}? Answer with just the number."

GSM8K_INSTRUCTION = "Solve the problem step by step. Put the final answer after '####'."
MATH_INSTRUCTION = "Solve the problem step by step, and put the final answer in \\boxed{}."
# Candidate names, in order of preference, when the caller does not name the columns.
PROMPT_COLUMNS = ("prompt", "question", "problem", "query", "input", "instruction")
ANSWER_COLUMNS = ("ground_truth", "answer", "final_answer", "solution", "target", "output")
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _parse_operations(operations: str | Sequence[str]) -> list[str]:
    items = [c for c in operations if c not in " ,"] if isinstance(operations, str) else list(operations)
    unknown = [op for op in items if op not in OPERATIONS]
    if unknown or not items:
        raise ValueError(f"Unknown operations {unknown or operations!r}; use some of {list(OPERATIONS)}, "
                         "as a string like '+-*' or a list like ['+', '*'].")
    return list(dict.fromkeys(items))  # drop repeats, keep order


def _sample_questions(rng: random.Random, ops: list[str], low: int, high: int, count: int) -> list[tuple]:
    """`count` (a, op, b) triples, all distinct while the question space allows it."""
    span = high - low + 1
    space = len(ops) * span * span
    if space <= 2 * count:  # small space: shuffle all of it (repeating only past its size)
        everything = [(a, op, b) for op in ops for a in range(low, high + 1) for b in range(low, high + 1)]
        out: list[tuple] = []
        while len(out) < count:
            rng.shuffle(everything)
            out.extend(everything[: count - len(out)])
        return out
    seen: set[tuple] = set()
    out = []
    while len(out) < count:  # large space: rejection sampling needs < 2 draws per question on average
        question = (rng.randint(low, high), rng.choice(ops), rng.randint(low, high))
        if question not in seen:
            seen.add(question)
            out.append(question)
    return out


def arithmetic_dataset(num_prompts: int = 256, operations: str | Sequence[str] = "+", difficulty: int = 1,
                       seed: int = 0, chat: bool = True) -> Dataset:
    """Arithmetic questions with exact answers, generated offline and deterministically from `seed`.

    `difficulty` is the number of digits of each operand (1: 0-9, 2: 10-99, 3: 100-999, 4: 1000-9999);
    `operations` is a subset of "+", "-", "*". Questions do not repeat unless `num_prompts` exceeds the number of
    distinct questions. With `chat`, prompts are conversational (`[{"role": "user", "content": ...}]`).
    """
    if not _is_int(num_prompts) or num_prompts < 1:
        raise ValueError(f"num_prompts must be an integer >= 1, got {num_prompts!r}.")
    if not _is_int(difficulty) or difficulty not in range(1, MAX_DIFFICULTY + 1):
        raise ValueError(f"difficulty is the number of digits per operand and must be 1..{MAX_DIFFICULTY}, "
                         f"got {difficulty!r}.")
    ops = _parse_operations(operations)
    num_prompts, difficulty = int(num_prompts), int(difficulty)
    low, high = (0, 9) if difficulty == 1 else (10 ** (difficulty - 1), 10**difficulty - 1)
    rows: dict[str, list] = {"prompt": [], "ground_truth": [], "operation": [], "difficulty": []}
    for a, op, b in _sample_questions(random.Random(seed), ops, low, high, num_prompts):
        question = ARITHMETIC_TEMPLATE.format(a=a, op=op, b=b)
        rows["prompt"].append([{"role": "user", "content": question}] if chat else question)
        rows["ground_truth"].append(str(OPERATIONS[op](a, b)))
        rows["operation"].append(op)
        rows["difficulty"].append(difficulty)
    return Dataset.from_dict(rows)


def with_system_prompt(dataset: Dataset, system_prompt: str | None) -> Dataset:
    """Conversational prompts with `system_prompt` as their system message (replacing one they have); None leaves
    the prompts as they are. Plain-text prompts get no chat template, so a non-empty `system_prompt` for them is an
    error rather than a setting silently dropped.

    Why a run sets it: without a system message some chat templates insert their own (SmolLM2's, 16 tokens of "You
    are a helpful AI assistant named SmolLM, ..." before a 14-token question), and every prompt token is computed
    in every forward and backward pass; "" gives an empty system message.
    """
    if system_prompt is None:
        return dataset
    if not isinstance(system_prompt, str):
        raise ValueError(f"system_prompt must be a string (\"\" for an empty system message) or None, got "
                         f"{shown(system_prompt, 80)}.")
    if system_prompt and "prompt" in dataset.column_names and any(isinstance(p, str) for p in dataset["prompt"]):
        raise ValueError("system_prompt is set, but this dataset's `prompt` column holds plain text, which is used "
                         "verbatim (TRL's standard format) with no chat template to put a system message in. Drop "
                         "system_prompt, or write the prompts as message lists.")

    def convert(row: dict) -> dict:
        prompt = row["prompt"]
        if isinstance(prompt, str):
            return row
        messages = [dict(m) for m in prompt if m.get("role") != "system"]
        return {**row, "prompt": [{"role": "system", "content": system_prompt}, *messages]}

    return dataset.map(convert)


def train_eval_split(dataset: Dataset, eval_size: int | float, seed: int = 0) -> tuple[Dataset, Dataset]:
    """Hold out prompts for evaluation: `eval_size` is a count (int) or a fraction in (0, 1).

    Returns `(train, eval)`, both non-empty, shuffled deterministically by `seed`.
    """
    n = len(dataset)
    if isinstance(eval_size, bool) or not isinstance(eval_size, numbers.Real):
        raise ValueError(f"eval_size must be a count or a fraction in (0, 1), got {eval_size!r}.")
    count = int(eval_size) if _is_int(eval_size) else round(eval_size * n)
    if not _is_int(eval_size) and not 0 < eval_size < 1:
        raise ValueError(f"eval_size as a fraction must be in (0, 1), got {eval_size}; pass an int for a count.")
    if not 1 <= count < n:
        raise ValueError(f"eval_size={eval_size!r} holds out {count} of {n} prompts; both the train and the eval "
                         "split need at least one prompt.")
    split = dataset.train_test_split(test_size=count, seed=seed)
    return split["train"], split["test"]


def preview_rows(dataset: Dataset, n: int = 5) -> list[dict]:
    """The first `n` rows as plain dicts, with prompts rendered to text (for a UI preview)."""
    rows = dataset.select(range(min(max(n, 0), len(dataset)))).to_list()
    for row in rows:
        if "prompt" in row:
            row["prompt"] = prompt_text(row["prompt"])
    return rows


def _pick_column(columns: list[str], requested: str | None, candidates: tuple[str, ...], kind: str) -> str:
    if requested:  # None or "" (an empty form field) means: pick it automatically
        if requested not in columns:
            raise ValueError(f"{kind}_column={requested!r} is not a column of the dataset; it has {columns}.")
        return requested
    for name in candidates:
        if name in columns:
            return name
    raise ValueError(f"Found no {kind} column among {columns} (looked for {list(candidates)}); "
                     f"pass {kind}_column=<name>.")


def _final_answer(value: Any) -> str:
    """The answer part of a reference solution: after `####` (GSM8K), inside `\\boxed{}` (MATH), else as is."""
    text = "" if value is None else str(value).strip()
    if "####" in text or "\\boxed" in text:
        return extract_final_answer(text) or text
    return text


def normalize_prompt_dataset(dataset: Dataset, prompt_column: str | None = None,
                             answer_column: str | None = None) -> Dataset:
    """Add `prompt` and `ground_truth` columns to a question/answer dataset, keeping the rest.

    A `prompt` column is used as TRL uses it: a string as it is (the "standard" format, no chat template), a list of
    messages as a conversation. Any other question column (`question`, `problem`, ... or a named `prompt_column`)
    becomes one user message. Recognises GSM8K (`question`/`answer` ending in `#### 42`) and MATH (`problem` with
    `answer`, or `solution` holding `\\boxed{...}`), and asks for the matching answer format in such a message.
    """
    columns = dataset.column_names
    prompt_col = _pick_column(columns, prompt_column, PROMPT_COLUMNS, "prompt")
    answer_col = _pick_column(columns, answer_column, ANSWER_COLUMNS, "answer")
    sample = [str(v) for v in dataset.select(range(min(100, len(dataset))))[answer_col]]
    if any("####" in v for v in sample):
        instruction = GSM8K_INSTRUCTION
    elif prompt_col == "problem" or any("\\boxed" in v for v in sample) or "solution" in columns:
        instruction = MATH_INSTRUCTION
    else:
        instruction = None
    if prompt_col == "prompt":  # already written as a prompt: use it verbatim
        instruction = None

    def convert(row: dict) -> dict:
        prompt = row[prompt_col]
        # A bare question is not a prompt yet; a `prompt` string is one, and a base model has no template to wrap it.
        if isinstance(prompt, str) and prompt_col != "prompt":
            has_format = "####" in prompt or "\\boxed" in prompt
            content = f"{prompt.strip()}\n\n{instruction}" if instruction and not has_format else prompt
            prompt = [{"role": "user", "content": content}]
        return {"_a2po_prompt": prompt, "_a2po_ground_truth": _final_answer(row[answer_col])}

    # New names first: map would cast values written to an existing column back to its old type (e.g. int).
    dataset = dataset.map(convert, desc="Normalising prompts")
    dataset = dataset.remove_columns([name for name in ("prompt", "ground_truth") if name in columns])
    return dataset.rename_columns({"_a2po_prompt": "prompt", "_a2po_ground_truth": "ground_truth"})


def _load_raw(source: str, split: str, config_name: str | None) -> Dataset:
    path = Path(source).expanduser()
    if path.is_file():
        builder = FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(f"Unsupported file type {path.suffix!r} for {path}; use one of {list(FILE_BUILDERS)}.")
        return load_dataset(builder, data_files=str(path), split="train")  # a single file has a single split
    if path.is_dir():
        if any((path / name).exists() for name in ("dataset_info.json", "dataset_dict.json", "state.json")):
            loaded = load_from_disk(str(path))  # written by save_to_disk
        else:
            return load_dataset(str(path), split=split)  # a folder of data files
        if isinstance(loaded, DatasetDict):
            if split not in loaded:
                raise ValueError(f"{path} has no split {split!r}; it has {list(loaded)}.")
            return loaded[split]
        return loaded
    if path.suffix.lower() in FILE_BUILDERS or source.startswith(("/", "./", "../", "~")):
        raise FileNotFoundError(f"No such file: {path}. Check the path (a hub dataset id looks like 'openai/gsm8k').")
    try:
        return load_dataset(source, config_name, split=split)
    except Exception as error:
        raise RuntimeError(f"Could not load {source!r} (config {config_name!r}, split {split!r}) from the Hugging "
                           f"Face hub: {error}. Check the id, config_name and network, or pass a local "
                           f"{'/'.join(FILE_BUILDERS)} file.") from error


MAX_PEEK_BYTES = 10_000_000  # what a preview reads of a file at most: its first rows, never the rest


def peek_dataset(source: str, split: str = "train", config_name: str | None = None, rows: int = 5) -> Dataset:
    """The first `rows` rows of a local file or a hub dataset, without loading the rest: a data file is read
    up to its first rows (`peek_file`), a hub dataset streamed (never downloaded whole), so a preview or a column
    check costs a few rows whatever the file expands to."""
    path = Path(source).expanduser()
    if path.is_file():
        return Dataset.from_list(peek_file(path, rows))
    if path.exists() or source.startswith(("/", "./", "../", "~")):
        raw = _load_raw(source, split, config_name)
        return raw.select(range(min(rows, len(raw))))
    try:
        stream = load_dataset(source, config_name, split=split, streaming=True)
        return Dataset.from_list(list(islice(stream, rows)))
    except Exception as error:
        raise RuntimeError(f"Could not read {source!r} (config {config_name!r}, split {split!r}) from the Hugging "
                           f"Face hub: {error}. Check the id, config and split, or upload a file.") from error


def peek_file(path: Path, rows: int) -> list[dict[str, Any]]:
    """The first `rows` rows of a .jsonl, .json, .csv or .parquet file, read as far as they go: a parquet file's
    first record batch (no Arrow cache, no other row group decompressed), the first lines of a JSON-lines or CSV file.
    A .json file (one array) is parsed whole, so it is read only up to `MAX_PEEK_BYTES`. ValueError naming the
    problem for a file that cannot be read so."""
    suffix = path.suffix.lower()
    if suffix not in FILE_BUILDERS:
        raise ValueError(f"Unsupported file type {suffix!r} for {path.name}; use one of {list(FILE_BUILDERS)}.")
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            first = next(pq.ParquetFile(path).iter_batches(batch_size=max(1, rows)), None)
            return first.to_pylist()[:rows] if first is not None else []
        if suffix == ".jsonl":
            with open(path, encoding="utf-8") as f:
                lines = (line for line in islice(f, 10 * rows + 100) if line.strip())
                return [_row(json.loads(line), path) for line in islice(lines, rows)]
        if suffix == ".csv":
            import csv

            with open(path, encoding="utf-8", newline="") as f:
                return list(islice(csv.DictReader(f), rows))
        if path.stat().st_size > MAX_PEEK_BYTES:
            raise ValueError(f"{path.name} is a .json file of {path.stat().st_size / 1e6:.0f} MB, which is read whole; "
                             "a preview reads at most 10 MB: use .jsonl (one row per line) for larger data.")
        loaded = json.loads(path.read_text(encoding="utf-8"))
        items = loaded if isinstance(loaded, list) else loaded.get("data") if isinstance(loaded, dict) else None
        if not isinstance(items, list):
            raise ValueError(f"{path.name}: a .json data file is a list of rows (or {{\"data\": [...]}}).")
        return [_row(item, path) for item in items[:rows]]
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"{path.name} is not readable {suffix[1:]} text: {str(error)[:200]}") from None
    except ValueError:
        raise
    except OSError as error:  # pyarrow's errors for a file that is not parquet derive from it
        raise ValueError(f"{path.name} is not a readable {suffix[1:]} file: {str(error)[:200]}") from None
    except Exception as error:  # noqa: BLE001 - csv's field-size limit and other readers' own errors
        raise ValueError(f"{path.name} could not be read: {str(error)[:200]}") from None


def _row(item: Any, path: Path) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ValueError(f"{path.name}: each row is an object of columns, e.g. {{\"question\": ..., \"answer\": ...}} "
                         f"(got {type(item).__name__}).")
    return item


def load_prompt_dataset(source: str, split: str = "train", prompt_column: str | None = None,
                        answer_column: str | None = None, config_name: str | None = None) -> Dataset:
    """Load prompts from a local file (.jsonl/.json/.csv/.parquet), a `save_to_disk` folder, or a hub dataset id
    (needs network; e.g. `load_prompt_dataset("openai/gsm8k", config_name="main")`), normalised to `prompt` and
    `ground_truth` columns (see `normalize_prompt_dataset`). `split` is ignored for a single local file.
    """
    return normalize_prompt_dataset(_load_raw(str(source), split, config_name), prompt_column, answer_column)
