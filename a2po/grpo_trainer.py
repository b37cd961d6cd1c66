"""`GRPOTrainer`: GRPO on the same engine as `A2POTrainer` (`a2po.base_trainer.BaseTrainer`). The math is
`a2po.core.group_advantages` and `a2po.core.grpo_loss`; batches, loss types and metrics follow TRL 1.16's
`GRPOTrainer`.

Read top to bottom: set-up, batches (prompts in generation-sized chunks), generation (G completions per prompt,
advantages, the log-probs the loss compares with), the loss, checkpoints (a generation reused over several steps
is saved with the checkpoint).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from torch.utils.data import Sampler
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from a2po._faults import fault_point
from a2po.answers import prompt_question
from a2po.base_trainer import BaseTrainer, RewardFunc
from a2po.config import GRPOConfig
from a2po.core import (
    LOSS_TYPES,
    GRPOLossSettings,
    decoupled_advantages,
    group_advantages,
    grpo_loss,
    high_entropy_mask,
    statistic_mean,
    vllm_importance_weights,
)
from a2po.rollout import Rollout, eval_mode
from a2po.settings import config_default, uses_vllm
from a2po.stage_one import StageOne
from a2po.values import with_prompt_ids

BUFFER_FILE = "generation_buffer"


class PromptChunkSampler(Sampler[int]):
    """Prompt indices for GRPO's training dataloader: the prompts in chunks of one generation (every process's
    prompts of one optimizer step), each chunk repeated once per micro-batch and iteration that trains on it.

    TRL's `RepeatSampler` without its per-completion repeats (the engine samples a prompt's G completions itself,
    its prompt prefilled once). A last chunk that would be short is dropped, as there. The order is a seeded
    permutation per epoch (`set_epoch`), so a resumed run visits the prompts in the order a fresh one does.
    """

    def __init__(self, num_prompts: int, chunk_size: int, repeats: int, shuffle: bool = True, seed: int = 0):
        self.num_prompts, self.chunk_size, self.repeats = num_prompts, chunk_size, repeats
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle:
            order = torch.randperm(self.num_prompts, generator=torch.Generator().manual_seed(self.seed + self.epoch))
            order = order.tolist()
        else:
            order = list(range(self.num_prompts))
        for start in range(0, self.num_prompts - self.chunk_size + 1, self.chunk_size):
            chunk = order[start:start + self.chunk_size]
            for _ in range(self.repeats):
                yield from chunk

    def __len__(self) -> int:
        return self.num_prompts // self.chunk_size * self.chunk_size * self.repeats


class GRPOTrainer(BaseTrainer):
    """Trainer for GRPO (group relative policy optimization), arXiv 2402.03300, as TRL 1.16 implements it.

    Each optimizer step samples `num_generations` (G) completions for each of its prompts from the current policy,
    scores them, and gives each completion its advantage relative to its group: A = (r - mean) / std. The loss is
    the clipped policy-gradient surrogate -min(ratio * A, clip(ratio) * A) per token, plus beta times a per-token
    KL to the reference, aggregated as `loss_type` says (`a2po.core.LOSS_TYPES`: TRL's loss types, CISPO, SAPO,
    LUSPO and VESPO among them, each its policy term, aggregation and statistics; `a2po.core.grpo_loss` also holds
    GSPO's sequence-level ratio, two-sided clipping, the off-policy mask, high-entropy tokens; GDPO's advantages are
    `a2po.core.decoupled_advantages`). With `num_iterations` > 1 a
    generation trains that many optimizer steps, the ratio taken to the policy that sampled it. With `use_vllm`
    each completion's policy term is also weighted by pi_old / pi_vllm, TRL's correction for vLLM's own sampling
    distribution (`vllm_importance_sampling_*` in `GRPOConfig`).

    As in TRL, `per_device_train_batch_size` counts completions: an optimizer step trains on
    `args.prompts_per_step` = per_device_train_batch_size * gradient_accumulation_steps * processes / G prompts.
    The step's completions are sampled in one decode per process and split into its micro-batches in order.

    Args:
        model, reward_funcs, train_dataset, eval_dataset, processing_class, callbacks, optimizers, peft_config: as
            for `A2POTrainer` (a `v_star` column means nothing here). With `peft_config`, the reference (beta > 0)
            is the model with its adapters disabled. Reward functions get `trainer_state` (the current state) besides
            `prompts`, `completions` and the columns, and may return None for a completion they do not apply to: the
            weighted sum skips it. A completion that every function skips gets reward NaN and a warning, as in TRL:
            it is left out of its group's mean and std and of the reward and accuracy metrics, and its advantage is 0.
        args: a `GRPOConfig`.
    """

    _method = "grpo"
    _tag_names = ["grpo"]

    def __init__(self, model: PreTrainedModel | str, reward_funcs: RewardFunc | list[RewardFunc],
                 args: GRPOConfig | None = None, train_dataset: Dataset | None = None,
                 eval_dataset: Dataset | dict[str, Dataset] | None = None,
                 processing_class: PreTrainedTokenizerBase | None = None, callbacks=None,
                 optimizers=(None, None), peft_config=None):
        if args is None:
            model_id = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = GRPOConfig(output_dir=f"{Path(model_id).name}-GRPO")
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, callbacks=callbacks,
                         optimizers=optimizers, peft_config=peft_config)
        # Stage 1 only for the pass rates (`pass_rate_band`): no prompt is filtered, and its rows' V* (which GRPO
        # never reads) is A*-PO's at its default beta1, as the shared V* set shows it.
        self.stage_one = StageOne(self, beta1=config_default("beta1", "a2po"), filter_all_incorrect=False)
        self._buffer: list[dict[str, torch.Tensor]] | None = None  # the current generation, one dict per micro-batch
        self._step: int | None = None  # micro-batches trained, counted from the run's step 0 (set as training starts)

    def _needs_reference(self, args: GRPOConfig) -> bool:
        return args.beta != 0.0

    @contextmanager
    def _reference_policy(self) -> Iterator[torch.nn.Module]:
        """The reference policy; with beta = 0 none is loaded, and stage 1 samples the policy itself, which is the
        reference before the first optimizer step (the only time stage 1 samples)."""
        if self.ref_model is None and not hasattr(self.accelerator.unwrap_model(self.model), "disable_adapter"):
            if self.state.global_step > 0:
                raise RuntimeError("GRPO with beta = 0 has no reference policy once training has started.")
            yield self.accelerator.unwrap_model(self.model)
            return
        with super()._reference_policy() as reference:
            yield reference

    @property
    def _corrects_sampling(self) -> bool:
        """Whether the loss is weighted by pi_old / pi_vllm (`vllm_importance_sampling_correction`, as in TRL: only
        where vLLM samples)."""
        return uses_vllm(self.args) and self.args.vllm_importance_sampling_correction

    @property
    def _keeps_sampling_logps(self) -> bool:
        """Whether vLLM's log-probs of the sampled tokens are kept: for its correction, and for the off-policy mask,
        which measures the divergence from the distribution that sampled (as in TRL)."""
        return uses_vllm(self.args) and (self.args.vllm_importance_sampling_correction
                                       or self.args.off_policy_mask_threshold is not None)

    # ----------------------------------------------------------------------------------------------------------
    # Batches: one dataloader batch is one process's prompts of one optimizer step, repeated for each micro-batch
    # and iteration (the Trainer fetches a batch per micro-batch; all but the first of a generation are ignored).

    @property
    def _prompts_per_generation(self) -> int:
        """Prompts this process samples for one generation: its completions of an optimizer step / G."""
        args = self.args
        return args.per_device_train_batch_size * args.gradient_accumulation_steps // args.num_generations

    def get_train_dataloader(self):
        if self.train_dataset is None:
            raise ValueError("GRPOTrainer.train() needs a train_dataset with a 'prompt' column.")
        return self._get_dataloader(dataset=self.train_dataset, description="Training",
                                    batch_size=self._prompts_per_generation, sampler_fn=self._get_train_sampler,
                                    is_training=True)

    def _get_train_sampler(self, dataset: Dataset | None = None) -> Sampler:
        args = self.args
        dataset = self.train_dataset if dataset is None else dataset
        return PromptChunkSampler(len(dataset), self._prompts_per_generation * self.accelerator.num_processes,
                                  repeats=args.gradient_accumulation_steps * args.num_iterations,
                                  shuffle=args.shuffle_dataset, seed=args.seed)

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None,
              **kwargs):
        if self.train_dataset is None:
            raise ValueError("GRPOTrainer.train() needs a train_dataset with a 'prompt' column.")
        self.train_dataset = with_prompt_ids(self.train_dataset)  # the stream keys name prompts by id
        if self.samples_stage_one:
            # Stage 1 before the first step, on the run's clock: A*-PO's, on the same V* set.
            self.train_dataset = self.stage_one.training_prompts(self.train_dataset)
        if len(self.train_dataset) < self.args.prompts_per_step:
            raise ValueError(f"An optimizer step trains on {self.args.prompts_per_step} prompts (batch size x "
                             f"accumulation x processes / num_generations) but the train set has "
                             f"{len(self.train_dataset)}: use more prompts or a smaller batch.")
        self._step, self._buffer = None, None  # a resume restores the buffer from its checkpoint
        return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial,
                             ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)

    def _micro_batch(self, model: torch.nn.Module, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """This micro-step's completions: a new generation every gradient_accumulation_steps * num_iterations
        micro-steps, else the next slice of the current one."""
        accumulation = self.args.gradient_accumulation_steps
        if self._step is None:  # the first micro-step of this `train()` call; a resumed run starts mid-way
            self._step = self.state.global_step * accumulation
        if self._step % (accumulation * self.args.num_iterations) == 0 or self._buffer is None:
            if self._step % (accumulation * self.args.num_iterations):
                warnings.warn("Resumed between the iterations of a generation without its saved completions: "
                              "sampling new ones, so this run departs from the uninterrupted one.", stacklevel=2)
            self._buffer = self._generate(model, rows)
        batch = self._buffer[self._step % accumulation]
        self._step += 1
        return batch

    # ----------------------------------------------------------------------------------------------------------
    # Generation

    def _generate(self, model: torch.nn.Module, rows: list[dict[str, Any]]) -> list[dict[str, torch.Tensor]]:
        """Sample G completions for each prompt of the optimizer step (one decode: each prompt is prefilled once and
        its keys and values shared by its samples), score them, and prepare the step's micro-batches."""
        rollout = self._rollout_and_score(model, rows, num_samples=self.args.num_generations,
                                          sampling_logprobs=self._keeps_sampling_logps)
        return self._prepare_generation(model, rollout)

    def _prepare_generation(self, model: torch.nn.Module, rollout: Rollout) -> list[dict[str, torch.Tensor]]:
        """The micro-batches of one generation: its completions, their group advantages and the per-token log-probs
        the loss compares with (pi_old when a generation is reused or vLLM sampled it, pi_ref when beta > 0), computed
        now, before the policy changes, and with vLLM's log-probs (`rollout.sampling_logps`) the importance weights
        pi_old / pi_vllm, as TRL."""
        args, device = self.args, self.accelerator.device
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        group = rollout.num_samples
        rewards = rollout.rewards.to(device)
        # Over every process's completions, as in TRL: "batch" scaling takes the std of the whole generation.
        if args.multi_objective_aggregation == "normalize_then_sum":
            per_func = rollout.rewards_per_func.to(device)
            everyone = self.accelerator.gather(per_func) if world > 1 else per_func
            advantages, std = decoupled_advantages(everyone, self.reward_weights, group)
        else:
            everyone = self.accelerator.gather(rewards) if world > 1 else rewards
            advantages, std = group_advantages(everyone, group, args.scale_rewards)
        advantages = advantages[rank * len(rewards):(rank + 1) * len(rewards)].float()
        mask = rollout.completion_mask
        loss_mask = mask * ~rollout.clipped[:, None] if args.mask_truncated_completions else mask
        tokens = loss_mask.sum()
        num_items = (self.accelerator.gather(tokens[None]).sum() if world > 1 else tokens).clamp(min=1) / world
        prompt_ids = rollout.prompt_ids.repeat_interleave(group, dim=0)
        prompt_mask = rollout.prompt_mask.repeat_interleave(group, dim=0)

        batches = []
        size = args.per_device_train_batch_size
        policy = self.accelerator.unwrap_model(model)
        sampling_logps = rollout.sampling_logps
        # vLLM's log-probs come with the rollout only where asked (`_keeps_sampling_logps`)
        correcting = sampling_logps is not None and args.vllm_importance_sampling_correction
        for start in range(0, len(rewards), size):
            part = slice(start, start + size)
            batch = {"prompt_ids": prompt_ids[part], "prompt_mask": prompt_mask[part],
                     "completion_ids": rollout.completion_ids[part], "completion_mask": mask[part],
                     "loss_mask": loss_mask[part], "advantages": advantages[part], "num_items": num_items}
            inputs = (batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"])
            with torch.no_grad():
                if args.num_iterations > 1 or correcting:
                    with eval_mode(policy):  # no dropout or activation checkpointing in a pass without gradients
                        batch["old_logps"] = self._token_logprobs(policy, *inputs, phase="train", grad=False,
                                                                  temperature=args.temperature)
                if sampling_logps is not None:
                    batch["sampling_logps"] = sampling_logps[part].to(device)
                if correcting:
                    batch["sampling_weights"] = vllm_importance_weights(
                        batch["old_logps"], batch["sampling_logps"], batch["loss_mask"],
                        args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_min,
                        args.vllm_importance_sampling_clip_max)
                if args.beta != 0.0:
                    with self._reference_policy() as reference, eval_mode(reference):
                        batch["ref_logps"] = self._token_logprobs(reference, *inputs, phase="train", grad=False,
                                                                  temperature=args.temperature)
            batches.append(batch)

        self._record_rollout(rollout)
        if correcting:
            self._record_sampling_correction(batches)
        self._metrics["frac_reward_zero_std"].append(
            torch.isclose(std, torch.zeros_like(std)).float().mean().item())
        step = self.state.global_step + 1
        self._notify_samples([
            {"step": step, "split": "train", "prompt_id": row["prompt_id"], "sample_index": j,
             "prompt_text": rollout.prompt_texts[i], "question": prompt_question(row["prompt"]),
             "completion": rollout.completions[k], "reward": float(rollout.rewards[k]),
             "advantage": float(advantages[k]), "completion_length": int(rollout.lengths[k]),
             "v_star": None, "implicit_reward": None, "extra": rollout.extra(k)}
            for i, row in enumerate(rollout.rows) for j in range(group) for k in [i * group + j]], rollout)
        return batches

    def _record_sampling_correction(self, batches: list[dict[str, torch.Tensor]]) -> None:
        """TRL's metrics of vLLM's importance-sampling correction, over the generation: |log pi_old - log pi_vllm|
        per token that counts (mean, max), and the weights (min, mean, max; per completion in the sequence modes,
        per token that counts in the token modes)."""
        masks = [batch["loss_mask"].bool() for batch in batches]
        delta = torch.cat([(batch["old_logps"] - batch["sampling_logps"]).abs()[mask]
                           for batch, mask in zip(batches, masks)])
        delta = delta[~delta.isnan()]  # a token vLLM gave no log-prob for tells nothing of the divergence
        per_sequence = self.args.vllm_importance_sampling_mode.startswith("sequence")
        weights = torch.cat([batch["sampling_weights"].flatten() if per_sequence else batch["sampling_weights"][mask]
                             for batch, mask in zip(batches, masks)])
        m = self._metrics
        m["sampling/sampling_logp_difference/mean"].append(delta.mean().item() if len(delta) else 0.0)
        m["sampling/sampling_logp_difference/max"].append(delta.max().item() if len(delta) else 0.0)
        m["sampling/importance_sampling_ratio/min"].append(weights.min().item() if len(weights) else 0.0)
        m["sampling/importance_sampling_ratio/mean"].append(weights.mean().item() if len(weights) else 0.0)
        m["sampling/importance_sampling_ratio/max"].append(weights.max().item() if len(weights) else 0.0)

    # ----------------------------------------------------------------------------------------------------------
    # The loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            raise ValueError("GRPOTrainer.compute_loss does not return outputs.")
        batch = self._micro_batch(model, inputs)
        fault_point("train_step")
        return self._policy_loss(model, batch)

    def _policy_loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """`grpo_loss` on one micro-batch, as the Trainer takes it (it divides by the number of micro-batches), and
        TRL's metrics of it."""
        args = self.args
        mask = batch["loss_mask"]
        inputs = (batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"])
        entropies = token_mask = None
        if args.top_entropy_quantile < 1.0:  # the entropies cost a pass over the logits: only where they are used
            logps, entropies = self._token_logprobs(model, *inputs, phase="train", grad=True,
                                                    temperature=args.temperature, with_entropy=True)
            token_mask = high_entropy_mask(entropies, mask, args.top_entropy_quantile,
                                           population=self._entropy_population(entropies, mask))
        else:
            logps = self._token_logprobs(model, *inputs, phase="train", grad=True, temperature=args.temperature)
        # dapo's normaliser counts the tokens of the whole optimizer step: per micro-batch, it is that over their
        # number, so that the Trainer's division leaves each token of the step one share.
        num_items = batch["num_items"] / self.current_gradient_accumulation_steps
        # Read from the config at each call: a setting changed on `args` acts from the next micro-batch on.
        settings = GRPOLossSettings.from_config(args, self.max_completion_length)
        loss, stats = grpo_loss(logps, batch.get("old_logps"), batch.get("ref_logps"), batch["advantages"], mask,
                                settings, num_items=num_items, sampling_weights=batch.get("sampling_weights"),
                                sampling_logps=batch.get("sampling_logps"), token_mask=token_mask)
        self._record_loss_stats(stats, mask.float(), entropies)
        return loss

    def _entropy_population(self, entropies: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The entropies of every process's counted tokens of this micro-batch, whose quantile TRL thresholds."""
        local = entropies[mask.bool()].float()
        if self.accelerator.num_processes == 1:
            return local
        padding = -1e9  # entropies are >= 0, so the padding cannot be mistaken for one
        gathered = self.accelerator.gather(self.accelerator.pad_across_processes(local, dim=0, pad_index=padding))
        return gathered[gathered != padding]

    def _record_loss_stats(self, stats: dict[str, torch.Tensor], mask: torch.Tensor,
                           entropies: torch.Tensor | None) -> None:
        """TRL's metrics of the loss on this micro-batch: the KL, the entropy, and the loss type's own
        (`LossType.statistics`)."""
        m = self._metrics
        if "kl" in stats:
            m["kl"].append(statistic_mean(stats["kl"], mask))
        if entropies is not None:
            m["entropy"].append(statistic_mean(entropies, mask))
        for name, value in LOSS_TYPES[self.args.loss_type].statistics(stats, mask).items():
            m[name].append(value)

    # ----------------------------------------------------------------------------------------------------------
    # Checkpoints: a checkpoint between the iterations of a generation holds that generation

    def _buffer_path(self, folder: str | os.PathLike) -> Path:
        world = self.accelerator.num_processes
        suffix = f".rank{self.accelerator.process_index}" if world > 1 else ""
        return Path(folder) / f"{BUFFER_FILE}{suffix}.pt"

    def _save_checkpoint_extras(self, output_dir: str) -> None:
        # Its completions came from a policy the checkpoint no longer holds, so they cannot be sampled again.
        if self._buffer is not None and self.state.global_step % self.args.num_iterations:
            os.makedirs(output_dir, exist_ok=True)
            torch.save([{k: v.cpu() for k, v in batch.items()} for batch in self._buffer],
                       self._buffer_path(output_dir))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        path = self._buffer_path(resume_from_checkpoint)
        if path.is_file():
            device = self.accelerator.device
            self._buffer = [{k: v.to(device) for k, v in batch.items()}
                            for batch in torch.load(path, map_location="cpu", weights_only=True)]
