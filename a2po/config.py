"""`A2POConfig` and `GRPOConfig`: each method's fields on top of `transformers.TrainingArguments`.

Same argument names and defaults as TRL's (the experimental `A2POConfig`, and `GRPOConfig` of TRL 1.16 for what we
offer), plus a few of our own (marked "ours"). What both share (the model, the prompts, generation, rewards and
checkpoints) is `_BaseConfig`, checked once for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments

STAGE1_SEQUENCES = 256  # default stage-1 batch width in sequences (prompts x N)
GRPO_LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo")
SCALE_REWARDS = ("group", "batch", "none")
# What `generate()` falls back to when neither the config nor the model's generation config gives a length:
# transformers' model-agnostic default of 20 new tokens (`GenerationConfig().max_length` past the prompt).
DEFAULT_MAX_NEW_TOKENS = 20


def _bf16_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def resolve_max_completion_length(max_completion_length: int | None, generation_config=None) -> int:
    """`max_completion_length`, or for None what `generate()` (and so TRL) would use: the model's generation config's
    `max_new_tokens`, else transformers' default of 20 new tokens."""
    if max_completion_length is not None:
        return max_completion_length
    return getattr(generation_config, "max_new_tokens", None) or DEFAULT_MAX_NEW_TOKENS


@dataclass
class _BaseConfig(TrainingArguments):
    """The fields both methods share, with TRL's overrides of `TrainingArguments` defaults; see the subclasses."""

    # Overrides of TrainingArguments defaults, as in TRL.
    logging_steps: float = field(default=10, metadata={"help": "Log every X update steps."})
    gradient_checkpointing: bool = field(default=True, metadata={"help": "Trade compute for activation memory."})
    bf16: bool | None = field(
        default=None, metadata={"help": "bf16 mixed precision; None turns it on where the GPU supports it."})

    model_init_kwargs: dict | None = field(default=None, metadata={"help": "from_pretrained kwargs for a str model."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow custom code from the Hub."})
    remove_unused_columns: bool = field(default=False, metadata={"help": "Keep only the 'prompt' column."})
    max_prompt_length: int | None = field(default=512, metadata={"help": "Longer prompts are left-truncated."})
    max_completion_length: int | None = field(
        default=256, metadata={"help": "Maximum completion length (None: the model's generation config's)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass, in (0, 1]."})
    top_k: int | None = field(default=None, metadata={"help": "Top-k filtering; None disables it."})
    reward_weights: list[float] | None = field(default=None, metadata={"help": "One weight per reward function."})
    save_every_seconds: float | None = field(
        default=None, metadata={"help": "Also checkpoint after this many seconds of training since the last save."})

    _VALID_DICT_FIELDS = TrainingArguments._VALID_DICT_FIELDS + ["model_init_kwargs"]

    def _problems(self) -> list[str]:
        """What is wrong with the fields of this class (the subclasses add their own)."""
        problems = []
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1] (got {self.top_p})")
        if not self.temperature > 0:
            problems.append(f"temperature must be > 0 (got {self.temperature})")
        if self.max_completion_length is not None and self.max_completion_length < 1:
            problems.append(f"max_completion_length must be >= 1 (got {self.max_completion_length})")
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            problems.append(f"max_prompt_length must be >= 1 or None (got {self.max_prompt_length})")
        if self.save_every_seconds is not None and not self.save_every_seconds >= 0:
            problems.append(f"save_every_seconds must be >= 0 (0 or None: off; got {self.save_every_seconds})")
        if self.reward_weights is not None and any(not isinstance(w, (int, float)) for w in self.reward_weights):
            problems.append(f"reward_weights must be numbers (got {self.reward_weights})")
        return problems

    def __post_init__(self) -> None:
        if self.bf16 is None:
            self.bf16 = not self.fp16 and not self.use_cpu and _bf16_available()
        problems = self._problems()
        if problems:
            raise ValueError(f"Invalid {type(self).__name__}: " + "; ".join(problems) + ".")
        # transformers >= 5.2x renamed the field to `activation_checkpointing` and warns on the old name; ours keeps
        # the documented name (and its default True), so hand it over without the warning.
        if getattr(self, "activation_checkpointing", False) is None:
            self.activation_checkpointing = self.gradient_checkpointing
        super().__post_init__()

    @property
    def sampling_top_k(self) -> int | None:
        """`top_k` for the sampler: None where it is disabled (None or TRL's 0)."""
        return self.top_k or None


@dataclass
class A2POConfig(_BaseConfig):
    r"""Configuration of [`A2POTrainer`].

    Stage 1 (offline value estimation) samples `num_value_samples` completions per prompt from the reference policy
    and estimates V*(x) = beta1 * log(mean_i exp(r_i / beta1)). Stage 2 (on-policy regression) samples one completion
    per prompt from the current policy and regresses beta2 * log(pi(y|x) / pi_ref(y|x)) onto r(x, y) - V*(x).

    Model:
        model_init_kwargs: keyword arguments for `from_pretrained` when the trainer's `model` is a string.
        trust_remote_code: allow models and tokenizers that ship custom code.
    Data:
        remove_unused_columns: keep only the "prompt" column (reward functions then see no other column).
        per_device_train_batch_size: prompts per device per micro-batch (one completion each), so an optimizer step
            sees `prompts_per_step` = per_device_train_batch_size * gradient_accumulation_steps * processes prompts.
    Generation (both stages):
        max_prompt_length: prompts longer than this keep their last tokens (cut from the left).
        max_completion_length: most new tokens per completion; None: the model's generation config's
            `max_new_tokens`, else 20 (what `generate()`, and so TRL, falls back to).
        temperature, top_p, top_k: sampling settings.
    Stage 1:
        num_value_samples: N, reference samples per prompt.
        beta1: KL temperature of the V* estimate.
        filter_all_incorrect: drop prompts none of whose N samples scored 1.
        value_batch_size (ours): prompts per stage-1 batch (each yields N sequences); default: enough prompts for
            256 sequences (at least `per_device_train_batch_size`), since a decode step costs little more for a
            wider batch. Raise it on a large GPU, lower it if stage 1 runs out of memory.
        values_path (ours): a V* table saved by `save_optimal_values` (or by an earlier run in `output_dir`) to reuse.
        save_values (ours): save the V* table to `<output_dir>/optimal_values.jsonl` as it is estimated, so a rerun
            or an interrupted run reuses it instead of sampling again.
    Checkpoints:
        save_every_seconds (ours): also save a checkpoint whenever this many seconds of training passed since the
            last one (on top of `save_strategy`/`save_steps`), so a killed run loses at most that much work.
    Stage 2:
        beta2: KL temperature of the regression target.
        reward_weights: one weight per reward function (default 1.0 each).
    """

    num_value_samples: int = field(default=8, metadata={"help": "Reference samples per prompt for V*."})
    beta1: float = field(default=0.5, metadata={"help": "KL temperature of the V* estimate (stage 1)."})
    filter_all_incorrect: bool = field(default=True, metadata={"help": "Drop prompts no reference sample solved."})
    beta2: float = field(default=1e-3, metadata={"help": "KL temperature of the regression target (stage 2)."})

    value_batch_size: int | None = field(
        default=None, metadata={"help": "Prompts per stage-1 batch (default: 256 sequences' worth)."})
    values_path: str | None = field(default=None, metadata={"help": "A saved V* table to reuse (jsonl/parquet)."})
    save_values: bool = field(default=True, metadata={"help": "Save the V* table in output_dir as it is estimated."})

    def _problems(self) -> list[str]:
        problems = []
        if not self.beta1 > 0:
            problems.append(f"beta1 must be > 0 (got {self.beta1}); the paper uses 0.5")
        if not self.beta2 > 0:
            problems.append(f"beta2 must be > 0 (got {self.beta2}); the paper uses 1e-3")
        if self.num_value_samples < 1:
            problems.append(f"num_value_samples must be >= 1 (got {self.num_value_samples}); 8 is typical")
        if self.top_k is not None and self.top_k < 1:
            problems.append(f"top_k must be >= 1 or None (got {self.top_k})")
        if self.value_batch_size is not None and self.value_batch_size < 1:
            problems.append(f"value_batch_size must be >= 1 or None (got {self.value_batch_size})")
        return problems + super()._problems()

    @property
    def stage1_batch_size(self) -> int:
        """Prompts per stage-1 batch: `value_batch_size`, else enough prompts for 256 sampled sequences."""
        if self.value_batch_size is not None:
            return self.value_batch_size
        return max(self.per_device_train_batch_size, STAGE1_SEQUENCES // self.num_value_samples)

    @property
    def prompts_per_step(self) -> int:
        """Prompts one optimizer step trains on, over every process: one completion each."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.world_size


@dataclass
class GRPOConfig(_BaseConfig):
    r"""Configuration of [`GRPOTrainer`]: TRL 1.16's `GRPOConfig` names and defaults for what is offered here.

    Parameters:
        > Parameters that control the model and reference model

        model_init_kwargs: keyword arguments for `from_pretrained` when the trainer's `model` is a string.
        trust_remote_code: allow models and tokenizers that ship custom code.

        > Parameters that control the data preprocessing

        remove_unused_columns: keep only the "prompt" column (reward functions then see no other column).
        num_generations (defaults to 8): G, completions sampled per prompt. As in TRL, batch sizes count
            completions: a micro-batch holds `per_device_train_batch_size` completions, and an optimizer step sees
            `prompts_per_step` = per_device_train_batch_size * gradient_accumulation_steps * processes / G prompts
            (each process samples whole groups, so per_device_train_batch_size * gradient_accumulation_steps must be
            a multiple of G).
        shuffle_dataset (defaults to True): visit the prompts in a seeded random order, a new one each epoch.
        max_prompt_length (ours, defaults to None): prompts longer than this keep their last tokens (TRL 1.16 has no
            prompt truncation; None keeps every prompt whole, as there).
        max_completion_length (defaults to 512): most new tokens per completion; None: the model's generation
            config's `max_new_tokens`, else 20 (what `generate()`, and so TRL, falls back to).

        > Parameters that control generation

        temperature (defaults to 1.0): sampling temperature; the log-probabilities of the loss are those of the
            tempered policy, softmax(logits / temperature), as in TRL.
        top_p (defaults to 1.0), top_k (defaults to 0: disabled): nucleus and top-k filtering.

        > Parameters that control the training

        beta (defaults to 0.0): coefficient of the per-token KL penalty to the reference policy; 0 loads no reference
            model and runs no reference forward pass.
        num_iterations (defaults to 1): mu, optimizer steps on each generation (its completions, advantages and
            log-probabilities at sampling time reused; the ratio to those is clipped).
        epsilon (defaults to 0.2), epsilon_high (defaults to None: epsilon): the ratio pi / pi_old is clipped to
            [1 - epsilon, 1 + epsilon_high] (DAPO recommends epsilon_high = 0.28).
        reward_weights: one weight per reward function (default 1.0 each); their weighted sum is the reward.
        scale_rewards (defaults to "group"): how advantages r - mean(group) are scaled: "group" (or True) divides by
            the group's standard deviation, "batch" by the standard deviation over the whole generation batch,
            "none" (or False) not at all (Dr. GRPO).
        loss_type (defaults to "dapo"): how per-token losses are aggregated (formulas in `a2po.core.grpo_loss`):
            "grpo" (per sequence over its length, then over sequences), "dr_grpo" (over batch size times
            max_completion_length), "dapo" (over the tokens of the optimizer step's whole batch), "bnpo" (over the
            tokens of the micro-batch).
        mask_truncated_completions (defaults to False): leave completions that never ended (no EOS) out of the loss.
        use_bias_correction_kl (defaults to True): multiply the KL term by the ratio pi / pi_old, as TRL does.

        > Parameters that control checkpoints

        save_every_seconds (ours): also save a checkpoint whenever this many seconds of training passed since the
            last one, so a killed run loses at most that much work. A checkpoint taken between the iterations of a
            generation holds that generation (`generation_buffer.pt`), so the resumed run trains on the same
            completions.

    These defaults differ from `TrainingArguments`' as in TRL: logging_steps 10, gradient_checkpointing True, bf16
    where the GPU supports it, learning_rate 1e-6.
    """

    learning_rate: float = field(default=1e-6, metadata={"help": "The initial learning rate for AdamW."})
    num_generations: int = field(default=8, metadata={"help": "G, completions sampled per prompt."})
    shuffle_dataset: bool = field(default=True, metadata={"help": "Visit the prompts in a seeded random order."})
    max_prompt_length: int | None = field(default=None, metadata={"help": "Longer prompts are left-truncated."})
    max_completion_length: int | None = field(
        default=512, metadata={"help": "Maximum completion length (None: the model's generation config's)."})
    top_k: int | None = field(default=0, metadata={"help": "Top-k filtering; 0 disables it."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient; 0 loads no reference model."})
    num_iterations: int = field(default=1, metadata={"help": "Optimizer steps per generation (mu)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clipping bound: ratio >= 1 - epsilon."})
    epsilon_high: float | None = field(
        default=None, metadata={"help": "Upper clipping bound: ratio <= 1 + epsilon_high (None: epsilon)."})
    scale_rewards: str = field(
        default="group", metadata={"help": "Advantage scaling: 'group' (True), 'batch' or 'none' (False)."})
    loss_type: str = field(default="dapo", metadata={"help": f"Loss aggregation: one of {', '.join(GRPO_LOSS_TYPES)}."})
    mask_truncated_completions: bool = field(
        default=False, metadata={"help": "Leave completions without an EOS out of the loss."})
    use_bias_correction_kl: bool = field(
        default=True, metadata={"help": "Multiply the KL term by the importance ratio (TRL's default)."})

    def __post_init__(self) -> None:
        # As in TRL, booleans name strategies (and the command line gives them as strings).
        self.scale_rewards = {True: "group", False: "none", "true": "group", "false": "none"}.get(
            self.scale_rewards.lower() if isinstance(self.scale_rewards, str) else self.scale_rewards,
            self.scale_rewards)
        super().__post_init__()

    def _problems(self) -> list[str]:
        problems = []
        if self.num_generations < 2:
            problems.append(f"num_generations must be >= 2 (got {self.num_generations}): advantages compare the "
                            "completions of one prompt")
        elif (self.per_device_train_batch_size * self.gradient_accumulation_steps) % self.num_generations:
            problems.append(f"per_device_train_batch_size * gradient_accumulation_steps "
                            f"({self.per_device_train_batch_size} * {self.gradient_accumulation_steps}) counts "
                            f"completions and must be a multiple of num_generations ({self.num_generations})")
        if self.loss_type not in GRPO_LOSS_TYPES:
            problems.append(f"loss_type must be one of {GRPO_LOSS_TYPES} (got {self.loss_type!r})")
        if self.scale_rewards not in SCALE_REWARDS:
            problems.append(f"scale_rewards must be one of {SCALE_REWARDS}, True or False (got {self.scale_rewards!r})")
        if not self.beta >= 0:
            problems.append(f"beta must be >= 0 (got {self.beta}); 0 turns the KL term off")
        if self.num_iterations < 1:
            problems.append(f"num_iterations must be >= 1 (got {self.num_iterations})")
        if not self.epsilon >= 0 or (self.epsilon_high is not None and not self.epsilon_high >= 0):
            problems.append(f"epsilon and epsilon_high must be >= 0 (got {self.epsilon}, {self.epsilon_high})")
        if self.top_k is not None and self.top_k < 0:
            problems.append(f"top_k must be >= 1, or 0 to disable it (got {self.top_k})")
        if self.auto_find_batch_size:
            problems.append("auto_find_batch_size is not supported: a batch must hold whole groups of completions")
        return problems + super()._problems()

    @property
    def prompts_per_step(self) -> int:
        """Prompts one optimizer step trains on, over every process: `num_generations` completions each."""
        return (self.per_device_train_batch_size * self.gradient_accumulation_steps * self.world_size
                // self.num_generations)
