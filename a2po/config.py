"""`A2POConfig`: the A*-PO fields on top of `transformers.TrainingArguments`.

Same argument names and defaults as TRL's experimental `A2POConfig`, plus a few of our own (marked "ours").
"""

from __future__ import annotations

import functools
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import TrainingArguments

STAGE1_SEQUENCES = 256  # default stage-1 batch width in sequences (prompts x N)
MAX_SEED = 2**32 - 1  # transformers' `set_seed` seeds numpy, which takes 0 .. 2**32 - 1


class ConfigError(ValueError):
    """Invalid `A2POConfig` values: `problems` maps each field to a sentence that names it and says what is valid."""

    def __init__(self, problems: dict[str, str]) -> None:
        self.problems = dict(problems)
        super().__init__("Invalid A2POConfig: " + "; ".join(self.problems.values()) + ".")


def whole_number(value: Any) -> int | None:
    """`value` as an int when it is one (an int, a float such as 8.0, or text such as "8"), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    number = real_number(value)
    return int(number) if number is not None and number == int(number) else None


def real_number(value: Any) -> float | None:
    """`value` as a finite float when it is a number (or text of one: YAML reads 1e-5 as text), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


@functools.cache
def _plain_fields() -> dict[str, tuple[type, bool]]:
    """Fields of a plain type (bool, int, float or str, maybe None): name -> (type, whether None is allowed)."""
    out = {}
    for name, hint in typing.get_type_hints(A2POConfig).items():
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
            else (hint,)
        plain = [a for a in args if a is not type(None)]
        if len(plain) == 1 and plain[0] in (bool, int, float, str):
            out[name] = (plain[0], type(None) in args)
    return out


def coerce_field(name: str, value: Any) -> tuple[Any, str | None]:
    """`value` converted to field `name`'s type (8.0 -> 8 for an int, "1e-5" -> 1e-05 for a float), and the problem
    when it cannot be (a sentence naming the field), else None. Fields of other types pass unchanged."""
    kind = _plain_fields().get(name)
    if kind is None:
        return value, None
    expected, optional = kind
    words = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}[expected]
    problem = f"{name} must be {words}{' or null' if optional else ''} (got {value!r:.40})"
    if value is None:
        return value, None if optional else problem
    if expected is bool or expected is str:
        return value, None if isinstance(value, expected) else problem
    if expected is int:
        number = whole_number(value)
        return (value, problem) if number is None else (number, None)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return value, None
    number = real_number(value)
    return (value, problem) if number is None else (number, None)


def _range_problems(config: A2POConfig, skip: set[str]) -> dict[str, str]:
    """What `config` holds out of range, by field (fields in `skip`, already of a wrong type, are not looked at)."""
    rules = [
        ("beta1", lambda v: v > 0, "beta1 must be > 0 (got {}); the paper uses 0.5"),
        ("beta2", lambda v: v > 0, "beta2 must be > 0 (got {}); the paper uses 1e-3"),
        ("num_value_samples", lambda v: v >= 1, "num_value_samples must be >= 1 (got {}); 8 is typical"),
        ("top_p", lambda v: 0 < v <= 1, "top_p must be in (0, 1] (got {})"),
        ("top_k", lambda v: v is None or v >= 1, "top_k must be >= 1 or None (got {})"),
        ("temperature", lambda v: v > 0, "temperature must be > 0 (got {})"),
        ("max_completion_length", lambda v: v is None or v >= 1, "max_completion_length must be >= 1 (got {})"),
        ("max_prompt_length", lambda v: v is None or v >= 1, "max_prompt_length must be >= 1 or None (got {})"),
        ("save_every_seconds", lambda v: v is None or v >= 0,
         "save_every_seconds must be >= 0 (0 or None: off; got {})"),
        ("value_batch_size", lambda v: v is None or v >= 1, "value_batch_size must be >= 1 or None (got {})"),
        ("learning_rate", lambda v: v > 0, "learning_rate must be > 0 (got {})"),
        ("num_train_epochs", lambda v: v > 0, "num_train_epochs must be > 0 (got {})"),
        ("max_steps", lambda v: v == -1 or v >= 1,
         "max_steps must be -1 (train for num_train_epochs) or >= 1 (got {})"),
        ("per_device_train_batch_size", lambda v: v >= 1, "per_device_train_batch_size must be >= 1 (got {})"),
        ("per_device_eval_batch_size", lambda v: v >= 1, "per_device_eval_batch_size must be >= 1 (got {})"),
        ("gradient_accumulation_steps", lambda v: v >= 1, "gradient_accumulation_steps must be >= 1 (got {})"),
        ("warmup_steps", lambda v: v >= 0, "warmup_steps must be >= 0 (steps, or a fraction < 1 of them; got {})"),
        ("weight_decay", lambda v: v >= 0, "weight_decay must be >= 0 (got {})"),
        ("max_grad_norm", lambda v: v >= 0, "max_grad_norm must be >= 0 (0: no clipping; got {})"),
        ("logging_steps", lambda v: v > 0, "logging_steps must be > 0 (got {})"),
        ("eval_steps", lambda v: v is None or v > 0, "eval_steps must be > 0 or None (got {})"),
        ("save_steps", lambda v: v >= 0, "save_steps must be >= 0 (0: no checkpoints by step count; got {})"),
        ("seed", lambda v: 0 <= v <= MAX_SEED, f"seed must be a whole number from 0 to {MAX_SEED} (got {{}})"),
        ("data_seed", lambda v: v is None or 0 <= v <= MAX_SEED,
         f"data_seed must be a whole number from 0 to {MAX_SEED} or None (got {{}})"),
        ("reward_weights", lambda v: v is None or isinstance(v, (list, tuple)) and all(real_number(w) is not None
                                                                                    for w in v),
         "reward_weights must be numbers (got {})"),
    ]
    return {name: message.format(getattr(config, name)) for name, valid, message in rules
            if name not in skip and not valid(getattr(config, name))}


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
        # Every problem at once, keyed by field: a run spec reports each as `config.<field>` (`a2po.runspec`).
        problems = {}
        for name in _plain_fields():
            value, problem = coerce_field(name, getattr(self, name))
            if problem:
                problems[name] = problem
            else:
                setattr(self, name, value)
        problems.update(_range_problems(self, skip=set(problems)))
        if problems:
            raise ConfigError(problems)
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
