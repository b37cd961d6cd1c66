"""Reward functions for verifiable answers, and how the trainers call reward functions: TRL 1.16's contract,
`f(prompts, completions, completion_ids, **kwargs) -> list[float | None]` (README, "rewards").

`kwargs` carries every dataset column, `trainer_state` (the `transformers.TrainerState`) and the callbacks
`log_extra(column, values)` and `log_metric(name, value)`; the built-in functions read `ground_truth`
(`task_checker`: the reasoning-gym columns of `a2po.tasks`) and ignore the rest. A completion is a plain string or a
conversational list such as `[{"role": "assistant", "content": "..."}]` (the last message counts). A reward function
may be `async`, and may return None for a completion it does not apply to (`call_rewards`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import os
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from a2po.answers import clean_answer, completion_text, extract_final_answer, last_boxed
from a2po.shown import shown

# math_verify's timeouts use signal.alarm, which only works in the main thread.
_TIMEOUT_S = 5
# Beyond these, sympy can compute for minutes in C code that no timeout interrupts (e.g. 2^{2^{2^{100}}}).
_MAX_EXPONENT = 10_000
_MAX_FACTORIAL = 10_000


def _normalize(answer: Any) -> str | None:
    if answer is None:
        return None
    answer = str(answer)
    answer = extract_final_answer(answer) if ("####" in answer or "\\boxed" in answer) else clean_answer(answer)
    return re.sub(r"\s+", "", answer) if answer else None


def _equal(prediction: str | None, truth: str | None) -> bool:
    if prediction is None or truth is None:
        return False
    try:  # numbers compare by value: "68" == "68.0" == "68.00"
        return Decimal(prediction) == Decimal(truth)
    except InvalidOperation:
        return prediction == truth


def _check_lengths(completions: Sequence, ground_truth: Sequence) -> None:
    if isinstance(ground_truth, str) or len(ground_truth) != len(completions):
        got = "a string" if isinstance(ground_truth, str) else f"{len(ground_truth)} values"
        raise ValueError(f"ground_truth must be a list with one answer per completion ({len(completions)}), "
                         f"got {got}; pass the dataset column, e.g. ground_truth=batch['ground_truth'].")


def exact_match(completions: Sequence, ground_truth: Sequence, **kwargs: Any) -> list[float]:
    """1.0 where the completion's final answer equals the ground truth (numbers compared by value), else 0.0."""
    _check_lengths(completions, ground_truth)
    return [float(_equal(_normalize(extract_final_answer(completion_text(c))), _normalize(gt)))
            for c, gt in zip(completions, ground_truth)]


def _too_expensive(expressions: list) -> bool:
    """True when sympy could hang evaluating one of these parsed expressions (huge powers or factorials)."""
    from sympy import Basic, Number, Pow, factorial, preorder_traversal

    for expr in expressions:
        if not isinstance(expr, Basic):
            continue
        for node in preorder_traversal(expr):
            if isinstance(node, Pow):
                exp = node.exp
                if exp.has(Pow) or (isinstance(exp, Number) and abs(exp) > _MAX_EXPONENT):
                    return True
            if isinstance(node, factorial) and isinstance(node.args[0], Number) and abs(node.args[0]) > _MAX_FACTORIAL:
                return True
    return False


def _verify(truth: str, text: str) -> bool:
    from math_verify import parse, verify

    timeout = _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold_text = truth if ("$" in truth or "\\boxed" in truth) else f"${truth}$"
    gold = parse(gold_text, parsing_timeout=timeout)
    answer = extract_final_answer(text)
    # math_verify does not know the GSM8K "####" marker: hand it the answer that follows.
    if answer is not None and "####" in text and last_boxed(text) is None:
        text = f"${answer}$"
    prediction = parse(text, parsing_timeout=timeout)
    if not gold or not prediction or _too_expensive(gold + prediction):
        return False
    return verify(gold, prediction, timeout_seconds=timeout)


def math_equivalence(completions: Sequence, ground_truth: Sequence, **kwargs: Any) -> list[float]:
    """1.0 where the completion's answer is mathematically equal to the ground truth ("\\frac{1}{2}" == "0.5"),
    judged by math_verify; exact_match decides when math_verify cannot parse either side."""
    _check_lengths(completions, ground_truth)
    scores = exact_match(completions, ground_truth)
    for i, (completion, truth) in enumerate(zip(completions, ground_truth)):
        if scores[i] == 0.0 and truth is not None:
            try:
                scores[i] = float(_verify(str(truth), completion_text(completion)))
            except Exception:  # a reward must not crash training on one odd completion
                scores[i] = 0.0
    return scores


def task_checker(completions: Sequence, task: Sequence[str] | None = None, task_entry: Sequence | None = None,
                 task_settings: Sequence | None = None, answer_format: Sequence | None = None,
                 **kwargs: Any) -> list[float]:
    """1.0 where the task's own answer checker (reasoning-gym) gives the completion's answer (its last
    `<answer>...</answer>`, or its last number for rows whose `answer_format` is "number") a full score, else 0.0.
    Reads the `task`, `task_entry`, `task_settings` and `answer_format` columns of `a2po.tasks` datasets."""
    if task is None or task_entry is None:
        raise ValueError("task_checker needs the 'task' and 'task_entry' columns of a reasoning-gym dataset "
                         "(a2po.tasks.task_dataset); use exact_match or math_equivalence for other datasets.")
    from a2po.tasks import score_completions

    return score_completions(completions, task, task_entry, task_settings, answer_format)


def as_given(prompt: Any, completion: str) -> str | list[dict[str, str]]:
    """`completion` as reward functions (and TRL's completion table) get it: text for a text prompt, an assistant
    message for a conversational one."""
    return completion if isinstance(prompt, str) else [{"role": "assistant", "content": completion}]


# The keyword arguments the trainer passes besides the dataset columns (a column of one of these names is shadowed).
TRAINER_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")


@dataclass
class RewardCalls:
    """What the reward functions gave for one batch of completions (`call_rewards`)."""

    values: list[list[float | None]]  # per function, one value per completion (None: it does not apply)
    extra_columns: dict[str, list] = field(default_factory=dict)  # `log_extra`: one value per completion
    metrics: dict[str, float] = field(default_factory=dict)       # `log_metric`: the mean of the batch's values

    def weighted(self, weights: Sequence[float]) -> list[float | None]:
        """Each completion's reward: the weighted sum of the functions' values, skipping those that do not apply to
        it (None, or NaN: a sum ignoring NaN, as TRL's); None where every function skipped it."""
        totals: list[float | None] = []
        for values in zip(*self.values):
            terms = [float(w) * v for w, v in zip(weights, values) if v is not None and not math.isnan(v)]
            totals.append(sum(terms) if terms else None)
        return totals


def is_async_callable(func: Callable[..., Any]) -> bool:
    """Whether calling `func` returns a coroutine: an `async def` function, a `functools.partial` of one, or an
    object whose `__call__` is `async` (as TRL's `is_async_callable`)."""
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)


_loop: tuple[int, asyncio.AbstractEventLoop] | None = None
_loop_lock = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    """The process's event loop for async reward functions, running in a daemon thread, as TRL's: one loop for the
    whole run, so a client a function keeps between calls (an HTTP session for a judge) stays bound to a live loop.
    A forked process (a chunk) starts its own: the parent's thread did not follow it."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid() or _loop[1].is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="a2po-async-rewards", daemon=True).start()
            _loop = (os.getpid(), loop)
        return _loop[1]


def _checked(name: str, values: Any, expected: int, columns: dict[str, list]) -> list[float | None]:
    sized = hasattr(values, "__len__") and not isinstance(values, (str, bytes))
    if not sized or len(values) != expected:
        got = "None" if values is None else f"{len(values)} values" if sized else type(values).__name__
        raise ValueError(f"Reward function '{name}' returned {got} for {expected} completions{tasks_of(columns)}; it "
                         "must return a list with one float per completion (None for a completion it does not apply "
                         "to).")
    out: list[float | None] = []
    for value in values:
        try:
            out.append(None if value is None else float(value))
        except (TypeError, ValueError):
            raise ValueError(f"Reward function '{name}' returned {shown(value)}, not a number; return one float per "
                             "completion (None for a completion it does not apply to).") from None
    return out


def _failed(name: str, error: Exception) -> RuntimeError:
    return RuntimeError(f"Reward function '{name}' raised {type(error).__name__}: {error}")


def call_rewards(funcs: Sequence[Callable[..., Any]], names: Sequence[str], prompts: Sequence,
                 completions: Sequence, completion_ids: Sequence[Sequence[int]], columns: dict[str, list],
                 trainer_state: Any) -> RewardCalls:
    """Each function's values for `completions`, called as TRL 1.16's GRPOTrainer calls reward functions: by keyword,
    `prompts`, `completions`, `completion_ids` (each completion's token ids up to and including its end token), every
    other dataset column, `trainer_state`, and the callbacks `log_extra(column, values)` (a column of the completions
    table, one value per completion) and `log_metric(name, value)` (a scalar, averaged over the batch here and over
    the logging step by the trainer). The synchronous functions run in order, then the `async` ones concurrently on
    one event loop. None marks a completion a function does not apply to (multi-task data with one checker per task);
    the caller sums the others. Raises, naming the function, when one fails or does not return one number (or None)
    per completion, and naming the column when `log_extra` was not given one value per completion."""
    extra: dict[str, list] = defaultdict(list)
    logged: dict[str, list[float]] = defaultdict(list)

    def log_extra(column: str, values: Sequence) -> None:
        extra[column].extend(values)

    def log_metric(name: str, value: float) -> None:
        logged[name].append(float(value))

    # The trainer's arguments last: they win over dataset columns of those names, as in TRL.
    kwargs = {**columns, "prompts": prompts, "completions": completions, "completion_ids": completion_ids,
              "trainer_state": trainer_state, "log_extra": log_extra, "log_metric": log_metric}
    values: list[Any] = [None] * len(funcs)
    waiting = []
    for j, (func, name) in enumerate(zip(funcs, names)):
        if is_async_callable(func):
            waiting.append(j)
            continue
        try:
            values[j] = func(**kwargs)
        except Exception as error:
            raise _failed(name, error) from error
    if waiting:
        async def run_async() -> list[Any]:
            return await asyncio.gather(*(funcs[j](**kwargs) for j in waiting), return_exceptions=True)

        results = asyncio.run_coroutine_threadsafe(run_async(), _event_loop()).result()
        for j, result in zip(waiting, results):
            if isinstance(result, Exception):
                raise _failed(names[j], result) from result
            values[j] = result
    checked = [_checked(name, v, len(completions), columns) for name, v in zip(names, values)]
    for column, column_values in extra.items():
        if len(column_values) != len(completions):
            raise ValueError(f"log_extra({column!r}, ...) got {len(column_values)} values for {len(completions)} "
                             "completions; give one value per completion, in the order of `completions`.")
    metrics = {name: math.fsum(v) / len(v) for name, v in logged.items()}
    return RewardCalls(checked, dict(extra), metrics)


def row_columns(rows: Sequence[dict[str, Any]]) -> dict[str, list]:
    """The dataset columns reward functions get from `rows`: every key but the prompt (given as `prompts`) and
    `completions`."""
    return {key: [row.get(key) for row in rows] for key in rows[0] if key not in ("prompt", "completions")}


def call_on_rows(funcs: Sequence[Callable[..., Any]], names: Sequence[str], rows: Sequence[dict[str, Any]],
                 completions: Sequence[str], completion_ids: Sequence[Sequence[int]] | None,
                 trainer_state: Any) -> RewardCalls:
    """`call_rewards` on one completion of each dataset row: the rows' prompts, each completion as given
    (`as_given`), every other column of the rows. The trainers score with it, and the playground's process
    (`completion_ids` None where it has no tokens: an answer column it scores)."""
    prompts = [row["prompt"] for row in rows]
    given = [as_given(prompt, completion) for prompt, completion in zip(prompts, completions)]
    return call_rewards(funcs, names, prompts, given, completion_ids, row_columns(rows), trainer_state)


def tasks_of(columns: dict[str, list], rows: Sequence[int] | None = None) -> str:
    """" of task 'a', 'b'" for the `task` column's values (of `rows`), to name in an error; "" without that column."""
    tasks = columns.get("task") or []
    picked = tasks if rows is None or not tasks else [tasks[i] for i in rows]
    names = sorted({str(t) for t in picked if t is not None})
    return f" of task {', '.join(repr(t) for t in names)}" if names else ""


REWARD_FUNCTIONS: dict[str, Callable[..., list[float]]] = {
    "exact_match": exact_match,
    "math_equivalence": math_equivalence,
    "task_checker": task_checker,
}
