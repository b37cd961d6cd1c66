"""`BaseTrainer`: what `A2POTrainer` and `GRPOTrainer` share, on top of `transformers.Trainer`.

Everything that is not the method: the model, its reference policy and LoRA; prompts (rendering, left padding,
left truncation); the rollout engine (`a2po.rollout`: wide KV-cached decodes, a prompt's keys and values shared by
its samples, one reproducible random stream per sampled sequence); rewards and their checks; callbacks and the
agreement of several processes on a stop; evaluation (greedy accuracy on held-out prompts, with the method's own
extra terms through `_eval_batch`); logging; checkpoints and their fail points.

Read top to bottom: set-up, prompts and rewards, sampling, callbacks, training, evaluation, logging. A method
subclass adds its loss (`compute_loss`) and what its evaluation reports.
"""

from __future__ import annotations

import copy
import functools
import gc
import logging
import math
import resource
import sys
import time
import warnings
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from transformers import (
    AutoModelForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Trainer,
    TrainerState,
    TrainingArguments,
    set_seed,
)

from a2po._faults import fault_point
from a2po.answers import CORRECT_THRESHOLD, prompt_question
from a2po.callbacks import RunCounters, StageInterrupted, TimedCheckpoints
from a2po.completions import completions_file, print_completions, unique_prompts, write_completions
from a2po.compute import FlopsPerToken, sequence_tokens
from a2po.config import resolve_max_completion_length
from a2po.core import completion_mask
from a2po.device import autocast_dtype, precision_summary, warn_unused_gpu
from a2po.rewards import as_given, call_on_rows, row_columns, tasks_of
from a2po.rollout import per_token_logprobs, sample_completions
from a2po.settings import uses_vllm, vllm_run_problem
from a2po.shown import shown
from a2po.tokens import (
    decode_completions,
    encode_prompt,
    end_token_ids,
    load_tokenizer,
    prepare_tokenizer,
    render_prompt,
)
from a2po.values import prompt_id_for

if TYPE_CHECKING:
    from a2po.vllm_engine import VLLMEngine

RewardFunc = Callable[..., list[float]]
logger = logging.getLogger(__name__)


def frozen_gc(method: Callable) -> Callable:
    """Run `method` with the objects alive at its start exempt from Python's cyclic garbage collector.

    A process that has imported torch, transformers and datasets holds millions of objects, and each full
    collection scans them all, a noticeable pause several times an epoch (docs/benchmarks.md, "Design figures"),
    for nothing, since those objects live until the end. Objects created during the call are collected as usual.
    """
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if gc.get_freeze_count():  # already inside a frozen call
            return method(*args, **kwargs)
        gc.freeze()
        try:
            return method(*args, **kwargs)
        finally:
            gc.unfreeze()
    return wrapper


def cast_reference_matmuls(reference: torch.nn.Module, dtype: torch.dtype) -> int:
    """Store the reference's linear layers (weights and biases) in `dtype`, the autocast dtype the policy computes
    its matmuls in; returns the bytes this frees. Exact: autocast casts an fp32 weight to `dtype` (round to nearest)
    before each matmul, which is the cast done here once, so the reference computes what the fp32 copy computed,
    and log pi/pi_ref is 0 before the first update. Everything else stays fp32: embeddings (a linear layer tied to
    one too: the embedding's fp32 output feeds the residual stream), norms and buffers."""
    shared = {id(p) for module in reference.modules() if not isinstance(module, torch.nn.Linear)
              for p in module.parameters(recurse=False)}
    freed = 0
    for module in reference.modules():
        if not isinstance(module, torch.nn.Linear) or id(module.weight) in shared:
            continue
        for name, param in list(module.named_parameters(recurse=False)):
            if param.dtype == torch.float32:
                freed += param.numel() * (4 - torch.finfo(dtype).bits // 8)
                setattr(module, name, torch.nn.Parameter(param.detach().to(dtype), requires_grad=False))
    return freed


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory of this process in GiB: the CUDA allocator's peak on a GPU, else the peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


@dataclass
class Rollout:
    """Completions sampled for a batch of prompts, decoded and scored: row i * num_samples + j of the completion
    tensors is sample j of prompt i."""

    rows: list[dict[str, Any]]         # the dataset rows, one per prompt
    prompt_ids: torch.Tensor           # (prompts, P), left-padded
    prompt_mask: torch.Tensor
    prompt_texts: list[str]            # what the model saw (chat template applied)
    completion_ids: torch.Tensor       # (prompts * num_samples, T)
    completion_mask: torch.Tensor      # 1 up to and including each row's first EOS
    completions: list[str]
    rewards: torch.Tensor              # (prompts * num_samples,) float64: the weighted sum of the reward functions
    rewards_per_func: torch.Tensor     # (prompts * num_samples, F)
    clipped: torch.Tensor              # rows that never ended within max_completion_length
    num_samples: int = 1
    # (prompts * num_samples, T): each token's log-prob as the sampler drew it, where asked (vLLM only), else None
    sampling_logps: torch.Tensor | None = None
    # The reward functions' `log_extra` columns: one value per completion, in the order of `completions`.
    extra_columns: dict[str, list] = field(default_factory=dict)

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(-1).float()

    def extra(self, k: int) -> dict[str, Any]:
        """Completion `k`'s `log_extra` values, by column (the `"extra"` of a sample)."""
        return {column: values[k] for column, values in self.extra_columns.items()}


class Scores(NamedTuple):
    """The reward functions' verdict on a batch of completions (`BaseTrainer._score`)."""

    total: torch.Tensor                 # (completions,) float64: the weighted sum, NaN where no function applied
    per_func: torch.Tensor              # (completions, F), NaN where a function returned None
    extra_columns: dict[str, list]      # `log_extra`: one value per completion


def completion_token_lists(completion_ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each completion's token ids up to and including its first end token, without padding: the `completion_ids`
    TRL passes to reward functions."""
    return [ids[keep.bool()].tolist() for ids, keep in zip(completion_ids.cpu(), mask.cpu())]


def load_policy(model: PreTrainedModel | str, args: TrainingArguments,
                processing_class: PreTrainedTokenizerBase | None = None
                ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy (`model`, or loaded from its name with `model_init_kwargs`) and its tokenizer, padding on the
    left."""
    model_path = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
    if isinstance(model, str):
        from a2po.models import resolve_model

        model_path = resolve_model(model)
        init_kwargs = dict(args.model_init_kwargs or {})
        init_kwargs.setdefault("trust_remote_code", args.trust_remote_code)
        if "dtype" not in init_kwargs and "torch_dtype" not in init_kwargs:
            # transformers 5 loads a checkpoint in its stored dtype (bf16 for most hub models), and an optimizer
            # step on bf16 weights rounds away every update under half a bf16 step (2**-9 to 2**-8 of the weight),
            # most of them at a small learning rate: fp32 master weights, computed in bf16 or fp16 by autocast
            # (`bf16`, `fp16`). A dtype the user sets is their choice and is kept (TRL keeps the checkpoint's dtype
            # by default).
            init_kwargs["dtype"] = torch.float32
        model = AutoModelForCausalLM.from_pretrained(model_path, **init_kwargs)
    if processing_class is None:
        revision = (args.model_init_kwargs or {}).get("revision")
        processing_class = load_tokenizer(model_path, revision=revision, trust_remote_code=args.trust_remote_code)
    else:
        prepare_tokenizer(processing_class)
    return model, processing_class


class BaseTrainer(Trainer):
    """The shared part of `A2POTrainer` and `GRPOTrainer`; see their docstrings for the arguments."""

    _tag_names: list[str] = []
    _eval_extra_metrics: tuple[str, ...] = ()  # per-prompt terms `_eval_batch` returns, averaged as eval metrics
    _non_binary_note = "accuracy counts only r >= 1 as correct."
    # Why the method cannot use a completion that no reward function scored (an error), or None: it gets reward NaN
    # and a warning, as in TRL (see `_score`).
    _unscored_error: str | None = None

    def __init__(self, model: PreTrainedModel | str, reward_funcs: RewardFunc | list[RewardFunc],
                 args: TrainingArguments, train_dataset: Dataset | None = None,
                 eval_dataset: Dataset | dict[str, Dataset] | None = None,
                 processing_class: PreTrainedTokenizerBase | None = None, callbacks=None,
                 optimizers=(None, None), peft_config=None):
        warn_unused_gpu(bool(args.use_cpu), stacklevel=2)
        if uses_vllm(args) and (problem := vllm_run_problem(args.world_size)):
            raise ValueError(problem)
        self.model_id = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
        model, processing_class = load_policy(model, args, processing_class)

        self.reward_funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if not self.reward_funcs or not all(callable(f) for f in self.reward_funcs):
            raise TypeError("reward_funcs must be a callable or a non-empty list of callables "
                            "f(prompts, completions, **columns) -> list[float].")
        self.reward_names = [getattr(f, "__name__", f"reward_{i}") for i, f in enumerate(self.reward_funcs)]
        weights = args.reward_weights if args.reward_weights is not None else [1.0] * len(self.reward_funcs)
        if len(weights) != len(self.reward_funcs):
            raise ValueError(f"reward_weights has {len(weights)} values but there are {len(self.reward_funcs)} "
                             "reward functions; give one weight per function (or None for 1.0 each).")
        self.reward_weights = torch.tensor(weights, dtype=torch.float64)

        self.use_peft = peft_config is not None
        self.ref_model = None
        if self.use_peft:
            from peft import get_peft_model

            model = get_peft_model(model, peft_config)
            if args.gradient_checkpointing:
                model.enable_input_require_grads()
        elif self._needs_reference(args):
            # A frozen copy in the policy's dtype: a bf16 copy of fp32 weights computes another function (bf16
            # norms and residual stream), so log pi - log pi_ref would not start at 0. Under autocast its matmul
            # weights are then stored in the autocast dtype (`cast_reference_matmuls`, below), which is exact.
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)

        half = sorted({str(p.dtype) for p in model.parameters()
                       if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16)})
        explicit = {"dtype", "torch_dtype"} & set(args.model_init_kwargs or {})
        if half and not explicit:
            warnings.warn(f"The model's trainable weights are {', '.join(half)}: the optimizer updates them in that "
                          "precision, where small updates round away. Load the model in float32 (bf16=True or "
                          "fp16=True still computes in half precision).", stacklevel=2)

        gen_config = getattr(model, "generation_config", None)
        self.eos_token_ids = end_token_ids(model, processing_class)
        self.pad_token_id = processing_class.pad_token_id
        self.max_completion_length = resolve_max_completion_length(args.max_completion_length, gen_config)

        super().__init__(model=model, args=args, data_collator=_identity_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, callbacks=callbacks,
                         optimizers=optimizers)
        # Our losses are micro-batch means, which the Trainer divides by the number of micro-batches. Older
        # transformers 5 releases (5.17, vLLM's pin) have no `loss_is_scaled_for_ga` and divide unless the model
        # takes loss kwargs and the batch counts labels: a model said to take none is divided by every version.
        self.loss_is_scaled_for_ga = False
        self.model_accepts_loss_kwargs = False
        if getattr(self, "is_fsdp_enabled", False):
            warnings.warn(f"{type(self).__name__} has not been tested under FSDP (only DDP, and single processes): "
                          "sampling runs on the unwrapped model, and each process may stop decoding at another step.",
                          stacklevel=2)
        if args.save_every_seconds:
            self.add_callback(TimedCheckpoints(args.save_every_seconds))
        # The clock goes first: a budget or time-grid evaluation it asks for is seen by the callbacks after it (a
        # chunk's recorder defers an evaluation that would not end before its deadline).
        flow = [cb for cb in self.callback_handler.callbacks if type(cb).__name__ == "DefaultFlowCallback"]
        self.callback_handler.callbacks.insert(len(flow), RunCounters())
        if getattr(args, "eval_every_seconds", None) and eval_dataset is None:
            raise ValueError("eval_every_seconds evaluates held-out prompts: pass an eval_dataset, or set "
                             "eval_every_seconds to None.")
        self.reference_bytes_saved = 0
        if self.ref_model is not None:
            if self.is_deepspeed_enabled or self.is_fsdp_enabled:
                self.ref_model.to(self.accelerator.device)
            else:
                if (compute := autocast_dtype(self.accelerator)) is not None:
                    self.reference_bytes_saved = cast_reference_matmuls(self.ref_model, compute)
                # Wrapped as the Trainer wraps the policy (the same autocast, outputs cast to fp32), as in TRL: the
                # reference computes in the policy's precision.
                self.ref_model = self.accelerator.prepare_model(self.ref_model, evaluation_mode=True)
        self._metrics: dict[str, list[float]] = defaultdict(list)
        # Where the reward functions' `log_metric` values go: the training metrics, or an evaluation's or a stage 1's
        # own (`_reward_metrics_into`).
        self._reward_metrics: dict[str, list[float]] = self._metrics
        # Evaluate right after restoring a checkpoint in `train` (see there).
        self.evaluate_on_resume = False
        self._warned_non_binary = False
        # Time and work spent decoding, per phase ("values", "train", "eval"): for benchmarks and users alike; and
        # each phase's compute (`flops`: sampling and the log-probability passes, `a2po.compute`).
        self.rollout_stats: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.flops_per_token = FlopsPerToken.of(self.accelerator.unwrap_model(self.model))
        self._local_step_flops = 0.0  # this process's compute in the micro-batch just trained (`floating_point_ops`)
        # With use_vllm: the engine (made at the first sampling) and this trainer's name in its weights keys.
        self._vllm: VLLMEngine | None = None
        self._vllm_owner = object()
        # `log_completions`: the rows of the latest generation (one optimizer step's completions over every process),
        # as TRL keeps them, written and printed at each logging step.
        self._completion_rows: deque[dict[str, Any]] = deque(
            maxlen=args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size)

    def _set_signature_columns_if_needed(self):
        # The model never sees dataset columns: with `remove_unused_columns`, keep what sampling and the loss read.
        if self._signature_columns is None:
            self._signature_columns = ["prompt", "prompt_id", "v_star"]

    def _needs_reference(self, args: TrainingArguments) -> bool:
        """Whether the method uses pi_ref (with LoRA it is the adapters switched off, so it costs no memory)."""
        return True

    @property
    def run_counters(self) -> RunCounters:
        """The counters a resumed run continues (`RunCounters`; looked up, since a restore may replace it)."""
        return next(cb for cb in self.callback_handler.callbacks if isinstance(cb, RunCounters))

    # ----------------------------------------------------------------------------------------------------------
    # Prompts, completions and rewards

    def _render_prompt(self, prompt: Any) -> str:
        return render_prompt(self.processing_class, prompt)

    def _encode_prompts(self, prompts: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        """Left-padded prompt ids (`a2po.tokens.encode_prompt`: a prompt longer than `max_prompt_length` keeps its
        last tokens), and the prompts' texts."""
        pairs = [encode_prompt(self.processing_class, prompt, self.args.max_prompt_length) for prompt in prompts]
        texts, encoded = [text for text, _ in pairs], [ids for _, ids in pairs]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.full((len(encoded), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for i, ids in enumerate(encoded):
            if ids:
                input_ids[i, width - len(ids):] = torch.tensor(ids)
                attention_mask[i, width - len(ids):] = 1
        device = self.accelerator.device
        return input_ids.to(device), attention_mask.to(device), texts

    def _decode(self, completion_ids: torch.Tensor) -> tuple[list[str], torch.Tensor]:
        return decode_completions(self.processing_class, completion_ids, self.eos_token_ids)

    def _score(self, rows: Sequence[dict[str, Any]], completions: Sequence[str],
               completion_ids: Sequence[Sequence[int]], trainer_state: TrainerState | None = None) -> Scores:
        """The reward functions' verdict on `completions` (`completion_ids`: their tokens, `completion_token_lists`):
        the weighted sum, (len(rows),), each function's rewards, (len(rows), F), NaN where a function returned None (it
        does not apply to that completion: multi-task data, one checker per task), and their `log_extra` columns.

        As in TRL the sum skips those (and NaN values: it is a sum ignoring NaN, `a2po.rewards.RewardCalls.weighted`);
        a completion that every function skipped is unscored: NaN and a warning, or an error where the method cannot
        use one (`_unscored_error`). The functions are called as TRL calls them (`a2po.rewards.call_on_rows`,
        `call_rewards`), with `trainer_state` `self.state`
        unless one is given (stage 1: the state before training); what they pass to `log_metric` joins
        `_reward_metrics` (one value per call, the mean of what was logged, as TRL's).
        """
        state = self.state if trainer_state is None else trainer_state
        calls = call_on_rows(self.reward_funcs, self.reward_names, rows, completions, completion_ids, state)
        for name, value in calls.metrics.items():
            self._reward_metrics[name].append(value)
        per_func = torch.tensor([[math.nan if v is None else v for v in values] for values in calls.values],
                                dtype=torch.float64).T.contiguous()
        total = torch.tensor([math.nan if t is None else t for t in calls.weighted(self.reward_weights.tolist())],
                             dtype=torch.float64)
        unscored = per_func.isnan().all(dim=1)
        if unscored.any():
            self._report_unscored(rows, completions, unscored.nonzero()[:, 0].tolist())
        binary = torch.tensor([0.0, 1.0], dtype=total.dtype)
        outside = total[~unscored & ~torch.isin(total, binary)]
        if not self._warned_non_binary and len(outside):
            self._warned_non_binary = True
            warnings.warn(f"Rewards outside {{0, 1}} (e.g. {outside[0]:.3g}): {self._non_binary_note}", stacklevel=2)
        return Scores(total, per_func, calls.extra_columns)

    @contextmanager
    def _reward_metrics_into(self, sink: dict[str, list[float]]) -> Iterator[dict[str, list[float]]]:
        """Send the reward functions' `log_metric` values to `sink` (an evaluation's, a stage 1's) instead of the
        training metrics."""
        before, self._reward_metrics = self._reward_metrics, sink
        try:
            yield sink
        finally:
            self._reward_metrics = before

    def _reward_metric_means(self, sink: dict[str, list[float]]) -> dict[str, float]:
        """The mean of each metric in `sink` over every process's values (a collective: every rank calls it)."""
        parts = gather_object([dict(sink)]) if self.accelerator.num_processes > 1 else [sink]
        merged: dict[str, list[float]] = defaultdict(list)
        for part in parts:
            for name, values in part.items():
                merged[name].extend(values)
        return {name: _scored_mean(values) for name, values in merged.items()}

    def _report_unscored(self, rows: Sequence[dict[str, Any]], completions: Sequence[str], index: list[int]) -> None:
        """Completions no reward function scored (rows `index`): an error naming the functions and tasks where the
        method needs a number (`_unscored_error`), else a warning, as TRL's."""
        first = index[0]
        what = (f"All reward functions ({', '.join(self.reward_names)}) returned None (or NaN) for {len(index)} of "
                f"{len(rows)} completions{tasks_of(row_columns(rows), index)} (e.g. prompt "
                f"{shown(prompt_question(rows[first]['prompt']), 120)}, completion {shown(completions[first], 120)})")
        if self._unscored_error is not None:
            raise ValueError(f"{what}: {self._unscored_error} Give each task a reward function that scores it, or "
                             "return 0.0 where no check applies.")
        warnings.warn(f"{what}: their reward is NaN, left out of the reward means and stds, and their advantage is 0. "
                      "Make sure at least one reward function scores each completion.", stacklevel=3)

    def _state_before_training(self) -> TrainerState:
        """The trainer state as reward functions see it before training (global_step 0): what stage 1 gives them
        whenever it runs (an eval set's V* may be estimated mid-training), so V* never depends on that moment."""
        state = copy.copy(self.state)
        state.global_step, state.epoch = 0, 0.0
        return state

    # ----------------------------------------------------------------------------------------------------------
    # Sampling

    @contextmanager
    def _reference_policy(self) -> Iterator[torch.nn.Module]:
        """The frozen reference policy: the copy, or in LoRA mode the same weights with adapters disabled."""
        if self.ref_model is not None:
            yield self.ref_model
            return
        model = self.accelerator.unwrap_model(self.model)
        with model.disable_adapter():
            yield model

    def _stream_keys(self, phase: str, rows: Sequence[dict[str, Any]], num_samples: int = 1) -> list[tuple]:
        """One random-stream key per sampled sequence: a sequence's tokens depend on the run seed, the phase, the
        prompt id, the sample index and (training, evaluation) the step, and on nothing else, so batching, shards,
        interruptions and what ran before change no sample (see `a2po.rollout`)."""
        step = 0 if phase == "values" else self.state.global_step + (phase == "train")
        seed = self.values_seed if phase == "values" else self.args.seed
        return [(seed, phase, step, str(row["prompt_id"]), j) for row in rows for j in range(num_samples)]

    @property
    def values_seed(self) -> int:
        """The seed of stage 1's samples: `values_seed` where the method has it and it is set, else the run seed."""
        own = getattr(self.args, "values_seed", None)
        return self.args.seed if own is None else int(own)

    def _sample(self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                num_samples: int = 1, greedy: bool = False, phase: str = "train",
                row_keys: Sequence[tuple] | None = None, greedy_samples: int = 0) -> torch.Tensor:
        """Completion ids, (prompts * num_samples, T), row i * num_samples + j sample j of prompt i."""
        return self._sample_with_logprobs(model, prompt_ids, prompt_mask, num_samples, greedy, phase, row_keys,
                                          greedy_samples)[0]

    def _sample_with_logprobs(self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                              num_samples: int = 1, greedy: bool = False, phase: str = "train",
                              row_keys: Sequence[tuple] | None = None, greedy_samples: int = 0,
                              logprobs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`_sample`'s completion ids, and with `logprobs` and `use_vllm` each sampled token's log-probability
        as vLLM drew it (`VLLMEngine.generate`); else None (the native decoder samples with the trainer's own model
        and kernels, whose log-probabilities are the trainer's forward pass)."""
        args = self.args
        # The decoders call the model's modules, not its (autocast-wrapped) forward: sample in the precision the
        # policy trains in, fp16 included.
        dtype = autocast_dtype(self.accelerator)
        autocast = torch.autocast(self.accelerator.device.type, dtype=dtype) if dtype else nullcontext()
        # The engine's start and the weight push are timed apart (`_vllm_for`): `seconds` is sampling alone.
        engine = self._vllm_for(model, phase, dtype) if uses_vllm(args) else None
        start = time.perf_counter()
        settings = dict(max_new_tokens=self.max_completion_length, eos_token_ids=self.eos_token_ids,
                        pad_token_id=self.pad_token_id, num_samples=num_samples, do_sample=not greedy,
                        temperature=args.temperature, top_k=args.sampling_top_k, top_p=args.top_p,
                        row_keys=None if greedy else row_keys, greedy_samples=greedy_samples)
        sampling_logps = None
        if engine is not None:
            prompts = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask)]
            out, sampling_logps = engine.generate(prompts, logprobs=logprobs, **settings)
            out = out.to(prompt_ids.device)
            sampling_logps = None if sampling_logps is None else sampling_logps.to(prompt_ids.device)
        else:
            with autocast:
                out = sample_completions(model, prompt_ids, prompt_mask, **settings)
        if out.is_cuda:
            torch.cuda.synchronize()
        stats = self.rollout_stats[phase]
        stats["seconds"] += time.perf_counter() - start
        stats["decode_steps"] += out.shape[1]
        stats["sequences"] += out.shape[0]
        mask = completion_mask(out, self.eos_token_ids)
        stats["tokens"] += int(mask.sum())
        stats["flops"] += self.flops_per_token.forward(sequence_tokens(prompt_mask, mask))
        return out, sampling_logps

    def _token_logprobs(self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                        completion_ids: torch.Tensor, completion_mask: torch.Tensor, *, phase: str, grad: bool,
                        **kwargs: Any) -> Any:
        """`a2po.rollout.per_token_logprobs`, its compute counted in `phase` (a training pass with `grad`)."""
        tokens = sequence_tokens(prompt_mask, completion_mask)
        per_token = self.flops_per_token.train if grad else self.flops_per_token.forward
        self.rollout_stats[phase]["flops"] += per_token(tokens)
        # One process without DeepSpeed or FSDP: no full-vocabulary logits (`per_token_logprobs`' `lean_head`).
        lean = self.accelerator.num_processes == 1 and not (self.is_deepspeed_enabled or self.is_fsdp_enabled)
        return per_token_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, lean_head=lean,
                                  autocast_dtype=autocast_dtype(self.accelerator), **kwargs)

    def _vllm_for(self, model: torch.nn.Module, phase: str, dtype: torch.dtype | None) -> VLLMEngine:
        """The vLLM engine, holding `model`'s current weights (pushed when it holds others).

        The engine holds one set of weights, keyed by what they are: the reference's (stage 1, `phase` "values")
        or the policy's at this optimizer step, for this trainer and this `train()` call. A new key (the step
        after an optimizer step, a resume, another trainer sharing the process's engine) pushes them again.
        """
        stats = self.rollout_stats[phase]
        if self._vllm is None:
            from a2po.vllm_engine import engine_for, engine_settings

            start = time.perf_counter()
            policy = self.accelerator.unwrap_model(self.model)
            dtype = dtype or next(policy.parameters()).dtype
            self._vllm = engine_for(engine_settings(self.args, policy.config, dtype))
            stats["engine_start_seconds"] += time.perf_counter() - start
        role = "reference" if phase == "values" else "policy"
        key = (self._vllm_owner, role, None if role == "reference" else self.state.global_step)
        if self._vllm.weights_key != key:
            from a2po.vllm_engine import merged_weights

            start = time.perf_counter()
            self._vllm.load_weights(merged_weights(self.accelerator.unwrap_model(model)), key)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            stats["weight_push_seconds"] += time.perf_counter() - start
        return self._vllm

    def _rollout_and_score(self, model: torch.nn.Module, rows: Sequence[dict[str, Any]], greedy: bool = False,
                           phase: str = "train", num_samples: int = 1, sampling_logprobs: bool = False) -> Rollout:
        """Sample `num_samples` completions per row from `model` (one decode, each prompt prefilled once), then
        decode and score them; with `sampling_logprobs`, keep vLLM's log-probabilities of the sampled tokens."""
        policy = self.accelerator.unwrap_model(model)
        prompt_ids, prompt_mask, texts = self._encode_prompts([row["prompt"] for row in rows])
        completion_ids, sampling_logps = self._sample_with_logprobs(
            policy, prompt_ids, prompt_mask, num_samples=num_samples, greedy=greedy, phase=phase,
            row_keys=None if greedy else self._stream_keys(phase, rows, num_samples), logprobs=sampling_logprobs)
        completions, mask = self._decode(completion_ids)
        scores = self._score([row for row in rows for _ in range(num_samples)], completions,
                             completion_token_lists(completion_ids, mask))
        eos = torch.tensor(self.eos_token_ids, device=completion_ids.device)
        clipped = ~torch.isin(completion_ids, eos).any(-1)
        return Rollout(list(rows), prompt_ids, prompt_mask, texts, completion_ids, mask, completions, scores.total,
                       scores.per_func, clipped, num_samples, sampling_logps, scores.extra_columns)

    def _record_rollout(self, rollout: Rollout) -> None:
        """The training metrics both methods log for sampled completions, and the completion-token count."""
        m = self._metrics
        # Over the scored completions: an unscored one (NaN, see `_score`) is neither right nor wrong.
        rewards = rollout.rewards[~rollout.rewards.isnan()]
        m["reward"].append(rewards.mean().item())
        m["reward_std"].append(rewards.std().item() if len(rewards) > 1 else 0.0)
        m["accuracy"].append((rewards >= CORRECT_THRESHOLD).double().mean().item())
        m["completion_length"].append(rollout.lengths.mean().item())
        m["completion_clipped_frac"].append(rollout.clipped.float().mean().item())
        for j, name in enumerate(self.reward_names):
            m[f"rewards/{name}"].append(rollout.rewards_per_func[:, j].nanmean().item())  # where it applied, as TRL
        tokens = rollout.completion_mask.sum()
        if self.accelerator.num_processes > 1:  # every rank samples at the same steps: a safe collective
            tokens = self.accelerator.gather(tokens[None].to(self.accelerator.device)).sum()
        self.run_counters.completion_tokens += int(tokens)

    # What a method adds to TRL's completion table after `advantage` (A*-PO: V* and the implicit reward).
    _completion_columns: tuple[str, ...] = ()

    def _notify_samples(self, samples: list[dict[str, Any]], rollout: Rollout | None = None) -> None:
        """Hand training samples to the callbacks (`on_samples`). `samples[k]` is `rollout`'s completion k: it gets
        each reward function's value (`rewards`), and with `log_completions` its row of TRL's completion table."""
        if rollout is not None:
            for k, sample in enumerate(samples):
                sample["rewards"] = {name: _finite_or_none(rollout.rewards_per_func[k, j])
                                     for j, name in enumerate(self.reward_names)}
        log = rollout is not None and self.args.log_completions
        rows = self._completion_table_rows(samples, rollout) if log else []
        if self.accelerator.num_processes > 1:  # every rank samples at the same steps: a safe collective
            samples = gather_object(samples)
            rows = gather_object(rows) if log else rows
        self._completion_rows.extend(rows)
        self._notify("on_samples", samples=samples)

    def _completion_table_rows(self, samples: list[dict[str, Any]], rollout: Rollout) -> list[dict[str, Any]]:
        """TRL's completion-table rows (`a2po.completions`): the step, the prompt and completion as the reward
        functions got them, each function's reward, the `log_extra` columns, the advantage, the method's own."""
        rows = []
        for k, sample in enumerate(samples):
            prompt = rollout.rows[k // rollout.num_samples]["prompt"]
            rows.append({
                "step": sample["step"], "prompt": prompt, "completion": as_given(prompt, rollout.completions[k]),
                **{name: float(rollout.rewards_per_func[k, j]) for j, name in enumerate(self.reward_names)},
                **rollout.extra(k), "advantage": sample["advantage"],
                **{column: sample[column] for column in self._completion_columns}})
        return rows

    def _write_completions(self) -> None:
        """Write (and print) the latest generation's completion table, as TRL at each logging step."""
        if not self._completion_rows or not self.accelerator.is_main_process:
            return
        step = self.state.global_step
        rows = [{**row, "step": step} for row in self._completion_rows]  # TRL labels every row with the log's step
        write_completions(completions_file(self.args.output_dir, step), rows)
        shown = unique_prompts(rows) if self.args.log_unique_prompts else rows
        print_completions(shown, step, self.reward_names, self.args.num_completions_to_print, seed=self.args.seed)

    # ----------------------------------------------------------------------------------------------------------
    # Callbacks

    def _notify(self, event: str, **kwargs) -> None:
        for callback in self.callback_handler.callbacks:
            handler = getattr(callback, event, None)
            if handler is not None:
                result = handler(self.args, self.state, self.control, **kwargs)
                if result is not None:
                    self.control = result

    def _agree_on_control(self, *names: str) -> None:
        """Under several processes, set each of the `control` flags `names` on every rank when any rank's
        callbacks set it: a stop asked on the main process (a dashboard's), a checkpoint due by one rank's clock
        (`TimedCheckpoints`) then happen at the same batch or step everywhere, and the collectives inside logging,
        evaluation and saving are joined by every rank."""
        if self.accelerator.num_processes == 1:
            return
        names = names or ("should_training_stop", "should_save", "should_log", "should_evaluate")
        local = torch.tensor([float(getattr(self.control, name)) for name in names], device=self.accelerator.device)
        agreed = self.accelerator.gather(local[None]).amax(0).tolist()
        for name, value in zip(names, agreed):
            setattr(self.control, name, bool(value))

    def _maybe_log_save_evaluate(self, *args, **kwargs):
        # Right after `on_step_end` (and `on_epoch_end`) and before the Trainer acts on the flags they set.
        self._agree_on_control()
        return super()._maybe_log_save_evaluate(*args, **kwargs)

    # ----------------------------------------------------------------------------------------------------------
    # Training

    @frozen_gc
    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None,
              **kwargs):
        # Training starts from the run seed whatever ran before it in this process (stage 1 sampled, resumed or was
        # read from a store); a resumed run then takes the generator states of its checkpoint.
        set_seed(self.args.seed)
        logger.info("Training on %s", precision_summary(self))
        # The engine's weights are never trusted across a `train()` call: a resume restores other weights.
        self._vllm_owner = object()
        # The step-0 evaluation (`eval_on_start`) measures the model before training: a resumed run had it already,
        # unless the caller says the checkpoint's step is due for an evaluation that never ran (`evaluate_on_resume`:
        # a chunked run that stopped at its deadline rather than start one).
        eval_on_start = self.args.eval_on_start
        self.args.eval_on_start = (eval_on_start and not resume_from_checkpoint) or bool(
            resume_from_checkpoint and self.evaluate_on_resume)
        try:
            return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial,
                                 ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)
        finally:
            self.args.eval_on_start = eval_on_start
            self._release_vllm()

    def _release_vllm(self) -> None:
        """Give a GPU engine's memory back once training is over (`a2po.vllm_engine.release_engine`)."""
        if self._vllm is not None:
            from a2po.vllm_engine import release_engine

            if release_engine(self._vllm):
                self._vllm = None

    def training_step(self, model, inputs, num_items_in_batch=None):
        before = self.rollout_stats["train"]["flops"]
        loss = super().training_step(model, inputs, num_items_in_batch)
        # The Trainer's `logging_nan_inf_filter` replaces a non-finite loss in the logged `loss`: count them here.
        self._metrics["frac_nonfinite_loss"].append(float(not torch.isfinite(loss).all()))
        # The micro-batch's compute: the run's (every process's, so every rank stops at the same step) and this
        # process's, which the Trainer adds to `state.total_flos` (`floating_point_ops`).
        self._local_step_flops = self.rollout_stats["train"]["flops"] - before
        flops = torch.tensor([self._local_step_flops], dtype=torch.float64)
        if self.accelerator.num_processes > 1:  # every rank trains every micro-batch: a safe collective
            flops = self.accelerator.gather(flops.to(self.accelerator.device)).sum()
        self.run_counters.add_train_flops(float(flops.sum()))
        return loss

    def floating_point_ops(self, inputs) -> int:
        """This process's compute in the micro-batch just trained (`a2po.compute`), which the Trainer sums into
        `state.total_flos` (its own count reads `input_ids`, which our batches of prompts do not carry)."""
        flops, self._local_step_flops = self._local_step_flops, 0.0
        return int(flops)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        if _internal_call:  # inside a checkpoint: its optimizer, scheduler, RNG and trainer state come next
            self._save_checkpoint_extras(output_dir)
            fault_point("checkpoint")

    def _save_checkpoint_extras(self, output_dir: str) -> None:
        """Method state a checkpoint needs beyond the Trainer's, written before the Trainer's own state (whose
        `trainer_state.json`, written last, marks a complete checkpoint)."""

    # ----------------------------------------------------------------------------------------------------------
    # Evaluation

    def eval_sets(self, eval_dataset=None) -> dict[str, Dataset]:
        """Eval datasets by the split name used in V* tables and metrics: "eval", or "eval_<name>" for a dict."""
        eval_dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(eval_dataset, str):
            return {f"eval_{eval_dataset}": self.eval_dataset[eval_dataset]}
        if isinstance(eval_dataset, dict):
            return {f"eval_{name}": ds for name, ds in eval_dataset.items()}
        return {} if eval_dataset is None else {"eval": eval_dataset}

    def evaluate(self, eval_dataset: Dataset | dict[str, Dataset] | str | None = None, ignore_keys=None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """Greedy accuracy on each eval set (pass@1, the number users care about), mean reward and completion
        length, and the method's own terms. A callback that sets `control.should_training_stop` in
        `on_evaluate_batch` stops it after that batch with `StageInterrupted`."""
        sets = self.eval_sets(eval_dataset)
        if not sets:
            raise ValueError(f"evaluate() needs an eval_dataset (here or in {type(self).__name__}(eval_dataset=...)).")
        metrics: dict[str, float] = {}
        start = time.time()
        # A stop already pending (e.g. the end of training) is not a stop request for this evaluation.
        stop_before, self.control.should_training_stop = self.control.should_training_stop, False
        for split, dataset in sets.items():
            prefix = metric_key_prefix if split == "eval" else f"{metric_key_prefix}_{split[len('eval_'):]}"
            prepared, context = self._eval_rows(dataset, split)
            metrics.update(self._evaluate_split(prepared, split, prefix, context))
        self.control.should_training_stop = stop_before
        metrics[f"{metric_key_prefix}_runtime"] = round(time.time() - start, 4)
        counters = self.run_counters
        counters.eval_seconds += time.time() - start
        # Where on the run's clock this evaluation stands: comparisons draw accuracy against these.
        metrics.update(self._clock_metrics())
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _eval_rows(self, dataset: Dataset, split: str) -> tuple[Dataset, Any]:
        """The rows evaluation reads (with a `prompt_id` column), and what `_eval_summary` needs about them."""
        return with_prompt_ids(dataset), None

    def _eval_batch(self, policy: torch.nn.Module, batch: list[dict[str, Any]], prompt_ids: torch.Tensor,
                    prompt_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, list[float]]]:
        """Each prompt's greedy completion ids, and the method's per-prompt terms (`_eval_extra_metrics`)."""
        return self._sample(policy, prompt_ids, prompt_mask, greedy=True, phase="eval"), {}

    def _eval_sample_fields(self, row: dict[str, Any], reward: float) -> dict[str, Any]:
        """The method's fields of an evaluation sample (A*-PO: V* and r - V*)."""
        return {"v_star": None, "advantage": None, "implicit_reward": None}

    def _eval_summary(self, prefix: str, rows: list[dict[str, Any]], context: Any) -> dict[str, float]:
        """The method's split-level evaluation metrics."""
        return {}

    @torch.no_grad()
    def _evaluate_split(self, dataset: Dataset, split: str, prefix: str, context: Any = None) -> dict[str, float]:
        rows = dataset.to_list()
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        mine = rows[rank::world]
        batch_size = self.args.per_device_eval_batch_size
        results, samples = [], []
        logged: dict[str, list[float]] = defaultdict(list)  # the reward functions' `log_metric` values
        policy = self.accelerator.unwrap_model(self.model)
        # Every rank runs as many batches as the largest shard (the first) needs, with an empty batch once its own
        # shard is done: each batch ends in a collective (the stop agreed) that every rank joins.
        num_batches = -(-len(rows[0::world]) // batch_size)
        for index in range(num_batches):
            batch = mine[index * batch_size:(index + 1) * batch_size]
            if batch:
                prompt_ids, prompt_mask, texts = self._encode_prompts([row["prompt"] for row in batch])
                with self._reward_metrics_into(logged):
                    greedy_ids, extra = self._eval_batch(policy, batch, prompt_ids, prompt_mask)
                    greedy_completions, greedy_mask = self._decode(greedy_ids)
                    greedy = self._score(batch, greedy_completions, completion_token_lists(greedy_ids, greedy_mask))
                for i, row in enumerate(batch):
                    reward = float(greedy.total[i])
                    correct = math.nan if math.isnan(reward) else float(reward >= CORRECT_THRESHOLD)
                    results.append({"correct": correct, "reward": reward,
                                    "length": float(greedy_mask[i].sum()), "task": row.get("task"),
                                    **{name: values[i] for name, values in extra.items()}})
                    samples.append({"step": self.state.global_step, "split": split, "prompt_id": row["prompt_id"],
                                    "sample_index": 0, "prompt_text": texts[i],
                                    "question": prompt_question(row["prompt"]), "completion": greedy_completions[i],
                                    "reward": reward, **self._eval_sample_fields(row, reward),
                                    "completion_length": int(greedy_mask[i].sum()),
                                    "extra": {c: values[i] for c, values in greedy.extra_columns.items()}})
            done = min(len(rows), (index + 1) * batch_size * world)
            fault_point("evaluate_batch")
            self._notify("on_evaluate_batch", split=split, done=done, total=len(rows))
            self._agree_on_control("should_training_stop")
            if self.control.should_training_stop:
                raise StageInterrupted(f"Evaluation ({split}) stopped after {done} of {len(rows)} prompts.")
        if world > 1:
            results, samples = gather_object(results), gather_object(samples)
        self._notify("on_samples", samples=samples)
        n = max(len(results), 1)
        # Accuracy and reward over the scored prompts: an unscored one (NaN, see `_score`) is neither right nor wrong.
        out = {f"{prefix}_accuracy": _scored_mean(r["correct"] for r in results),
               f"{prefix}_reward": _scored_mean(r["reward"] for r in results)}
        for name in self._eval_extra_metrics:
            out[f"{prefix}_{name}"] = sum(r[name] for r in results) / n
        out[f"{prefix}_completion_length"] = sum(r["length"] for r in results) / n
        # A mix of tasks (a `task` column, e.g. reasoning-gym mixes): accuracy per task too.
        tasks = sorted({r["task"] for r in results if isinstance(r["task"], str)})
        if len(tasks) > 1:
            for task in tasks:
                out[f"{prefix}_accuracy/{task}"] = _scored_mean(r["correct"] for r in results if r["task"] == task)
        out.update(self._eval_summary(prefix, rows, context))
        # The reward functions' own metrics under the evaluation's prefix, as TRL's "eval_<name>"; a built-in wins.
        metrics = self._reward_metric_means(logged)
        return {**{f"{prefix}_{name}": value for name, value in metrics.items()}, **out}

    # ----------------------------------------------------------------------------------------------------------
    # Logging

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:  # a training step's log: the window's averaged metrics and the run's counters
            averaged = {k: sum(v) / len(v) for k, v in self._metrics.items()}
            peak = peak_memory_gb(self.accelerator.device)
            if self.accelerator.num_processes > 1:
                names = sorted(averaged)
                local = torch.tensor([averaged[k] for k in names] + [peak], device=self.accelerator.device)
                gathered = self.accelerator.gather(local[None])
                averaged = dict(zip(names, gathered[:, :-1].mean(0).tolist()))
                peak = gathered[:, -1].max().item()
            logs = {**logs, **averaged, **self._clock_metrics(), "peak_memory_gb": round(peak, 4)}
            self._metrics.clear()
        logs = {k: (v if not isinstance(v, float) or math.isfinite(v) else float("nan")) for k, v in logs.items()}
        super().log(logs, start_time)
        if "loss" in logs and self.args.log_completions:
            self._write_completions()


    def _clock_metrics(self) -> dict[str, float]:
        """The run's clock (`RunCounters`) as logged with every training log and evaluation."""
        counters = self.run_counters
        clock = {"completion_tokens": counters.completion_tokens, "train_seconds": round(counters.train_seconds, 4),
                 "eval_seconds": round(counters.eval_seconds, 4), "train_flops": counters.train_flops,
                 "compute_flops": counters.compute}
        if counters.step_seconds is not None:
            clock["step_seconds"] = round(counters.step_seconds, 4)
        return clock


def with_prompt_ids(dataset: Dataset) -> Dataset:
    """`dataset` with a `prompt_id` column: its own, else a hash of each row (`a2po.values.prompt_id_for`)."""
    if "prompt_id" in dataset.column_names:
        return dataset
    return dataset.add_column("prompt_id", [prompt_id_for(row) for row in dataset.to_list()])


def _finite_or_none(value: torch.Tensor) -> float | None:
    """A reward as stored: None where the function did not apply (NaN)."""
    number = float(value)
    return number if math.isfinite(number) else None


def _scored_mean(values: Iterable[float]) -> float:
    """The mean of the values that are not NaN (unscored completions, see `BaseTrainer._score`); NaN when every one
    is, 0.0 when there are none."""
    values = list(values)
    scored = [v for v in values if not math.isnan(v)]
    return sum(scored) / len(scored) if scored else math.nan if values else 0.0


def _identity_collator(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return rows
