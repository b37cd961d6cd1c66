"""Reading prompts and completions: the question a prompt asks, a completion's text, the final answer in it, and
when a reward counts as correct. Every part of the project (the trainers, the rewards, the tasks, the store's
queries, the studio's pages) reads them here, so a rule is defined once."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# A reward counts as correct when it is 1: binary rewards, with room for a float sum of weights.
CORRECT_THRESHOLD = 1.0 - 1e-6
# Integers or decimals, thousands separators ("1,234,567") tried first; a minus right after a digit, letter or
# ")" is subtraction ("3-4" ends with 4), elsewhere it is a sign ("x = -4").
_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")
_GROUPED = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_BOXED = re.compile(r"\\boxed\s*\{")


def completion_text(completion: Any) -> str:
    """The text of one completion: the string itself, or the content of the last message of a conversation."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, Sequence) and completion:
        content = completion[-1].get("content", "") if isinstance(completion[-1], dict) else completion[-1]
        if isinstance(content, list):  # multimodal style: [{"type": "text", "text": ...}, ...]
            return "".join(part.get("text", "") for part in content if isinstance(part, dict))
        return "" if content is None else str(content)
    return "" if completion is None else str(completion)


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}`, matching nested braces."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i]
    return None


def clean_answer(answer: str) -> str:
    answer = answer.strip().strip("$").strip()
    answer = answer.rstrip(".").strip()
    if _GROUPED.fullmatch(answer):
        answer = answer.replace(",", "")
    return answer


def extract_final_answer(text: str) -> str | None:
    """The final answer of a solution: the last `\\boxed{...}`, else the text after the last `####`, else the
    last number. Returns None when there is none."""
    text = completion_text(text)
    boxed = last_boxed(text)
    if boxed is not None and clean_answer(boxed):
        return clean_answer(boxed)
    if "####" in text:
        after = text.rsplit("####", 1)[1].strip()
        after = clean_answer(after.splitlines()[0]) if after else ""
        if after:
            return after
    numbers = _NUMBER.findall(text)
    return clean_answer(numbers[-1]) if numbers else None


def prompt_text(prompt: Any) -> str:
    """A prompt as readable text: a string as is, a single user message as its content, else `role: content`."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and all(isinstance(m, dict) for m in prompt):
        if len(prompt) == 1 and prompt[0].get("role") == "user":
            return str(prompt[0].get("content", ""))
        return "\n\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in prompt)
    return str(prompt)


def prompt_question(prompt: Any) -> str:
    """What the user asked: a string prompt as is, else the content of the last user message (a table shows this,
    not the chat template's system text around it)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if users:
            return str(users[-1].get("content", ""))
    return prompt_text(prompt)
