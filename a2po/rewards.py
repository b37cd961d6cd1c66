"""Reward functions for verifiable answers, in the TRL convention `f(completions, **kwargs) -> list[float]`.

`kwargs` carries `prompts`, every dataset column and `trainer_state` (the `transformers.TrainerState`, as TRL passes
it); these functions read `ground_truth` (`task_checker`: the reasoning-gym columns of `a2po.tasks`) and ignore the
rest. A completion is a plain string or a conversational list such as `[{"role": "assistant", "content": "..."}]`
(the last message counts). A reward function may return None for a completion it does not apply to (`call_reward`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from a2po.answers import clean_answer, completion_text, extract_final_answer, last_boxed

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


def call_reward(func: Callable[..., Any], name: str, prompts: Sequence, completions: Sequence,
                columns: dict[str, list], trainer_state: Any) -> list[float | None]:
    """`func`'s values for `completions`, called as TRL calls a reward function: `prompts`, `completions`, every other
    dataset column and `trainer_state`, by keyword. None marks a completion the function does not apply to (multi-task
    data with one checker per task); the caller sums the others. Raises, naming the function, when it fails or does
    not return one number (or None) per completion."""
    try:
        # `trainer_state` last: it wins over a dataset column of that name, as in TRL.
        values = func(prompts=prompts, completions=completions, **{**columns, "trainer_state": trainer_state})
    except Exception as error:
        raise RuntimeError(f"Reward function '{name}' raised {type(error).__name__}: {error}") from error
    expected = len(completions)
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
            raise ValueError(f"Reward function '{name}' returned {value!r:.40}, not a number; return one float per "
                             "completion (None for a completion it does not apply to).") from None
    return out


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
