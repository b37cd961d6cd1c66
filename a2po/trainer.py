"""`A2POTrainer`: A*-PO on top of `a2po.base_trainer.BaseTrainer` (itself a `transformers.Trainer`). The math is in
`a2po.core`; the set-up, prompts, rewards, sampling, callbacks, evaluation loop and logging shared with
`GRPOTrainer` are in `a2po.base_trainer`.

Read top to bottom: stage 1 (`ValueEstimation.estimate_optimal_values`, which `GRPOTrainer` shares to select
prompts by pass rate), then `A2POTrainer`: set-up, stage 2 (`compute_loss`), evaluation (greedy accuracy plus the
regression loss).
"""

from __future__ import annotations

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
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from a2po._faults import fault_point
from a2po.answers import prompt_question
from a2po.base_trainer import BaseTrainer, RewardFunc, completion_token_lists, frozen_gc
from a2po.callbacks import StageInterrupted
from a2po.config import A2POConfig, in_pass_rate_band
from a2po.core import a2po_loss
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

__all__ = ["A2POTrainer", "RewardFunc", "ValueEstimation", "frozen_gc"]


class ValueEstimation(BaseTrainer):
    """Stage 1, shared by both methods: for every prompt, `num_value_samples` completions of the reference policy,
    their rewards, V* and the pass rate. `A2POTrainer` regresses onto V*; `GRPOTrainer` samples it only to select
    prompts by pass rate (`pass_rate_band`). The V* table and its fingerprint are the same for both, so a GRPO run
    that selects reuses the V* set of an A*-PO run with the same sampling settings (docs/selection.md)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.value_tables: dict[str, Dataset] = {}
        self._known_values: dict[str, dict[str, dict[str, Any]]] = {}

    @property
    def samples_stage_one(self) -> bool:
        """Whether training needs stage 1: A*-PO always (`GRPOTrainer`: only to select prompts by pass rate)."""
        return True

    def value_rules(self) -> tuple[float, bool]:
        """(beta1, filter_all_incorrect) of the V* rows: the method's own (GRPO has neither; see `GRPOTrainer`)."""
        return self.args.beta1, self.args.filter_all_incorrect

    def _selected(self, record: dict[str, Any]) -> bool:
        """Whether training keeps the prompt of a V* row: not dropped by `filter_all_incorrect`, and its reference
        pass rate inside `pass_rate_band` (when set)."""
        band = self.args.pass_rate_band
        if record["filtered"]:
            return False
        if band is None:
            return True
        if not record.get("rewards"):
            raise ValueError(f"pass_rate_band needs each prompt's reference samples, but prompt "
                             f"{record['prompt_id']!r} has a V* given by the dataset (its `v_star` column) and none: "
                             "drop the v_star column so stage 1 samples it, or set pass_rate_band to None.")
        return in_pass_rate_band(record["num_correct"], len(record["rewards"]), band)

    def select_by_pass_rate(self, dataset: Dataset, split: str = "train") -> Dataset:
        """The rows of `dataset` training keeps (`_selected`), their V* estimated first where missing; the columns
        left as they are."""
        table, _ = self._values_for(dataset, split)
        by_id = {row["prompt_id"]: row for row in table.to_list()}
        return dataset.select([i for i, row in enumerate(dataset.to_list())
                               if self._selected(by_id[prompt_id_for(row)])])

    def value_fingerprint(self) -> str:
        """What the stage-1 samples depend on (not beta1: V* is recomputed from the stored rewards)."""
        a = self.args
        key = {"model": str(self.model_id), "rewards": self.reward_names, "weights": self.reward_weights.tolist(),
               "seed": self.values_seed,
               "n": a.num_value_samples, "temperature": a.temperature, "top_p": a.top_p, "top_k": a.sampling_top_k,
               "max_prompt_length": a.max_prompt_length, "max_completion_length": self.max_completion_length}
        if loading := loading_key(lambda name: getattr(a, name, None)):
            key["loading"] = loading
        return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def _values_cache_path(self, split: str) -> Path | None:
        if not self.args.save_values or not self.args.output_dir:
            return None
        rank = f".rank{self.accelerator.process_index}" if self.accelerator.num_processes > 1 else ""
        return Path(self.args.output_dir) / f"optimal_values-{split}-{self.value_fingerprint()}{rank}.jsonl"

    def set_optimal_values(self, records: Dataset | Sequence[dict[str, Any]], split: str = "train") -> None:
        """Give stage 1 rows it already has (e.g. from a database), with their rewards and completions: those
        prompts are not sampled again, and V* is recomputed from the rewards with this run's beta1."""
        rows = records.to_list() if isinstance(records, Dataset) else list(records)
        self._known_values.setdefault(split, {}).update({row["prompt_id"]: row for row in rows})

    def _stored_values(self, split: str) -> dict[str, dict[str, Any]]:
        """V* rows already known from `set_optimal_values`, `values_path` or this run's cache files, by prompt id."""
        found: dict[str, dict[str, Any]] = dict(self._known_values.get(split, {}))
        if self.args.values_path:
            for row in load_optimal_values(self.args.values_path).to_list():
                found[row["prompt_id"]] = row
        cache = self._values_cache_path(split)
        if cache is not None:
            for path in sorted(cache.parent.glob(f"optimal_values-{split}-{self.value_fingerprint()}*.jsonl")):
                for row in read_jsonl(path):
                    found[row["prompt_id"]] = row
        return found

    @frozen_gc
    def estimate_optimal_values(self, dataset: Dataset | None = None, split: str = "train") -> Dataset:
        """Stage 1: the V* table (see `a2po.values.VALUE_COLUMNS`) for `dataset` (default: the train set).

        Rows with a `v_star` value, or already in `values_path` or this run's saved table, are not sampled again.
        Under several processes each samples its shard and every process gets the whole table.
        """
        args = self.args
        beta1, filter_all_incorrect = self.value_rules()
        if dataset is None:
            dataset = self.train_dataset if split == "train" else self.eval_sets().get(split)
        if dataset is None:
            raise ValueError(f"No dataset for split '{split}': pass train_dataset (or eval_dataset) to A2POTrainer.")
        if "prompt" not in dataset.column_names:
            raise ValueError(f"The {split} dataset has no 'prompt' column (it has {dataset.column_names}); rename "
                             "the column holding the prompts to 'prompt'.")
        rows = dataset.to_list()
        ids = [prompt_id_for(row) for row in rows]
        stored = self._stored_values(split)
        # Every rank must see the same stored rows before any rank appends new ones, or the shards would differ.
        self.accelerator.wait_for_everyone()
        records: dict[str, dict[str, Any]] = {}
        pending = []
        for pid, row in zip(ids, rows):
            if row.get("v_star") is not None:
                records[pid] = known_value_record(pid, row["prompt"], self._render_prompt(row["prompt"]),
                                                  row["v_star"], filter_all_incorrect)
            elif pid in stored:
                given = {"prompt": row["prompt"], "prompt_text": self._render_prompt(row["prompt"]), **stored[pid]}
                records[pid] = rescore(given, beta1, filter_all_incorrect)
            elif pid not in records:
                records[pid] = None  # placeholder keeps duplicate rows from being sampled twice
                pending.append((pid, row))
        # A stop already pending (e.g. the end of training) is not a stop request for this stage.
        stop_before, self.control.should_training_stop = self.control.should_training_stop, False
        self._notify("on_values_begin", split=split, num_prompts=len(rows), num_pending=len(pending))

        counters = self.run_counters
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        mine = pending[rank::world]
        # Similar lengths in a batch waste less padding.
        mine.sort(key=lambda item: len(self._render_prompt(item[1]["prompt"])))
        batch_size = args.stage1_batch_size
        cache_path = self._values_cache_path(split)
        done = len(rows) - len(pending)
        new_records = []
        logged: dict[str, list[float]] = defaultdict(list)  # the reward functions' `log_metric` values
        bar = tqdm(total=len(pending), desc=f"Stage 1: V* ({split})", unit="prompt",
                   disable=not self.is_local_process_zero() or args.disable_tqdm)
        # Every rank runs as many batches as the largest shard (the first) needs, with an empty batch once its own
        # shard is done: each batch ends in collectives (records gathered, the stop agreed) that every rank joins.
        num_batches = -(-len(pending[0::world]) // batch_size)
        with self._reference_policy() as reference:
            for start in range(0, num_batches * batch_size, batch_size):
                batch = mine[start:start + batch_size]
                batch_records = []
                values_stats = self.rollout_stats["values"]
                batch_started, tokens_before, flops_before = (time.perf_counter(), values_stats["tokens"],
                                                              values_stats["flops"])
                if batch:
                    batch_rows = [{**row, "prompt_id": pid} for pid, row in batch]
                    prompt_ids, prompt_mask, texts = self._encode_prompts([row["prompt"] for row in batch_rows])
                    completion_ids = self._sample(reference, prompt_ids, prompt_mask,
                                                  num_samples=args.num_value_samples, phase="values",
                                                  row_keys=self._stream_keys("values", batch_rows,
                                                                             args.num_value_samples))
                    completions, mask = self._decode(completion_ids)
                    n = args.num_value_samples
                    repeated = [row for row in batch_rows for _ in range(n)]
                    with self._reward_metrics_into(logged):
                        rewards = self._score(repeated, completions, completion_token_lists(completion_ids, mask),
                                              trainer_state=self._state_before_training()).total
                    fault_point("values_batch")
                    batch_records = [
                        value_record(pid, row["prompt"], texts[i], rewards[i * n:(i + 1) * n].tolist(),
                                     completions[i * n:(i + 1) * n], beta1, filter_all_incorrect)
                        for i, (pid, row) in enumerate(batch)]
                if cache_path is not None and batch_records:
                    cache_path.parent.mkdir(parents=True, exist_ok=True)
                    with open(cache_path, "a", encoding="utf-8") as f:
                        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in batch_records)
                # The run's clock: this batch's sampling and scoring (the slowest rank's time, every rank's tokens
                # and compute).
                spent = torch.tensor([time.perf_counter() - batch_started, values_stats["tokens"] - tokens_before,
                                      values_stats["flops"] - flops_before], dtype=torch.float64)
                if world > 1:  # the callbacks of every rank (the main one stores them) see every rank's rows
                    batch_records = gather_object(batch_records)
                    gathered = self.accelerator.gather(spent[None].to(self.accelerator.device)).cpu()
                    spent = torch.stack([gathered[:, 0].max(), gathered[:, 1].sum(), gathered[:, 2].sum()])
                counters.add_values(split, float(spent[0]), int(spent[1]), float(spent[2]))
                new_records.extend(batch_records)
                done += len(batch_records)
                bar.update(len(batch_records))
                self._notify("on_values_batch", split=split, records=batch_records, done=done, total=len(rows),
                             seconds=counters.values_seconds[split], completion_tokens=counters.values_tokens[split],
                             batch_seconds=float(spent[0]), batch_tokens=int(spent[1]),
                             flops=counters.values_flops[split], batch_flops=float(spent[2]))
                self._agree_on_control("should_training_stop")
                if self.control.should_training_stop:
                    bar.close()
                    raise StageInterrupted(f"Stage 1 ({split}) stopped after {done} of {len(rows)} prompts; "
                                           "rerun to continue with the prompts not yet done.")
        bar.close()
        self.control.should_training_stop = stop_before
        reward_metrics = self._reward_metric_means(logged)
        for record in new_records:
            records[record["prompt_id"]] = record
        table_rows = [records[pid] for pid in dict.fromkeys(ids)]
        table = Dataset.from_list(table_rows)
        summary = summarize(table_rows, args.num_value_samples)
        if pending:
            # The split's whole cost so far, earlier starts included; a stage 1 that sampled nothing (every row was
            # stored) logs no cost, so it never replaces the figures of the start that paid for them.
            summary["runtime"] = round(counters.values_seconds.get(split, 0.0), 4)
            summary["completion_tokens"] = counters.values_tokens.get(split, 0)
            summary["flops"] = counters.values_flops.get(split, 0.0)
        self.value_tables[split] = table
        self._notify("on_values_end", split=split, values=table, summary=summary)
        # The reward functions' `log_metric` values, averaged over what this start sampled; a built-in name wins.
        self.log({f"values/{split}/{k}": float(v) for k, v in {**reward_metrics, **summary}.items()})
        return table

    def _values_for(self, dataset: Dataset, split: str) -> tuple[Dataset, str]:
        """`dataset`'s V* table and its name: `split`'s own table when it holds every prompt of `dataset` (or when
        `dataset` is the trainer's own set of that name), else a table of its own named after `split` and its prompt
        ids, so evaluating another dataset never reads, or replaces, the V* of the trainer's own."""
        ids = {prompt_id_for(row) for row in dataset.to_list()}
        table = self.value_tables.get(split)
        own = self.train_dataset if split == "train" else self.eval_sets().get(split)
        if table is not None and ids <= set(table["prompt_id"]):
            return table, split
        if dataset is own or (own is None and table is None):
            return self.estimate_optimal_values(dataset, split), split
        name = f"{split}-{hashlib.sha1(json.dumps(sorted(ids)).encode()).hexdigest()[:8]}"
        table = self.value_tables.get(name)
        return (table if table is not None else self.estimate_optimal_values(dataset, name)), name

    def _with_values(self, dataset: Dataset, split: str, select: bool) -> tuple[Dataset, Dataset]:
        """`dataset` with the `prompt_id` and `v_star` of its V* table (estimated on first use), and the table;
        `select`: only the rows training keeps (`_selected`)."""
        table, _ = self._values_for(dataset, split)
        by_id = {row["prompt_id"]: row for row in table.to_list()}
        keep, v_stars, pids = [], [], []
        for i, row in enumerate(dataset.to_list()):
            record = by_id[prompt_id_for(row)]
            if select and not self._selected(record):
                continue
            keep.append(i)
            v_stars.append(record["v_star"])
            pids.append(record["prompt_id"])
        out = dataset.select(keep)
        if self.args.remove_unused_columns:
            out = out.select_columns(["prompt"])
        out = out.remove_columns([c for c in ("v_star", "prompt_id") if c in out.column_names])
        return out.add_column("prompt_id", pids).add_column("v_star", v_stars), table


class A2POTrainer(ValueEstimation):
    """Trainer for A*-PO (optimal advantage regression), arXiv 2505.20686.

    Stage 1, before training: for every prompt, sample `num_value_samples` completions from the reference policy,
    score them with `reward_funcs`, and estimate V*(x) = beta1 * log(mean_i exp(r_i / beta1)); prompts no sample
    solved are dropped (`filter_all_incorrect`). Stage 2: one completion per prompt from the current policy; the loss
    is (beta2 * log(pi(y|x) / pi_ref(y|x)) - (r(x, y) - V*(x)))^2, averaged over the batch.

    Args:
        model: a model, a hub id or local path, or "SmolLM2-135M-Instruct" (the offline default, `a2po.models`).
        reward_funcs: one function or a list, called as TRL 1.16 calls them (`a2po.rewards.call_rewards`): by
            keyword `prompts`, `completions`, `completion_ids`, every other dataset column, `trainer_state` (the
            `transformers.TrainerState`: stage 1 sees the state before training, global_step 0; stage 2 and
            evaluation the current one, for curriculum rewards), `log_extra` and `log_metric`; `async` ones run
            concurrently. Each returns one float per completion. Their weighted sum is r, assumed in {0, 1}. As in
            TRL, a function may return None for a completion it does not apply to (multi-task data, one checker per
            task): the sum skips it. A completion that every function skips is an error naming the functions and its
            task (A*-PO has no number to put in V* or r - V*), as is a function that returns None or the wrong
            number of values.
        args: an `A2POConfig`.
        train_dataset: prompts in a "prompt" column (text, or conversational message lists). A `v_star` column
            skips stage 1 for its non-null rows; a `prompt_id` column names rows (else a hash of the row is used).
        eval_dataset: a Dataset or a dict of Datasets; `evaluate()` reports greedy accuracy on it.
        processing_class: the tokenizer (loaded from `model` when omitted).
        callbacks: `TrainerCallback`s; `a2po.A2POCallback`s also receive the stage-1 and sample events.
        optimizers: (optimizer, scheduler), as in `Trainer`.
        peft_config: a `peft` config (e.g. `LoraConfig`): only adapters train and the reference policy is the same
            weights with adapters disabled, so no second copy of the model is held.
    """

    _tag_names = ["a2po"]
    _eval_extra_metrics = ("loss",)
    _completion_columns = ("v_star", "implicit_reward")  # `advantage` is r - V*, the regression's target
    _non_binary_note = "A*-PO assumes binary rewards; V* and the filter treat only r = 1 as correct."
    # No fallback for a completion no reward function scored: a 0 would bias V* and the filter, and leaving it out
    # would still leave a stage-2 sample without a regression target.
    _unscored_error = "A*-PO needs a number for every completion (V* in stage 1, r - V* in stage 2)."

    def __init__(self, model: PreTrainedModel | str, reward_funcs: RewardFunc | list[RewardFunc],
                 args: A2POConfig | None = None, train_dataset: Dataset | None = None,
                 eval_dataset: Dataset | dict[str, Dataset] | None = None,
                 processing_class: PreTrainedTokenizerBase | None = None, callbacks=None,
                 optimizers=(None, None), peft_config=None):
        if args is None:
            model_id = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = A2POConfig(output_dir=f"{Path(model_id).name}-A2PO")
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, callbacks=callbacks,
                         optimizers=optimizers, peft_config=peft_config)

    @frozen_gc
    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None,
              **kwargs):
        """Stage 1 (unless every prompt already has V*), then stage 2 through `Trainer.train`.

        After stage 1 `self.train_dataset` holds the kept prompts (with their `prompt_id` and `v_star` columns) and
        keeps them after training, as TRL's trainer does: `len(trainer.train_dataset)` is the number of prompts stage 2
        trained on in both. A second call (or a resume) finds them all in the V* table and trains on the same rows.
        """
        if self.train_dataset is None:
            raise ValueError("A2POTrainer.train() needs a train_dataset with a 'prompt' column.")
        trained_on, _ = self._with_values(self.train_dataset, "train", select=True)
        if len(trained_on) == 0 and self.args.pass_rate_band is not None:
            raise ValueError(f"No training prompt has a reference pass rate in pass_rate_band "
                             f"{list(self.args.pass_rate_band)}: widen the band, or set it to None.")
        if len(trained_on) == 0:
            raise ValueError("Every training prompt was filtered out: no reference sample was correct. Use easier "
                             "prompts, more num_value_samples, a higher temperature, or filter_all_incorrect=False.")
        self.train_dataset = trained_on
        return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial,
                             ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)

    # ----------------------------------------------------------------------------------------------------------
    # Stage 2: on-policy regression

    def _regression(self, model, rows, prompt_ids, prompt_mask, completion_ids, mask, rewards, phase="train"):
        inputs = (prompt_ids, prompt_mask, completion_ids, mask)
        # Reference first: its temporaries are freed before the policy's autograd graph exists.
        with torch.no_grad(), self._reference_policy() as reference:
            ref_logps = self._token_logprobs(reference, *inputs, phase=phase, grad=False).sum(-1)
        policy_logps = self._token_logprobs(model, *inputs, phase=phase, grad=phase == "train").sum(-1)
        v_star = torch.tensor([row["v_star"] for row in rows], device=policy_logps.device)
        return a2po_loss(policy_logps, ref_logps, rewards.to(policy_logps.device, policy_logps.dtype),
                         v_star.to(policy_logps.dtype), self.args.beta2)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        rows = inputs
        rollout = self._rollout_and_score(model, rows)
        fault_point("train_step")
        loss, stats = self._regression(model, rows, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                       rollout.completion_mask, rollout.rewards)
        self._record_rollout(rollout)
        m = self._metrics
        m["v_star"].append(torch.tensor([row["v_star"] for row in rows], dtype=torch.float64).mean().item())
        m["advantage"].append(stats["advantage"].mean().item())
        m["implicit_reward"].append(stats["implicit_reward"].mean().item())
        m["log_ratio"].append(stats["log_ratio"].mean().item())
        m["kl"].append(stats["log_ratio"].mean().item())  # the same estimate under the name both methods log
        step = self.state.global_step + 1
        self._notify_samples([
            {"step": step, "split": "train", "prompt_id": row["prompt_id"], "sample_index": 0,
             "prompt_text": rollout.prompt_texts[i], "question": prompt_question(row["prompt"]),
             "completion": rollout.completions[i], "reward": float(rollout.rewards[i]), "v_star": float(row["v_star"]),
             "advantage": float(stats["advantage"][i]), "implicit_reward": float(stats["implicit_reward"][i]),
             "completion_length": int(rollout.lengths[i]), "extra": rollout.extra(i)} for i, row in enumerate(rows)],
            rollout)
        return (loss, {}) if return_outputs else loss

    # ----------------------------------------------------------------------------------------------------------
    # Evaluation: greedy accuracy (`BaseTrainer.evaluate`), plus the regression loss against V*

    def _eval_rows(self, dataset: Dataset, split: str) -> tuple[Dataset, Dataset]:
        """The eval rows with their V* (estimated from the reference policy on first use), and their V* table."""
        return self._with_values(dataset, split, select=False)

    def _policy_is_reference(self) -> bool:
        """Whether the policy still equals the reference: before the first optimizer step, the reference being a copy
        of the model given (or, with LoRA, that model with its fresh, zero-effect adapters off)."""
        return self.state.global_step == 0

    def _eval_batch(self, policy, batch, prompt_ids, prompt_mask):
        """Each prompt's greedy answer (accuracy) and the regression loss of one sampled completion against its V*.
        Both come from one decode: the prompts are prefilled once, and a CPU decode step reads the weights once for
        both rows. Before the first update the policy is the reference, so the loss is (r - V*)^2 with no forward
        pass."""
        keys = [key for sampled in self._stream_keys("eval", batch) for key in (("greedy", *sampled), sampled)]
        both = self._sample(policy, prompt_ids, prompt_mask, num_samples=2, phase="eval", row_keys=keys,
                            greedy_samples=1)
        completion_ids = both[1::2]
        completions, mask = self._decode(completion_ids)
        rewards = self._score(batch, completions, completion_token_lists(completion_ids, mask)).total
        if self._policy_is_reference():
            # log pi/pi_ref = 0 for every completion: the loss needs no forward pass.
            zeros = torch.zeros(len(batch), dtype=torch.float64)
            v_star = torch.tensor([row["v_star"] for row in batch], dtype=torch.float64)
            _, stats = a2po_loss(zeros, zeros, rewards.double(), v_star, self.args.beta2)
        else:
            _, stats = self._regression(self.model, batch, prompt_ids, prompt_mask, completion_ids, mask, rewards,
                                        phase="eval")
        # Per-row squared errors, so the mean over all rows is exact whatever the batching.
        return both[0::2], {"loss": ((stats["implicit_reward"] - stats["advantage"]) ** 2).tolist()}

    def _eval_sample_fields(self, row: dict[str, Any], reward: float) -> dict[str, Any]:
        return {"v_star": float(row["v_star"]), "advantage": reward - float(row["v_star"]), "implicit_reward": None}

    def _eval_summary(self, prefix: str, rows: list[dict[str, Any]], table: Dataset) -> dict[str, float]:
        """Mean V* of the eval prompts, and the reference policy's pass@1 / pass@N on them."""
        out = {f"{prefix}_v_star": sum(row["v_star"] for row in rows) / max(len(rows), 1)}
        summary = summarize(table.to_list(), self.args.num_value_samples)
        if "pass_at_n" in summary:
            out[f"{prefix}_ref_pass_at_1"] = summary["pass_at_1"]
            out[f"{prefix}_ref_pass_at_n"] = summary["pass_at_n"]
        return out
