"""`A2POConfig`: the A*-PO fields on top of `transformers.TrainingArguments`.

Same argument names and defaults as TRL's experimental `A2POConfig`, plus a few of our own (marked "ours").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments

STAGE1_SEQUENCES = 256  # default stage-1 batch width in sequences (prompts x N)


def _bf16_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


@dataclass
class A2POConfig(TrainingArguments):
    r"""Configuration of [`A2POTrainer`].

    Stage 1 (offline value estimation) samples `num_value_samples` completions per prompt from the reference policy
    and estimates V*(x) = beta1 * log(mean_i exp(r_i / beta1)). Stage 2 (on-policy regression) samples one completion
    per prompt from the current policy and regresses beta2 * log(pi(y|x) / pi_ref(y|x)) onto r(x, y) - V*(x).

    Model:
        model_init_kwargs: keyword arguments for `from_pretrained` when the trainer's `model` is a string.
        trust_remote_code: allow models and tokenizers that ship custom code.
    Data:
        remove_unused_columns: keep only the "prompt" column (reward functions then see no other column).
    Generation (both stages):
        max_prompt_length: prompts longer than this keep their last tokens (cut from the left).
        max_completion_length: most new tokens per completion.
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

    # Overrides of TrainingArguments defaults, as in TRL.
    logging_steps: float = field(default=10, metadata={"help": "Log every X update steps."})
    gradient_checkpointing: bool = field(default=True, metadata={"help": "Trade compute for activation memory."})
    bf16: bool | None = field(
        default=None, metadata={"help": "bf16 mixed precision; None turns it on where the GPU supports it."})

    model_init_kwargs: dict | None = field(default=None, metadata={"help": "from_pretrained kwargs for a str model."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow custom code from the Hub."})
    remove_unused_columns: bool = field(default=False, metadata={"help": "Keep only the 'prompt' column."})
    max_prompt_length: int | None = field(default=512, metadata={"help": "Longer prompts are left-truncated."})
    max_completion_length: int | None = field(default=256, metadata={"help": "Maximum completion length."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (stages 1 and 2)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass, in (0, 1]."})
    top_k: int | None = field(default=None, metadata={"help": "Top-k filtering; None disables it."})
    num_value_samples: int = field(default=8, metadata={"help": "Reference samples per prompt for V*."})
    beta1: float = field(default=0.5, metadata={"help": "KL temperature of the V* estimate (stage 1)."})
    filter_all_incorrect: bool = field(default=True, metadata={"help": "Drop prompts no reference sample solved."})
    beta2: float = field(default=1e-3, metadata={"help": "KL temperature of the regression target (stage 2)."})
    reward_weights: list[float] | None = field(default=None, metadata={"help": "One weight per reward function."})

    value_batch_size: int | None = field(
        default=None, metadata={"help": "Prompts per stage-1 batch (default: 256 sequences' worth)."})
    values_path: str | None = field(default=None, metadata={"help": "A saved V* table to reuse (jsonl/parquet)."})
    save_values: bool = field(default=True, metadata={"help": "Save the V* table in output_dir as it is estimated."})
    save_every_seconds: float | None = field(
        default=None, metadata={"help": "Also checkpoint after this many seconds of training since the last save."})

    _VALID_DICT_FIELDS = TrainingArguments._VALID_DICT_FIELDS + ["model_init_kwargs"]

    def __post_init__(self) -> None:
        if self.bf16 is None:
            self.bf16 = not self.fp16 and not self.use_cpu and _bf16_available()
        problems = []
        if not self.beta1 > 0:
            problems.append(f"beta1 must be > 0 (got {self.beta1}); the paper uses 0.5")
        if not self.beta2 > 0:
            problems.append(f"beta2 must be > 0 (got {self.beta2}); the paper uses 1e-3")
        if self.num_value_samples < 1:
            problems.append(f"num_value_samples must be >= 1 (got {self.num_value_samples}); 8 is typical")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k is not None and self.top_k < 1:
            problems.append(f"top_k must be >= 1 or None (got {self.top_k})")
        if not self.temperature > 0:
            problems.append(f"temperature must be > 0 (got {self.temperature})")
        if self.max_completion_length is not None and self.max_completion_length < 1:
            problems.append(f"max_completion_length must be >= 1 (got {self.max_completion_length})")
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            problems.append(f"max_prompt_length must be >= 1 or None (got {self.max_prompt_length})")
        if self.save_every_seconds is not None and not self.save_every_seconds >= 0:
            problems.append(f"save_every_seconds must be >= 0 (0 or None: off; got {self.save_every_seconds})")
        if self.value_batch_size is not None and self.value_batch_size < 1:
            problems.append(f"value_batch_size must be >= 1 or None (got {self.value_batch_size})")
        if self.reward_weights is not None and any(not isinstance(w, (int, float)) for w in self.reward_weights):
            problems.append(f"reward_weights must be numbers (got {self.reward_weights})")
        if problems:
            raise ValueError("Invalid A2POConfig: " + "; ".join(problems) + ".")
        # transformers >= 5.2x renamed the field to `activation_checkpointing` and warns on the old name; ours keeps
        # the documented name (and its default True), so hand it over without the warning.
        if getattr(self, "activation_checkpointing", False) is None:
            self.activation_checkpointing = self.gradient_checkpointing
        super().__post_init__()

    @property
    def stage1_batch_size(self) -> int:
        """Prompts per stage-1 batch: `value_batch_size`, else enough prompts for 256 sampled sequences."""
        if self.value_batch_size is not None:
            return self.value_batch_size
        return max(self.per_device_train_batch_size, STAGE1_SEQUENCES // self.num_value_samples)
