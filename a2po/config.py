"""`A2POConfig` and `GRPOConfig`: each method's fields on top of `transformers.TrainingArguments`, and their checks.

Same argument names and defaults as TRL's (the experimental `A2POConfig`, and `GRPOConfig` of TRL 1.16 for what we
offer), plus a few of our own (marked "ours"). The fields are declared in `a2po.settings` (torch-free, so the studio
reads them without torch); what both methods share is checked once, in `_BaseConfig`.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import types
import typing
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from transformers import TrainingArguments

from a2po.core import LOSS_TYPES, describe_loss_types
from a2po.settings import (
    GRPO_LOSS_TYPES,
    IMPORTANCE_SAMPLING_LEVELS,
    MULTI_OBJECTIVE_AGGREGATIONS,
    SCALE_REWARDS,
    VLLM_IS_MODES,
    VLLM_RULES,
    A2POSettings,
    GRPOSettings,
    Rule,
    SharedSettings,
    vllm_install_problem,
)
from a2po.shown import shown

STAGE1_SEQUENCES = 256  # default stage-1 batch width in sequences (prompts x N)
# What `generate()` falls back to when neither the config nor the model's generation config gives a length:
# transformers' model-agnostic default of 20 new tokens (`GenerationConfig().max_length` past the prompt).
DEFAULT_MAX_NEW_TOKENS = 20
MAX_SEED = 2**32 - 1  # transformers' `set_seed` seeds numpy, which takes 0 .. 2**32 - 1


def in_range(name: str, low: float, high: float, use: str) -> Rule:
    """A rule that `name` (None allowed) lies in [low, high]: the range its math stays finite in, in the float32 the
    losses and the sampler compute in (`use` says where it enters). Checked with the config, so a spec that asks for
    more is refused before any run is stored."""
    return (name, lambda v: v is None or low <= v <= high,
            f"{name} must be from {low:g} to {high:g} (got {{}}): {use}")



class ConfigError(ValueError):
    """Invalid config values: `problems` maps each field to a sentence that names it and says what is valid."""

    def __init__(self, problems: dict[str, str], config_name: str = "A2POConfig") -> None:
        self.problems = dict(problems)
        super().__init__(f"Invalid {config_name}: " + "; ".join(self.problems.values()) + ".")


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
    except (ValueError, OverflowError):  # OverflowError: a whole number past float's range, e.g. 10**400
        return None
    return number if math.isfinite(number) else None


def pass_rate_band_problem(band: Any) -> str | None:
    """Why `band` is not a pass-rate band ([low, high], 0 <= low <= high <= 1), or None."""
    if not isinstance(band, (list, tuple)) or len(band) != 2:
        return "a band is two numbers, [low, high]"
    low, high = (real_number(v) for v in band)
    if low is None or high is None or not 0 <= low <= high <= 1:
        return "its bounds must satisfy 0 <= low <= high <= 1"
    return None


def in_pass_rate_band(num_correct: int, num_samples: int, band: Sequence[float] | None) -> bool:
    """Whether a prompt with `num_correct` of `num_samples` reference samples correct lies in `band` (None: every
    prompt does). The bounds are inclusive, so [0.5, 0.5] keeps exactly the prompts at half."""
    if band is None:
        return True
    pass_rate = num_correct / num_samples
    return float(band[0]) - 1e-9 <= pass_rate <= float(band[1]) + 1e-9  # 0.3 * 10 is not exactly 3


class Quoted:
    """A value as a rule's message quotes it ("{}" or "{!r}"): `shown`, bounded whatever the value."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __str__(self) -> str:
        if isinstance(self.value, str):
            return self.value if len(self.value) <= 40 else self.value[:39] + "…"
        return shown(self.value)

    def __repr__(self) -> str:
        return shown(self.value)


@functools.cache
def _plain_fields(config_class: type) -> dict[str, tuple[type, bool]]:
    """Fields of a plain type (bool, int, float or str, maybe None): name -> (type, whether None is allowed)."""
    out = {}
    for name, hint in typing.get_type_hints(config_class).items():
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
            else (hint,)
        plain = [a for a in args if a is not type(None)]
        if len(plain) == 1 and plain[0] in (bool, int, float, str):
            out[name] = (plain[0], type(None) in args)
    return out


def coerce_field(name: str, value: Any, config_class: type | None = None) -> tuple[Any, str | None]:
    """`value` converted to field `name`'s type in `config_class` (default `A2POConfig`; 8.0 -> 8 for an int, "1e-5"
    -> 1e-05 for a float), and the problem when it cannot be (a sentence naming the field), else None. Fields of
    other types pass unchanged."""
    kind = _plain_fields(config_class or A2POConfig).get(name)
    if kind is None:
        return value, None
    expected, optional = kind
    words = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}[expected]
    problem = f"{name} must be {words}{' or null' if optional else ''} (got {shown(value)})"
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


def _bf16_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def resolve_max_completion_length(max_completion_length: int | None, generation_config=None) -> int:
    """`max_completion_length`, or for None what `generate()` (and so TRL) would use: the model's generation config's
    `max_new_tokens`, else transformers' default of 20 new tokens."""
    if max_completion_length is not None:
        return max_completion_length
    return getattr(generation_config, "max_new_tokens", None) or DEFAULT_MAX_NEW_TOKENS


@dataclass
class _BaseConfig(SharedSettings, TrainingArguments):
    """The fields both methods share (`a2po.settings.SharedSettings`), checked once for both; see the subclasses."""

    _VALID_DICT_FIELDS = TrainingArguments._VALID_DICT_FIELDS + ["model_init_kwargs"]

    # (field, valid, message) for the fields every method shares; the subclasses add theirs (`_rules`).
    RULES: ClassVar[tuple[Rule, ...]] = (
        ("top_p", lambda v: 0 < v <= 1, "top_p must be in (0, 1] (got {})"),
        ("temperature", lambda v: v > 0, "temperature must be > 0 (got {})"),
        in_range("temperature", 1e-3, 1e3, "the sampler divides the logits by it"),
        ("max_completion_length", lambda v: v is None or v >= 1, "max_completion_length must be >= 1 or None (got {})"),
        ("max_prompt_length", lambda v: v is None or v >= 1, "max_prompt_length must be >= 1 or None (got {})"),
        ("save_every_seconds", lambda v: v is None or v >= 0,
         "save_every_seconds must be >= 0 (0 or None: off; got {})"),
        *(rule for unit in ("seconds", "flops") for rule in (
            (f"max_train_{unit}", lambda v: v is None or v >= 0,
             f"max_train_{unit} must be >= 0 (0 or None: no budget; got {{}})"),
            (f"eval_every_{unit}", lambda v: v is None or v >= 0,
             f"eval_every_{unit} must be >= 0 (0 or None: off; got {{}})"))),
        ("num_completions_to_print", lambda v: v is None or v >= 0,
         "num_completions_to_print must be >= 0 or None (None: print them all; got {})"),
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
        *VLLM_RULES,
        ("num_value_samples", lambda v: v >= 1, "num_value_samples must be >= 1 (got {}); 8 is typical"),
        ("value_batch_size", lambda v: v is None or v >= 1, "value_batch_size must be >= 1 or None (got {})"),
        ("values_seed", lambda v: v is None or 0 <= v <= MAX_SEED,
         "values_seed must be None or a seed from 0 to " + str(MAX_SEED) + " (got {})"),
        ("pass_rate_band", lambda v: v is None or pass_rate_band_problem(v) is None,
         "pass_rate_band must be None or [low, high] with 0 <= low <= high <= 1, e.g. [0.125, 0.875] (got {!r})"),
    )

    def _rules(self) -> tuple[Rule, ...]:
        return _BaseConfig.RULES

    def _cross_problems(self) -> dict[str, str]:
        """Problems that involve several fields, by the field to change (checked once each field is valid)."""
        return {}

    def __post_init__(self) -> None:
        if self.bf16 is None:
            self.bf16 = not self.fp16 and not self.use_cpu and _bf16_available()
        # Every problem at once, keyed by field: a run spec reports each as `config.<field>` (`a2po.runspec`).
        problems = {}
        for name in _plain_fields(type(self)):
            value, problem = coerce_field(name, getattr(self, name), type(self))
            if problem:
                problems[name] = problem
            else:
                setattr(self, name, value)
        for name, valid, message in self._rules():  # a field's first broken rule names its problem
            if name not in problems and not valid(getattr(self, name)):
                problems[name] = message.format(Quoted(getattr(self, name)))
        if not problems:
            problems.update(self._cross_problems())
        if not problems and self.log_completions and importlib.util.find_spec("pyarrow") is None:
            problems["log_completions"] = ("log_completions writes parquet files with pyarrow, which is not installed "
                                           "here: pip install pyarrow, or set log_completions=False")
        if not problems and self.use_vllm and (missing := vllm_install_problem()):
            problems["use_vllm"] = missing
        if problems:
            raise ConfigError(problems, type(self).__name__)
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

    @property
    def sampling_top_k(self) -> int | None:
        """`top_k` for the sampler: None where it is disabled (None or TRL's 0)."""
        return self.top_k or None


@dataclass
class A2POConfig(A2POSettings, _BaseConfig):
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
        use_vllm, vllm_*: sample both stages and evaluation with vLLM; see "vLLM" in `GRPOConfig`. A*-PO has no
            importance-sampling correction (GRPOConfig's `vllm_importance_sampling_*`, which this config does not
            take; TRL's A2POTrainer has no vLLM): its loss is a least-squares regression of beta2 * log(pi / pi_ref)
            onto r - V*, whose minimiser, the policy that meets the target on every completion, does not depend on
            the distribution that samples the completions; vLLM's small departure from the policy reweights the
            regression's terms and leaves its target alone. GRPO's policy gradient is an expectation under the
            policy itself, which a sampler that departs from it biases: hence TRL's correction there.
    Stage 1:
        num_value_samples: N, reference samples per prompt.
        beta1: KL temperature of the V* estimate.
        filter_all_incorrect: drop prompts none of whose N samples scored 1. True is TRL's default, kept here for
            API parity; the paper's authors run A*-PO with it off (ZhaolinGao/A-PO, `filter_incorrect: False` in
            their GSM8K and MATH scripts) and compare methods over the same prompts and optimizer steps. It matters:
            on the studio's teaching demo, stage 1 kept 37 of 256 prompts with it on, so A*-PO trained 20 steps
            instead of 128 and ended far below GRPO; with it off A*-PO kept pace with GRPO at equal steps
            (docs/benchmarks.md, "A*-PO against GRPO"). A prompt no reference sample solved has V* = 0, and a
            correct completion of it still gets a positive target.
        value_batch_size (ours): prompts per stage-1 batch (each yields N sequences); default: enough prompts for
            256 sequences (at least `per_device_train_batch_size`), since a decode step costs little more for a
            wider batch. Raise it on a large GPU, lower it if stage 1 runs out of memory.
        values_seed (ours): the seed of stage 1's reference samples; None: `seed`. Runs that differ in their run
            seed but set one `values_seed` share one V* set (a studio sweep does: one stage 1 for all its runs, the
            seeds then vary stage 2's samples, data order and initialisation only).
        values_path (ours): a V* table saved by `save_optimal_values` (or by an earlier run in `output_dir`) to reuse.
        save_values (ours): save the V* table to `<output_dir>/optimal_values-<split>-<fingerprint>.jsonl` as it is
            estimated, so a rerun
            or an interrupted run reuses it instead of sampling again.
        pass_rate_band (ours): [low, high]: train only on the prompts whose reference pass rate p (correct samples
            of num_value_samples) satisfies low <= p <= high, bounds included; None (the default): every prompt
            `filter_all_incorrect` keeps. Prompts at p = 1 give A*-PO only targets r - V* <= 0 and GRPO zero
            advantages; [1/N, 1 - 1/N] keeps the prompts that carry a signal (docs/selection.md).
    Checkpoints:
        save_every_seconds (ours): also save a checkpoint whenever this many seconds of training passed since the
            last one (on top of `save_strategy`/`save_steps`), so a killed run loses at most that much work.
    Time (ours; the run's clock, `a2po.callbacks.RunCounters`: stage-1 sampling and scoring plus training steps,
    continued across resumes, loading and pauses never counted):
        max_train_seconds: stop training once the clock reaches this many seconds (stage 1 of the train split
            included): a budget of training time, e.g. to compare methods at equal time.
        eval_every_seconds: also evaluate whenever the clock passes a multiple of this many seconds.
    Compute (ours; FLOPs counted from the tokens the run processes, `a2po.compute`, the same on every machine, so a
    seeded run under a compute budget stops at the same step and logs the same history wherever it runs):
        max_train_flops: stop training once the run's compute (stage 1 of the train split, or its share of a reused V*
            set, plus training) reaches this many FLOPs: a budget to compare methods at equal compute.
        eval_every_flops: also evaluate whenever the compute passes a multiple of this many FLOPs.
    Stage 2:
        beta2: KL temperature of the regression target.
        reward_weights: one weight per reward function (default 1.0 each).
    Completion tables (TRL GRPOConfig's; `a2po.completions`, docs/completions.md):
        log_completions: at each logging step, write the latest step's completions to
            `<output_dir>/completions/completions_{step:05d}.parquet` (TRL's columns, then `v_star` and
            `implicit_reward`; `advantage` is r - V*) and print them.
        num_completions_to_print: how many of them to print (None: all). log_unique_prompts: print one per prompt.
    """

    def _rules(self) -> tuple[Rule, ...]:
        return (*super()._rules(),
                ("beta1", lambda v: v > 0, "beta1 must be > 0 (got {}); the paper uses 0.5"),
                in_range("beta1", 1e-4, 1e4, "V* divides the rewards by it inside an exponential"),
                in_range("beta2", 0.0, 1e4, "the target multiplies the summed log-ratio by it"),
                ("beta2", lambda v: v > 0, "beta2 must be > 0 (got {}); the paper uses 1e-3"),
                ("top_k", lambda v: v is None or v >= 1, "top_k must be >= 1 or None (got {})"))

    @property
    def prompts_per_step(self) -> int:
        """Prompts one optimizer step trains on, over every process: one completion each."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.world_size


@dataclass
class GRPOConfig(GRPOSettings, _BaseConfig):
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

        pass_rate_band (ours, defaults to None): [low, high]: train only on the prompts whose reference pass rate p
            lies in the band (bounds included). p comes from a stage 1 as A*-PO's (`num_value_samples` completions of
            the model before training per prompt, `value_batch_size`, `values_seed`, `values_path`, `save_values` as
            in `A2POConfig`), sampled only for this, counted on the run's clock, and shared with A*-PO runs of the
            same sampling settings (one V* fingerprint). None: every prompt, no stage 1, as in TRL (docs/selection.md).

        > Parameters that control generation

        temperature (defaults to 1.0): sampling temperature; the log-probabilities of the loss are those of the
            tempered policy, softmax(logits / temperature), as in TRL.
        top_p (defaults to 1.0), top_k (defaults to 0: disabled): nucleus and top-k filtering.

        > Parameters that control vLLM (both methods; `a2po.vllm_engine`)

        use_vllm (defaults to False): sample with a vLLM engine in the training process instead of the native
            decoder (`a2po.rollout`): A*-PO's stage 1 and rollouts, GRPO's groups, and evaluation. The loss's
            log-probabilities still come from the trainer's own forward passes. The policy's weights (LoRA:
            merged) reach the engine before the first sampling after each optimizer step and after a resume.
        vllm_mode (defaults to "colocate"): only "colocate"; TRL's "server" mode is refused.
        vllm_model_impl (defaults to "vllm"): vLLM's own model code, or "transformers" (its transformers backend).
        vllm_enable_sleep_mode (defaults to False): vLLM frees its weights and KV cache between samplings (level 2,
            as TRL), and they are pushed again before the next; CUDA only in vLLM.
        vllm_gpu_memory_utilization (defaults to 0.3): the share of the GPU's memory vLLM takes.
        vllm_max_model_length (defaults to None): vLLM's context window; None: max_prompt_length +
            max_completion_length where both are set, else the model's.
        vllm_tensor_parallel_size (defaults to 1): GPUs vLLM splits the model over; only 1 (one training process,
            the engine in it).
        vllm_importance_sampling_correction (defaults to True): GRPO only, as in TRL. vLLM samples from its own
            kernels' distribution (another attention, its own precision), not exactly the trainer's: weight each
            completion's loss by the importance ratio pi_old / pi_vllm (`a2po.core.vllm_importance_weights`), pi_old
            from the trainer's forward pass at sampling time, pi_vllm from the log-probabilities vLLM returns for the
            tokens it sampled, after temperature and top-k/top-p (vLLM's "processed_logprobs", as TRL asks for).
            The trainer's log-probs are of the whole tempered policy, so with top_k or top_p < 1 the weights also
            correct for the truncation and sit below 1, as in TRL (docs/benchmarks.md). Ignored without use_vllm,
            as in TRL: the native decoder samples with the trainer's own model, kernels and precision.
        vllm_importance_sampling_mode (defaults to "sequence_mask"): "token_truncate", "token_mask",
            "sequence_truncate" or "sequence_mask": a ratio per token or one per completion (the sum of its tokens'
            log-ratios), and outside [clip_min, clip_max] either clamped to the range ("truncate") or set to 0, so
            the token or completion leaves the loss ("mask").
        vllm_importance_sampling_clip_max (defaults to 3.0), vllm_importance_sampling_clip_min (defaults to None):
            the range; a None bound is open. A "*_truncate" mode needs at least one.
        vllm_importance_sampling_cap (deprecated in TRL 1.16): the old name of vllm_importance_sampling_clip_max,
            which it sets, with a FutureWarning, as TRL.
        With the correction on, TRL's metrics are logged: `sampling/sampling_logp_difference/mean` and `/max` (|log
        pi_old - log pi_vllm| per token) and `sampling/importance_sampling_ratio/min`, `/mean` and `/max`.

        > Parameters that control the training

        beta (defaults to 0.0): coefficient of the per-token KL penalty to the reference policy; 0 loads no reference
            model and runs no reference forward pass.
        num_iterations (defaults to 1): mu, optimizer steps on each generation (its completions, advantages and
            log-probabilities at sampling time reused; the ratio to those is clipped).
        epsilon (defaults to 0.2), epsilon_high (defaults to None: epsilon): the ratio pi / pi_old is clipped to
            [1 - epsilon, 1 + epsilon_high] (DAPO recommends epsilon_high = 0.28). With loss_type "cispo",
            epsilon_high is the cap on the ratio itself (ScaleRL recommends 5.0; None caps it at epsilon, as in TRL).
            With num_iterations 1 (and no vLLM) the ratio is 1, so the clipping acts only off-policy.
        delta (defaults to None): INTELLECT-2's two-sided clipping, the clipped loss types only: the unclipped ratio
            is also capped at delta (> 1; recommended above 1 + epsilon_high), bounding the loss of a completion
            with A < 0 whose ratio grew. Acts only off-policy (num_iterations > 1 or vLLM).
        sapo_temperature_neg (defaults to 1.05), sapo_temperature_pos (defaults to 1.0): SAPO's gate temperatures
            for tokens with A <= 0 and A > 0 (loss_type "sapo").
        vespo_k_pos (defaults to 2.0), vespo_lambda_pos (defaults to 3.0), vespo_k_neg (defaults to 3.0),
            vespo_lambda_neg (defaults to 2.0): VESPO's Gamma weight phi(W) = exp(lambda + k log W - lambda W) of a
            completion's ratio W, for A >= 0 and A < 0 (loss_type "vespo"; `a2po.core.vespo_gamma_weights`).
        importance_sampling_level (defaults to "token"): "token" (one ratio per token) or "sequence" (GSPO: one per
            completion, the exponentiated mean of its tokens' log-ratios). Acts only off-policy (num_iterations > 1
            or vLLM): with one iteration the ratio is 1 either way. GSPO's setup is loss_type "grpo"; "luspo" expects
            "sequence", "vespo" "token" (warnings, as TRL).
        reward_weights: one weight per reward function (default 1.0 each); their weighted sum is the reward.
        multi_objective_aggregation (defaults to "sum_then_normalize"): "sum_then_normalize" sums the weighted
            rewards, then forms advantages as `scale_rewards` says; "normalize_then_sum" (GDPO) normalizes each
            reward function's rewards within the group first, sums them with the weights, and normalizes the sum over
            the batch (`a2po.core.decoupled_advantages`; scale_rewards does not act then).
        scale_rewards (defaults to "group"): how advantages r - mean(group) are scaled: "group" (or True) divides by
            the group's standard deviation, "batch" by the standard deviation over the whole generation batch,
            "none" (or False) not at all (Dr. GRPO).
        loss_type (defaults to "dapo"): the policy term, its aggregation over tokens and the metrics it logs: one
            entry of `a2po.core.LOSS_TYPES` each, whose formulas are there:
{loss_types}
        mask_truncated_completions (defaults to False): leave completions that never ended (no EOS) out of the loss.
        top_entropy_quantile (defaults to 1.0): rho of "Beyond the 80/20 rule": only the top-rho quantile of each
            micro-batch's tokens by entropy of the policy's next-token distribution stays in the policy term (0.0:
            only the highest, 1.0: all; the paper recommends 0.2). Below 1.0 the loss's forward pass also computes
            the entropies, and `entropy` is logged; at 1.0 nothing is computed.
        off_policy_mask_threshold (defaults to None: off): DeepSeek-V3.2's off-policy sequence mask: a completion
            with A < 0 whose mean log pi_sampling - log pi over its tokens exceeds this (e.g. 0.5) leaves the policy
            term. pi_sampling is vLLM's where it sampled with its log-probs, else the sampling policy's, so without
            vLLM it acts only with num_iterations > 1.
        use_bias_correction_kl (defaults to True): multiply the KL term by the ratio pi / pi_old, as TRL does.

        > Parameters that control the logging

        log_completions (defaults to False): at each logging step, write the latest generation's completions to
            `<output_dir>/completions/completions_{step:05d}.parquet` with TRL's columns (`a2po.completions`,
            docs/completions.md), and print them (a `rich` table where rich is installed).
        num_completions_to_print (defaults to None: all): how many of them to print, picked at random.
        log_unique_prompts (defaults to False): print one completion per prompt (TRL applies it to the table it
            sends to wandb and trackio; its parquet file, as here, keeps every completion).

        > Parameters that control checkpoints

        save_every_seconds (ours): also save a checkpoint whenever this many seconds of training passed since the
            last one, so a killed run loses at most that much work. A checkpoint taken between the iterations of a
            generation holds that generation (`generation_buffer.pt`), so the resumed run trains on the same
            completions.
        max_train_seconds, eval_every_seconds (ours): a budget of training time, and evaluations on a grid of it,
            on the run's clock (`a2po.callbacks.RunCounters`), as in `A2POConfig`.
        max_train_flops, eval_every_flops (ours): a budget of compute in FLOPs, and evaluations on a grid of it, as in
            `A2POConfig` (G completions sampled, trained and, with beta > 0, scored by the reference per prompt).

    These defaults differ from `TrainingArguments`' as in TRL: logging_steps 10, gradient_checkpointing True, bf16
    where the GPU supports it, learning_rate 1e-6.
    """

    def __post_init__(self) -> None:
        # As in TRL, booleans name strategies (and the command line gives them as strings).
        self.scale_rewards = {True: "group", False: "none", "true": "group", "false": "none"}.get(
            self.scale_rewards.lower() if isinstance(self.scale_rewards, str) else self.scale_rewards,
            self.scale_rewards)
        if self.vllm_importance_sampling_cap is not None:
            warnings.warn("vllm_importance_sampling_cap is deprecated (as in TRL 1.16): use "
                          "vllm_importance_sampling_clip_max, which it sets.", FutureWarning, stacklevel=2)
            self.vllm_importance_sampling_clip_max = self.vllm_importance_sampling_cap
        super().__post_init__()
        self._warn_about_combinations()

    def _rules(self) -> tuple[Rule, ...]:
        return (*super()._rules(),
                ("num_generations", lambda v: v >= 2,
                 "num_generations must be >= 2 (got {}): advantages compare the completions of one prompt"),
                ("loss_type", lambda v: v in GRPO_LOSS_TYPES,
                 f"loss_type must be one of {GRPO_LOSS_TYPES} (got {{!r}})"),
                ("scale_rewards", lambda v: v in SCALE_REWARDS,
                 f"scale_rewards must be one of {SCALE_REWARDS}, True or False (got {{!r}})"),
                ("beta", lambda v: v >= 0, "beta must be >= 0 (got {}); 0 turns the KL term off"),
                ("num_iterations", lambda v: v >= 1, "num_iterations must be >= 1 (got {})"),
                ("epsilon", lambda v: v >= 0, "epsilon must be >= 0 (got {})"),
                ("epsilon_high", lambda v: v is None or v >= 0, "epsilon_high must be >= 0 or None (got {})"),
                ("delta", lambda v: v is None or v > 1,
                 "delta must be > 1 or None (got {}): it caps the ratio pi / pi_old from above"),
                ("sapo_temperature_neg", lambda v: v > 0, "sapo_temperature_neg must be > 0 (got {})"),
                ("sapo_temperature_pos", lambda v: v > 0, "sapo_temperature_pos must be > 0 (got {})"),
                ("vespo_k_pos", lambda v: v >= 0, "vespo_k_pos must be >= 0 (got {})"),
                ("vespo_lambda_pos", lambda v: v > 0, "vespo_lambda_pos must be > 0 (got {})"),
                ("vespo_k_neg", lambda v: v >= 0, "vespo_k_neg must be >= 0 (got {})"),
                ("vespo_lambda_neg", lambda v: v > 0, "vespo_lambda_neg must be > 0 (got {})"),
                ("importance_sampling_level", lambda v: v in IMPORTANCE_SAMPLING_LEVELS,
                 f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS} (got {{!r}})"),
                ("multi_objective_aggregation", lambda v: v in MULTI_OBJECTIVE_AGGREGATIONS,
                 f"multi_objective_aggregation must be one of {MULTI_OBJECTIVE_AGGREGATIONS} (got {{!r}})"),
                ("top_entropy_quantile", lambda v: 0.0 <= v <= 1.0,
                 "top_entropy_quantile must be between 0.0 and 1.0 (got {}); 1.0 keeps every token"),
                ("off_policy_mask_threshold", lambda v: v is None or v >= 0,
                 "off_policy_mask_threshold must be >= 0 or None (got {}); DeepSeek-V3.2 uses e.g. 0.5"),
                ("top_k", lambda v: v is None or v >= 0, "top_k must be >= 1, or 0 to disable it (got {})"),
                ("auto_find_batch_size", lambda v: not v,
                 "auto_find_batch_size is not supported (got {}): a batch must hold whole groups of completions"),
                ("vllm_importance_sampling_mode", lambda v: v in VLLM_IS_MODES,
                 f"vllm_importance_sampling_mode must be one of {VLLM_IS_MODES} (got {{!r}})"),
                ("vllm_importance_sampling_clip_max", lambda v: v is None or v > 0,
                 "vllm_importance_sampling_clip_max must be > 0 or None (got {})"),
                ("vllm_importance_sampling_clip_min", lambda v: v is None or v >= 0,
                 "vllm_importance_sampling_clip_min must be >= 0 or None (got {})"),
                # The ranges the math stays finite in, after the signs: a field's first broken rule names it.
                *(in_range(name, 0.0, 1e4, "the loss clips the ratio pi / pi_old with it")
                  for name in ("epsilon", "epsilon_high", "delta")),
                in_range("beta", 0.0, 1e4, "the loss multiplies the KL term by it"),
                *(in_range(name, 1e-3, 1e3, "SAPO's gate divides by it")
                  for name in ("sapo_temperature_pos", "sapo_temperature_neg")),
                *(in_range(name, 0.0, 1e3, "VESPO raises the ratio to it") for name in ("vespo_k_pos", "vespo_k_neg")),
                *(in_range(name, 1e-3, 1e3, "VESPO scales the ratio's exponent by it")
                  for name in ("vespo_lambda_pos", "vespo_lambda_neg")),
                in_range("off_policy_mask_threshold", 0.0, 1e4, "the mask compares a mean log-ratio with it"),
                *(in_range(name, 0.0, 1e6, "the importance weights are clamped to it")
                  for name in ("vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max")))

    def _cross_problems(self) -> dict[str, str]:
        problems = {}
        if (self.per_device_train_batch_size * self.gradient_accumulation_steps) % self.num_generations:
            problems["per_device_train_batch_size"] = (
                f"per_device_train_batch_size * gradient_accumulation_steps ({self.per_device_train_batch_size} * "
                f"{self.gradient_accumulation_steps}) counts completions and must be a multiple of num_generations "
                f"({self.num_generations})")
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if low is not None and high is not None and low >= high:
            problems["vllm_importance_sampling_clip_min"] = (
                f"vllm_importance_sampling_clip_min ({low}) must be less than vllm_importance_sampling_clip_max "
                f"({high})")
        elif (self.vllm_importance_sampling_correction and self.vllm_importance_sampling_mode.endswith("truncate")
              and low is None and high is None):
            problems["vllm_importance_sampling_mode"] = (
                f"vllm_importance_sampling_mode {self.vllm_importance_sampling_mode!r} clamps the ratio to "
                "[vllm_importance_sampling_clip_min, vllm_importance_sampling_clip_max]: set at least one of them")
        if (LOSS_TYPES[self.loss_type].takes_sampling_weights and self.use_vllm
                and self.vllm_importance_sampling_correction
                and not self.vllm_importance_sampling_mode.startswith("token")):
            problems["vllm_importance_sampling_mode"] = (
                f"loss_type {self.loss_type!r} takes vLLM's per-token weights into its policy term: "
                f"vllm_importance_sampling_mode must be 'token_truncate' or 'token_mask' (got "
                f"{self.vllm_importance_sampling_mode!r}), as in TRL")
        return problems

    def _warn_about_combinations(self) -> None:
        """The combinations TRL 1.16 warns about: accepted, but not the papers' setups (`LossType.level`)."""
        loss_type = LOSS_TYPES[self.loss_type]
        if loss_type.level is not None and self.importance_sampling_level != loss_type.level:
            warnings.warn(loss_type.level_warning.format(self.loss_type), stacklevel=3)

    @property
    def prompts_per_step(self) -> int:
        """Prompts one optimizer step trains on, over every process: `num_generations` completions each."""
        return (self.per_device_train_batch_size * self.gradient_accumulation_steps * self.world_size
                // self.num_generations)


# The docs list the loss types as the table holds them.
GRPOConfig.__doc__ = GRPOConfig.__doc__.replace(
    "{loss_types}", "\n".join(" " * 16 + line for line in describe_loss_types().splitlines()))
