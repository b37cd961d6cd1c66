"""The stage-1 V* table: one row per prompt, saved, loaded and reused.

Columns (`VALUE_COLUMNS`): `prompt_id` (stable id of the dataset row), `prompt` (as given: text or messages),
`prompt_text` (what the model saw), `v_star`, `rewards` (the N reference rewards), `completions` (the N reference
completions), `num_correct` (rewards equal to 1), `filtered` (dropped from training because none was correct).
A dataset that carries a `v_star` column skips stage 1 for every row where it is not null.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset

from a2po.answers import CORRECT_THRESHOLD
from a2po.core import optimal_value, pass_at_k

PROMPT_IS_JSON = "prompt_is_json"  # a parquet V* table's column: the prompt is a JSON list of messages
VALUE_COLUMNS = ("prompt_id", "prompt", "prompt_text", "v_star", "rewards", "completions", "num_correct", "filtered")
# Beyond the sampling settings, what changes the reference's samples: how the model is loaded (revision, dtype,
# attention, remote code), the precision it samples in and the sampler (vLLM draws other streams than the native
# decoder).
LOADING_FIELDS = ("model_init_kwargs", "trust_remote_code", "bf16", "fp16", "use_vllm")


def loading_key(setting: Callable[[str], Any]) -> dict[str, Any]:
    """The `LOADING_FIELDS` a V* fingerprint counts, read with `setting(name)`: only those set (not empty or
    False), so a V* set sampled at the defaults keeps the fingerprint it had before these counted."""
    return {name: value for name in LOADING_FIELDS if (value := setting(name))}


def prompt_id_for(row: dict[str, Any]) -> str:
    """Stable id of a dataset row: its own `prompt_id`, else a hash of all its columns (not only the prompt), so
    the same question with two different answers gets two ids."""
    if row.get("prompt_id") is not None:
        return str(row["prompt_id"])
    content = {k: v for k, v in row.items() if k not in ("v_star", "prompt_id")}
    blob = json.dumps(content, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def with_prompt_ids(dataset: Dataset) -> Dataset:
    """`dataset` with a `prompt_id` column: its own, else a hash of each row (`prompt_id_for`)."""
    if "prompt_id" in dataset.column_names:
        return dataset
    return dataset.add_column("prompt_id", [prompt_id_for(row) for row in dataset.to_list()])


def value_record(prompt_id: str, prompt: Any, prompt_text: str, rewards: Sequence[float], completions: Sequence[str],
                 beta1: float, filter_all_incorrect: bool) -> dict[str, Any]:
    """One row of the V* table from the N reference rewards of a prompt."""
    num_correct = sum(r >= CORRECT_THRESHOLD for r in rewards)
    v_star = float(optimal_value(torch.tensor([list(rewards)]), beta1)[0])
    return {"prompt_id": prompt_id, "prompt": prompt, "prompt_text": prompt_text, "v_star": v_star,
            "rewards": [float(r) for r in rewards], "completions": list(completions), "num_correct": int(num_correct),
            "filtered": bool(filter_all_incorrect and num_correct == 0)}


def known_value_record(prompt_id: str, prompt: Any, prompt_text: str, v_star: float,
                       filter_all_incorrect: bool) -> dict[str, Any]:
    """A row whose V* was given by the dataset: no reference samples; filtered when V* is 0 (nothing solved)."""
    return {"prompt_id": prompt_id, "prompt": prompt, "prompt_text": prompt_text, "v_star": float(v_star),
            "rewards": [], "completions": [], "num_correct": None,
            "filtered": bool(filter_all_incorrect and v_star <= 0)}


def rescore(record: dict[str, Any], beta1: float, filter_all_incorrect: bool) -> dict[str, Any]:
    """Recompute V* and the filter from stored rewards (a saved table stays valid when beta1 changes)."""
    if not record.get("rewards"):
        return known_value_record(record["prompt_id"], record["prompt"], record["prompt_text"], record["v_star"],
                                  filter_all_incorrect)
    return value_record(record["prompt_id"], record["prompt"], record["prompt_text"], record["rewards"],
                        record["completions"], beta1, filter_all_incorrect)


def summarize(records: Iterable[dict[str, Any]], num_value_samples: int) -> dict[str, float]:
    """Stage-1 figures: prompts, filtered, mean V*, and the reference pass@1 and pass@N (A*-PO's ceiling)."""
    records = list(records)
    sampled = [r for r in records if r.get("rewards")]
    summary = {"num_prompts": len(records), "num_filtered": sum(bool(r["filtered"]) for r in records),
               "mean_v_star": sum(r["v_star"] for r in records) / max(len(records), 1),
               "num_value_samples": num_value_samples}
    if sampled:
        correct = torch.tensor([r["num_correct"] for r in sampled])
        n = len(sampled[0]["rewards"])
        summary["pass_at_1"] = float(pass_at_k(correct, n, 1).mean())
        summary["pass_at_n"] = float(pass_at_k(correct, n, n).mean())
    return summary


def save_optimal_values(table: Dataset | Iterable[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Save a V* table as JSON lines (or parquet when the path ends in .parquet)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = table.to_list() if isinstance(table, Dataset) else list(table)
    if path.suffix == ".parquet":
        Dataset.from_list([_jsonable(r) for r in rows]).to_parquet(str(path))
        return path
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def load_optimal_values(path: str | os.PathLike) -> Dataset:
    """Load a V* table saved by `save_optimal_values` (jsonl or parquet); a torn last line is skipped."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"No V* table at {path}; run stage 1 (`python -m a2po values ...`) to create one.")
    if path.suffix == ".parquet":
        rows = Dataset.from_parquet(str(path)).to_list()
        for row in rows:
            if row.pop(PROMPT_IS_JSON, False):
                row["prompt"] = json.loads(row["prompt"])
        return Dataset.from_list(rows)
    return Dataset.from_list(read_jsonl(path))


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file written incrementally; an incomplete last line (interrupted write) is ignored."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return rows


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    # Parquet needs one type per column: messages lists are stored as JSON text, flagged so that a text prompt that
    # happens to look like JSON ("[1, 2] + [3]") reads back as text.
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return {**row, PROMPT_IS_JSON: False}
    return {**row, "prompt": json.dumps(prompt, ensure_ascii=False), PROMPT_IS_JSON: True}
