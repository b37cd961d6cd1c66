"""`A2POTrainer`: A*-PO on top of `a2po.base_trainer.BaseTrainer` (itself a `transformers.Trainer`). The math is in
`a2po.core`; stage 1 is `a2po.stage_one.StageOne`, which `GRPOTrainer` also holds (to select prompts by pass rate);
the set-up, prompts, rewards, sampling, callbacks, evaluation loop and logging shared with `GRPOTrainer` are in
`a2po.base_trainer`.

Read top to bottom: set-up (stage 1 with A*-PO's rules), training (stage 1, then stage 2: `compute_loss`),
evaluation (greedy accuracy plus the regression loss).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from a2po._faults import fault_point
from a2po.answers import prompt_question
from a2po.base_trainer import BaseTrainer, RewardFunc
from a2po.config import A2POConfig
from a2po.core import a2po_loss
from a2po.device import frozen_gc
from a2po.rollout import completion_token_lists
from a2po.stage_one import StageOne
from a2po.values import summarize

__all__ = ["A2POTrainer", "RewardFunc"]


class A2POTrainer(BaseTrainer):
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

    _method = "a2po"
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
        self.stage_one = StageOne(self, beta1=args.beta1, filter_all_incorrect=args.filter_all_incorrect)

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
        self.train_dataset = self.stage_one.training_prompts(self.train_dataset, with_values=True)
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
        return self.stage_one.with_values(dataset, split, select=False)

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
