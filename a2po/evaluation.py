"""The evaluation loop both trainers run on a held-out split (`BaseTrainer.evaluate`): each prompt's greedy
completion, scored: accuracy (pass@1, the number users care about; per task on a mix of tasks), mean reward and
completion length, and the method's own terms through the trainer's hooks (`_eval_batch`, `_eval_sample_fields`,
`_eval_summary`: A*-PO's regression loss and V*). Under several processes each evaluates its shard."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch
from accelerate.utils import gather_object
from datasets import Dataset

from a2po._faults import fault_point
from a2po.answers import CORRECT_THRESHOLD, prompt_question
from a2po.callbacks import StageInterrupted
from a2po.rollout import completion_token_lists


@torch.no_grad()
def evaluate_split(trainer: Any, dataset: Dataset, split: str, prefix: str,
                   context: Any = None) -> dict[str, float]:
    """The metrics of `trainer` (a `BaseTrainer`) on the held-out split `split`, each named `<prefix>_<metric>`. The
    samples go to the callbacks (`on_samples`); a callback that sets `control.should_training_stop` in
    `on_evaluate_batch` stops it after that batch with `StageInterrupted`."""
    rows = dataset.to_list()
    rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
    mine = rows[rank::world]
    batch_size = trainer.args.per_device_eval_batch_size
    results, samples = [], []
    logged: dict[str, list[float]] = defaultdict(list)  # the reward functions' `log_metric` values
    policy = trainer.accelerator.unwrap_model(trainer.model)
    # Every rank runs as many batches as the largest shard (the first) needs, with an empty batch once its own
    # shard is done: each batch ends in a collective (the stop agreed) that every rank joins.
    num_batches = -(-len(rows[0::world]) // batch_size)
    for index in range(num_batches):
        batch = mine[index * batch_size:(index + 1) * batch_size]
        if batch:
            prompt_ids, prompt_mask, texts = trainer._encode_prompts([row["prompt"] for row in batch])
            with trainer._reward_metrics_into(logged):
                greedy_ids, extra = trainer._eval_batch(policy, batch, prompt_ids, prompt_mask)
                greedy_completions, greedy_mask = trainer._decode(greedy_ids)
                greedy = trainer._score(batch, greedy_completions, completion_token_lists(greedy_ids, greedy_mask))
            for i, row in enumerate(batch):
                reward = float(greedy.total[i])
                correct = math.nan if math.isnan(reward) else float(reward >= CORRECT_THRESHOLD)
                results.append({"correct": correct, "reward": reward,
                                "length": float(greedy_mask[i].sum()), "task": row.get("task"),
                                **{name: values[i] for name, values in extra.items()}})
                samples.append({"step": trainer.state.global_step, "split": split, "prompt_id": row["prompt_id"],
                                "sample_index": 0, "prompt_text": texts[i],
                                "question": prompt_question(row["prompt"]), "completion": greedy_completions[i],
                                "reward": reward, **trainer._eval_sample_fields(row, reward),
                                "completion_length": int(greedy_mask[i].sum()),
                                "extra": {c: values[i] for c, values in greedy.extra_columns.items()}})
        done = min(len(rows), (index + 1) * batch_size * world)
        fault_point("evaluate_batch")
        trainer._notify("on_evaluate_batch", split=split, done=done, total=len(rows))
        trainer._agree_on_control("should_training_stop")
        if trainer.control.should_training_stop:
            raise StageInterrupted(f"Evaluation ({split}) stopped after {done} of {len(rows)} prompts.")
    if world > 1:
        results, samples = gather_object(results), gather_object(samples)
    trainer._notify("on_samples", samples=samples)
    n = max(len(results), 1)
    # Accuracy and reward over the scored prompts: an unscored one (NaN, see `_score`) is neither right nor wrong.
    out = {f"{prefix}_accuracy": scored_mean(r["correct"] for r in results),
           f"{prefix}_reward": scored_mean(r["reward"] for r in results)}
    for name in trainer._eval_extra_metrics:
        out[f"{prefix}_{name}"] = sum(r[name] for r in results) / n
    out[f"{prefix}_completion_length"] = sum(r["length"] for r in results) / n
    # A mix of tasks (a `task` column, e.g. reasoning-gym mixes): accuracy per task too.
    tasks = sorted({r["task"] for r in results if isinstance(r["task"], str)})
    if len(tasks) > 1:
        for task in tasks:
            out[f"{prefix}_accuracy/{task}"] = scored_mean(r["correct"] for r in results if r["task"] == task)
    out.update(trainer._eval_summary(prefix, rows, context))
    # The reward functions' own metrics under the evaluation's prefix, as TRL's "eval_<name>"; a built-in wins.
    metrics = trainer._reward_metric_means(logged)
    return {**{f"{prefix}_{name}": value for name, value in metrics.items()}, **out}


def scored_mean(values: Iterable[float]) -> float:
    """The mean of the values that are not NaN (unscored completions, see `BaseTrainer._score`); NaN when every one
    is, 0.0 when there are none."""
    values = list(values)
    scored = [v for v in values if not math.isnan(v)]
    return sum(scored) / len(scored) if scored else math.nan if values else 0.0
