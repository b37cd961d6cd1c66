"""Stage 1, a component both trainers hold (`trainer.stage_one`): for every prompt, `num_value_samples` completions
of the reference policy, their rewards, V* and the pass rate.

    V*(x) = beta1 * ( logsumexp_i(r_i / beta1) - log N )          (`a2po.core.optimal_value`)

`A2POTrainer` regresses onto V* and, with `filter_all_incorrect`, drops the prompts no sample solved; `GRPOTrainer`
samples stage 1 only to select prompts by pass rate (`pass_rate_band`). Each trainer gives its own rules (beta1, the
filter); the samples, the V* table and its fingerprint are the same for both, so a GRPO run that selects reuses the
V* set of an A*-PO run with the same sampling settings (docs/selection.md).

Read top to bottom: the rules and the rows already known, `estimate` (which samples only the prompts without a row,
batch by batch, each batch on the run's clock and seen by the callbacks), then what training reads of the tables.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import Trainer, TrainerState

from a2po._faults import fault_point
from a2po.callbacks import StageInterrupted
from a2po.config import in_pass_rate_band
from a2po.device import frozen_gc
from a2po.rollout import completion_token_lists
from a2po.values import (
    known_value_record,
    load_optimal_values,
    loading_key,
    prompt_id_for,
    read_jsonl,
    rescore,
    summarize,
    value_record,
)

Pending = list[tuple[str, dict[str, Any]]]  # (prompt id, dataset row) of the prompts stage 1 samples


class StageOne:
    """Stage 1 of `trainer` (a `BaseTrainer`, whose `estimate_optimal_values`, `set_optimal_values`, `value_tables`
    and `value_fingerprint` are this object's public face), under the method's rules: V* at `beta1`, and with
    `filter_all_incorrect` the prompts no reference sample solved left out of training."""

    def __init__(self, trainer: Trainer, beta1: float, filter_all_incorrect: bool) -> None:
        self.trainer = trainer
        self.beta1, self.filter_all_incorrect = beta1, filter_all_incorrect
        self.tables: dict[str, Dataset] = {}  # the V* tables, by split
        self._known: dict[str, dict[str, dict[str, Any]]] = {}  # rows given by `set_known`, by split and prompt id

    @property
    def rules(self) -> tuple[float, bool]:
        """(beta1, filter_all_incorrect): how a row is scored from its rewards (`a2po.values.rescore`)."""
        return self.beta1, self.filter_all_incorrect

    def fingerprint(self) -> str:
        """What the samples depend on (not beta1: V* is recomputed from the stored rewards)."""
        trainer, a = self.trainer, self.trainer.args
        key = {"model": str(trainer.model_id), "rewards": trainer.reward_names,
               "weights": trainer.reward_weights.tolist(), "seed": trainer.values_seed,
               "n": a.num_value_samples, "temperature": a.temperature, "top_p": a.top_p, "top_k": a.sampling_top_k,
               "max_prompt_length": a.max_prompt_length, "max_completion_length": trainer.max_completion_length}
        if loading := loading_key(lambda name: getattr(a, name, None)):
            key["loading"] = loading
        return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def set_known(self, records: Dataset | Sequence[dict[str, Any]], split: str = "train") -> None:
        """Rows stage 1 already has (e.g. from a database), with their rewards and completions: those prompts are not
        sampled again, and V* is recomputed from the rewards under this stage's rules."""
        rows = records.to_list() if isinstance(records, Dataset) else list(records)
        self._known.setdefault(split, {}).update({row["prompt_id"]: row for row in rows})

    def _cache_path(self, split: str) -> Path | None:
        args, accelerator = self.trainer.args, self.trainer.accelerator
        if not args.save_values or not args.output_dir:
            return None
        rank = f".rank{accelerator.process_index}" if accelerator.num_processes > 1 else ""
        return Path(args.output_dir) / f"optimal_values-{split}-{self.fingerprint()}{rank}.jsonl"

    def _stored(self, split: str) -> dict[str, dict[str, Any]]:
        """Rows already known from `set_known`, `values_path` or this run's cache files, by prompt id."""
        found: dict[str, dict[str, Any]] = dict(self._known.get(split, {}))
        if self.trainer.args.values_path:
            for row in load_optimal_values(self.trainer.args.values_path).to_list():
                found[row["prompt_id"]] = row
        cache = self._cache_path(split)
        if cache is not None:
            for path in sorted(cache.parent.glob(f"optimal_values-{split}-{self.fingerprint()}*.jsonl")):
                for row in read_jsonl(path):
                    found[row["prompt_id"]] = row
        return found

    # ----------------------------------------------------------------------------------------------------------
    # Sampling

    @frozen_gc
    def estimate(self, dataset: Dataset | None = None, split: str = "train") -> Dataset:
        """The V* table (see `a2po.values.VALUE_COLUMNS`) for `dataset` (default: the trainer's set `split`).

        Rows with a `v_star` value, or already known (`_stored`), are not sampled again. Under several processes
        each samples its shard and every process gets the whole table.
        """
        trainer = self.trainer
        if dataset is None:
            dataset = trainer.train_dataset if split == "train" else trainer.eval_sets().get(split)
        if dataset is None:
            raise ValueError(f"No dataset for split '{split}': pass train_dataset (or eval_dataset) to "
                             f"{type(trainer).__name__}.")
        if "prompt" not in dataset.column_names:
            raise ValueError(f"The {split} dataset has no 'prompt' column (it has {dataset.column_names}); rename "
                             "the column holding the prompts to 'prompt'.")
        rows = dataset.to_list()
        ids = [prompt_id_for(row) for row in rows]
        records, pending = self._known_records(rows, ids, split)
        # A stop already pending (e.g. the end of training) is not a stop request for this stage.
        stop_before, trainer.control.should_training_stop = trainer.control.should_training_stop, False
        trainer._notify("on_values_begin", split=split, num_prompts=len(rows), num_pending=len(pending))
        new_records, logged = self._sample(pending, split, len(rows))
        trainer.control.should_training_stop = stop_before
        records.update({record["prompt_id"]: record for record in new_records})
        return self._finish(split, [records[pid] for pid in dict.fromkeys(ids)], logged, sampled=bool(pending))

    def _known_records(self, rows: list[dict[str, Any]], ids: list[str],
                       split: str) -> tuple[dict[str, dict[str, Any] | None], Pending]:
        """The rows of the prompts that have one (a `v_star` value, or `_stored`), and the prompts to sample."""
        trainer = self.trainer
        stored = self._stored(split)
        # Every rank must see the same stored rows before any rank appends new ones, or the shards would differ.
        trainer.accelerator.wait_for_everyone()
        records: dict[str, dict[str, Any] | None] = {}
        pending: Pending = []
        for pid, row in zip(ids, rows):
            if row.get("v_star") is not None:
                records[pid] = known_value_record(pid, row["prompt"], trainer._render_prompt(row["prompt"]),
                                                  row["v_star"], self.filter_all_incorrect)
            elif pid in stored:
                given = {"prompt": row["prompt"], "prompt_text": trainer._render_prompt(row["prompt"]), **stored[pid]}
                records[pid] = rescore(given, *self.rules)
            elif pid not in records:
                records[pid] = None  # placeholder keeps duplicate rows from being sampled twice
                pending.append((pid, row))
        return records, pending

    def _sample(self, pending: Pending, split: str, total: int) -> tuple[list[dict[str, Any]], dict[str, list]]:
        """This rank's shard of `pending`, sampled batch by batch: the new rows, and the reward functions'
        `log_metric` values. Raises `StageInterrupted` after the batch in which a callback asks to stop."""
        trainer, args = self.trainer, self.trainer.args
        rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
        # Similar lengths in a batch waste less padding.
        mine = sorted(pending[rank::world], key=lambda item: len(trainer._render_prompt(item[1]["prompt"])))
        size, done, new_records = args.stage1_batch_size, total - len(pending), []
        logged: dict[str, list[float]] = defaultdict(list)
        bar = tqdm(total=len(pending), desc=f"Stage 1: V* ({split})", unit="prompt",
                   disable=not trainer.is_local_process_zero() or args.disable_tqdm)
        # Every rank runs as many batches as the largest shard (the first) needs, with an empty batch once its own
        # shard is done: each batch ends in collectives (records gathered, the stop agreed) that every rank joins.
        num_batches = -(-len(pending[0::world]) // size)
        with trainer._reference_policy() as reference:
            for start in range(0, num_batches * size, size):
                stats = trainer.rollout_stats["values"]
                before = (time.perf_counter(), stats["tokens"], stats["flops"])
                batch_records = self._sample_batch(reference, mine[start:start + size], logged)
                self._save(split, batch_records)
                batch_records, spent = self._count(split, batch_records, before)
                new_records.extend(batch_records)
                done += len(batch_records)
                bar.update(len(batch_records))
                counters = trainer.run_counters
                trainer._notify("on_values_batch", split=split, records=batch_records, done=done, total=total,
                                seconds=counters.values_seconds[split], completion_tokens=counters.values_tokens[split],
                                batch_seconds=float(spent[0]), batch_tokens=int(spent[1]),
                                flops=counters.values_flops[split], batch_flops=float(spent[2]))
                trainer._agree_on_control("should_training_stop")
                if trainer.control.should_training_stop:
                    bar.close()
                    raise StageInterrupted(f"Stage 1 ({split}) stopped after {done} of {total} prompts; rerun to "
                                           "continue with the prompts not yet done.")
        bar.close()
        return new_records, logged

    def _sample_batch(self, reference: torch.nn.Module, batch: Pending,
                      logged: dict[str, list[float]]) -> list[dict[str, Any]]:
        """The rows of one batch of prompts: N completions each from `reference`, scored."""
        if not batch:
            return []
        trainer, n = self.trainer, self.trainer.args.num_value_samples
        rows = [{**row, "prompt_id": pid} for pid, row in batch]
        prompt_ids, prompt_mask, texts = trainer._encode_prompts([row["prompt"] for row in rows])
        completion_ids = trainer._sample(reference, prompt_ids, prompt_mask, num_samples=n, phase="values",
                                         row_keys=trainer._stream_keys("values", rows, n))
        completions, mask = trainer._decode(completion_ids)
        repeated = [row for row in rows for _ in range(n)]
        with trainer._reward_metrics_into(logged):
            rewards = trainer._score(repeated, completions, completion_token_lists(completion_ids, mask),
                                     trainer_state=self._state_before_training()).total
        fault_point("values_batch")
        return [value_record(pid, row["prompt"], texts[i], rewards[i * n:(i + 1) * n].tolist(),
                             completions[i * n:(i + 1) * n], *self.rules) for i, (pid, row) in enumerate(batch)]

    def _state_before_training(self) -> TrainerState:
        """The trainer state as reward functions see it in stage 1 (global_step 0), whenever it runs (an eval set's
        V* may be estimated mid-training), so V* never depends on that moment."""
        state = copy.copy(self.trainer.state)
        state.global_step, state.epoch = 0, 0.0
        return state

    def _save(self, split: str, records: list[dict[str, Any]]) -> None:
        """Append a batch's rows to this run's saved table (`save_values`), which a rerun reads back."""
        path = self._cache_path(split)
        if path is not None and records:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)

    def _count(self, split: str, records: list[dict[str, Any]],
               before: tuple[float, float, float]) -> tuple[list[dict[str, Any]], torch.Tensor]:
        """A batch on the run's clock: its sampling and scoring since `before` (time, tokens, FLOPs), the slowest
        rank's time and every rank's tokens and compute. Returns every rank's rows (the callbacks of every rank, the
        main one stores them, see them all) and what the batch spent."""
        trainer = self.trainer
        stats, (started, tokens_before, flops_before) = trainer.rollout_stats["values"], before
        spent = torch.tensor([time.perf_counter() - started, stats["tokens"] - tokens_before,
                              stats["flops"] - flops_before], dtype=torch.float64)
        if trainer.accelerator.num_processes > 1:
            records = gather_object(records)
            gathered = trainer.accelerator.gather(spent[None].to(trainer.accelerator.device)).cpu()
            spent = torch.stack([gathered[:, 0].max(), gathered[:, 1].sum(), gathered[:, 2].sum()])
        trainer.run_counters.add_values(split, float(spent[0]), int(spent[1]), float(spent[2]))
        return records, spent

    def _finish(self, split: str, rows: list[dict[str, Any]], logged: dict[str, list[float]],
                sampled: bool) -> Dataset:
        """The split's table, kept, handed to the callbacks (`on_values_end`) and logged with its summary."""
        trainer = self.trainer
        reward_metrics = trainer._reward_metric_means(logged)
        table = Dataset.from_list(rows)
        summary = summarize(rows, trainer.args.num_value_samples)
        if sampled:
            # The split's whole cost so far, earlier starts included; a stage 1 that sampled nothing (every row was
            # stored) logs no cost, so it never replaces the figures of the start that paid for them.
            counters = trainer.run_counters
            summary["runtime"] = round(counters.values_seconds.get(split, 0.0), 4)
            summary["completion_tokens"] = counters.values_tokens.get(split, 0)
            summary["flops"] = counters.values_flops.get(split, 0.0)
        self.tables[split] = table
        trainer._notify("on_values_end", split=split, values=table, summary=summary)
        # The reward functions' `log_metric` values, averaged over what this start sampled; a built-in name wins.
        trainer.log({f"values/{split}/{k}": float(v) for k, v in {**reward_metrics, **summary}.items()})
        return table

    # ----------------------------------------------------------------------------------------------------------
    # What training and evaluation read

    def table_for(self, dataset: Dataset, split: str) -> tuple[Dataset, str]:
        """`dataset`'s V* table and its name: `split`'s own table when it holds every prompt of `dataset` (or when
        `dataset` is the trainer's own set of that name), else a table of its own named after `split` and its prompt
        ids, so evaluating another dataset never reads, or replaces, the V* of the trainer's own."""
        trainer = self.trainer
        ids = {prompt_id_for(row) for row in dataset.to_list()}
        table = self.tables.get(split)
        own = trainer.train_dataset if split == "train" else trainer.eval_sets().get(split)
        if table is not None and ids <= set(table["prompt_id"]):
            return table, split
        if dataset is own or (own is None and table is None):
            return self.estimate(dataset, split), split
        name = f"{split}-{hashlib.sha1(json.dumps(sorted(ids)).encode()).hexdigest()[:8]}"
        table = self.tables.get(name)
        return (table if table is not None else self.estimate(dataset, name)), name

    def keeps(self, record: dict[str, Any]) -> bool:
        """Whether training keeps the prompt of a V* row: not dropped by `filter_all_incorrect`, and its reference
        pass rate inside `pass_rate_band` (when set)."""
        band = self.trainer.args.pass_rate_band
        if record["filtered"]:
            return False
        if band is None:
            return True
        if not record.get("rewards"):
            raise ValueError(f"pass_rate_band needs each prompt's reference samples, but prompt "
                             f"{record['prompt_id']!r} has a V* given by the dataset (its `v_star` column) and none: "
                             "drop the v_star column so stage 1 samples it, or set pass_rate_band to None.")
        return in_pass_rate_band(record["num_correct"], len(record["rewards"]), band)

    def _rows(self, dataset: Dataset, split: str, select: bool) -> tuple[list[int], list[dict[str, Any]], Dataset]:
        """The indices of `dataset`'s rows (with `select`: those training `keeps`), their V* rows, and the table
        (estimated first where it lacks them)."""
        table, _ = self.table_for(dataset, split)
        by_id = {row["prompt_id"]: row for row in table.to_list()}
        records = [by_id[prompt_id_for(row)] for row in dataset.to_list()]
        keep = [i for i, record in enumerate(records) if not select or self.keeps(record)]
        return keep, [records[i] for i in keep], table

    def select(self, dataset: Dataset, split: str = "train") -> Dataset:
        """The rows of `dataset` training keeps (`keeps`), the columns left as they are (GRPO's prompts)."""
        keep, _, _ = self._rows(dataset, split, select=True)
        return dataset.select(keep)

    def with_values(self, dataset: Dataset, split: str, select: bool) -> tuple[Dataset, Dataset]:
        """`dataset` with the `prompt_id` and `v_star` of its V* table (A*-PO's targets), and the table; `select`:
        only the rows training keeps."""
        keep, records, table = self._rows(dataset, split, select)
        out = dataset.select(keep)
        if self.trainer.args.remove_unused_columns:
            out = out.select_columns(["prompt"])
        out = out.remove_columns([c for c in ("v_star", "prompt_id") if c in out.column_names])
        out = out.add_column("prompt_id", [r["prompt_id"] for r in records])
        return out.add_column("v_star", [r["v_star"] for r in records]), table

    def training_prompts(self, dataset: Dataset, with_values: bool = False) -> Dataset:
        """The training rows stage 1 keeps (`keeps`): with `with_values` (A*-PO) their `prompt_id` and `v_star`
        columns, else as they are (GRPO). An error when it keeps none."""
        kept = self.with_values(dataset, "train", select=True)[0] if with_values else self.select(dataset)
        band = self.trainer.args.pass_rate_band
        if len(kept) == 0 and band is not None:
            raise ValueError(f"No training prompt has a reference pass rate in pass_rate_band {list(band)}: widen "
                             "the band, or set it to None.")
        if len(kept) == 0:
            raise ValueError("Every training prompt was filtered out: no reference sample was correct. Use easier "
                             "prompts, more num_value_samples, a higher temperature, or filter_all_incorrect=False.")
        return kept
