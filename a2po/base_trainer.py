"""`BaseTrainer`: what `A2POTrainer` and `GRPOTrainer` share, on top of `transformers.Trainer`.

Everything that is not the method: the model, its reference policy and LoRA (`a2po.policy`); prompts (rendering,
left padding, left truncation); the rollout engine (`a2po.rollout`: wide KV-cached decodes, a prompt's keys and
values shared by its samples, one reproducible random stream per sampled sequence); rewards and their checks;
stage 1's public face (each method holds its own `a2po.stage_one.StageOne`); callbacks and the agreement of several
processes on a stop; evaluation (greedy accuracy on held-out prompts, with the method's own extra terms through
`_eval_batch`); logging; checkpoints and their fail points.

Read top to bottom: set-up, prompts and rewards, sampling, stage 1, callbacks, training, evaluation, logging. A method
subclass adds its stage 1 (`stage_one`), its loss (`compute_loss`) and what its evaluation reports.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainerState, TrainingArguments, set_seed

from a2po._faults import fault_point
from a2po.answers import CORRECT_THRESHOLD, prompt_question
from a2po.callbacks import RunCounters, TimedCheckpoints
from a2po.completions import completions_file, print_completions, unique_prompts, write_completions
from a2po.compute import FlopsPerToken, sequence_tokens
from a2po.config import resolve_max_completion_length
from a2po.core import completion_mask
from a2po.device import autocast_dtype, frozen_gc, peak_memory_gb, precision_summary, warn_unused_gpu
from a2po.evaluation import evaluate_split, scored_mean
from a2po.policy import cast_reference_matmuls, load_policy, with_reference
from a2po.rewards import as_given, call_on_rows, row_columns, tasks_of
from a2po.rollout import Rollout, Scores, completion_token_lists, per_token_logprobs, sample_completions
from a2po.settings import samples_stage_one, uses_vllm, vllm_run_problem
from a2po.shown import shown
from a2po.stage_one import StageOne
from a2po.tokens import decode_completions, encode_prompt, end_token_ids, render_prompt
from a2po.values import with_prompt_ids

if TYPE_CHECKING:
    from a2po.vllm_engine import VLLMEngine

RewardFunc = Callable[..., list[float]]
logger = logging.getLogger(__name__)


class BaseTrainer(Trainer):
    """The shared part of `A2POTrainer` and `GRPOTrainer`; see their docstrings for the arguments."""

    _method: str  # "a2po" or "grpo" (`a2po.settings.METHODS`)
    _tag_names: list[str] = []
    _eval_extra_metrics: tuple[str, ...] = ()  # per-prompt terms `_eval_batch` returns, averaged as eval metrics
    _non_binary_note = "accuracy counts only r >= 1 as correct."
    # Why the method cannot use a completion that no reward function scored (an error), or None: it gets reward NaN
    # and a warning, as in TRL (see `_score`).
    _unscored_error: str | None = None
    stage_one: StageOne  # the method's stage 1, with its own rules: set by its `__init__`

    def __init__(self, model: PreTrainedModel | str, reward_funcs: RewardFunc | list[RewardFunc],
                 args: TrainingArguments, train_dataset: Dataset | None = None,
                 eval_dataset: Dataset | dict[str, Dataset] | None = None,
                 processing_class: PreTrainedTokenizerBase | None = None, callbacks=None,
                 optimizers=(None, None), peft_config=None):
        self._check_run(args, eval_dataset)
        self.model_id = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
        model, processing_class = load_policy(model, args, processing_class)
        self._set_rewards(reward_funcs, args.reward_weights)
        self.use_peft = peft_config is not None
        model, self.ref_model = with_reference(model, args, peft_config, self._needs_reference(args))
        self.eos_token_ids = end_token_ids(model, processing_class)
        self.pad_token_id = processing_class.pad_token_id
        self.max_completion_length = resolve_max_completion_length(args.max_completion_length,
                                                                   getattr(model, "generation_config", None))
        super().__init__(model=model, args=args, data_collator=_identity_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, callbacks=callbacks,
                         optimizers=optimizers)
        self._adapt_trainer(args)
        self._place_reference()
        self._start_run_state(args)

    def _check_run(self, args: TrainingArguments, eval_dataset: Any) -> None:
        """What the settings ask of this process, checked before the model loads: a GPU torch can use (else a
        warning), vLLM in one process, held-out prompts for timed evaluations."""
        warn_unused_gpu(bool(args.use_cpu), stacklevel=3)
        if uses_vllm(args) and (problem := vllm_run_problem(args.world_size)):
            raise ValueError(problem)
        if getattr(args, "eval_every_seconds", None) and eval_dataset is None:
            raise ValueError("eval_every_seconds evaluates held-out prompts: pass an eval_dataset, or set "
                             "eval_every_seconds to None.")

    def _set_rewards(self, reward_funcs: RewardFunc | list[RewardFunc], weights: list[float] | None) -> None:
        """The reward functions, their names and weights (`reward_weights`; None: 1.0 each)."""
        self.reward_funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if not self.reward_funcs or not all(callable(f) for f in self.reward_funcs):
            raise TypeError("reward_funcs must be a callable or a non-empty list of callables "
                            "f(prompts, completions, **columns) -> list[float].")
        self.reward_names = [getattr(f, "__name__", f"reward_{i}") for i, f in enumerate(self.reward_funcs)]
        weights = weights if weights is not None else [1.0] * len(self.reward_funcs)
        if len(weights) != len(self.reward_funcs):
            raise ValueError(f"reward_weights has {len(weights)} values but there are {len(self.reward_funcs)} "
                             "reward functions; give one weight per function (or None for 1.0 each).")
        self.reward_weights = torch.tensor(weights, dtype=torch.float64)

    def _adapt_trainer(self, args: TrainingArguments) -> None:
        """What this engine changes of the Trainer it is: how a loss is scaled, and the run's callbacks."""
        # Our losses are micro-batch means, which the Trainer divides by the number of micro-batches. Older
        # transformers 5 releases (5.17, vLLM's pin) have no `loss_is_scaled_for_ga` and divide unless the model
        # takes loss kwargs and the batch counts labels: a model said to take none is divided by every version.
        self.loss_is_scaled_for_ga = False
        self.model_accepts_loss_kwargs = False
        if getattr(self, "is_fsdp_enabled", False):
            warnings.warn(f"{type(self).__name__} has not been tested under FSDP (only DDP, and single processes): "
                          "sampling runs on the unwrapped model, and each process may stop decoding at another step.",
                          stacklevel=3)
        if args.save_every_seconds:
            self.add_callback(TimedCheckpoints(args.save_every_seconds))
        # The clock goes first: a budget or time-grid evaluation it asks for is seen by the callbacks after it (a
        # chunk's recorder defers an evaluation that would not end before its deadline).
        flow = [cb for cb in self.callback_handler.callbacks if type(cb).__name__ == "DefaultFlowCallback"]
        self.callback_handler.callbacks.insert(len(flow), RunCounters())

    def _place_reference(self) -> None:
        """The reference copy on the policy's device, in the policy's precision (`reference_bytes_saved`: what
        storing its matmul weights in the autocast dtype freed)."""
        self.reference_bytes_saved = 0
        if self.ref_model is None:
            return
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            self.ref_model.to(self.accelerator.device)
            return
        if (compute := autocast_dtype(self.accelerator)) is not None:
            self.reference_bytes_saved = cast_reference_matmuls(self.ref_model, compute)
        # Wrapped as the Trainer wraps the policy (the same autocast, outputs cast to fp32), as in TRL: the
        # reference computes in the policy's precision.
        self.ref_model = self.accelerator.prepare_model(self.ref_model, evaluation_mode=True)

    def _start_run_state(self, args: TrainingArguments) -> None:
        """The run's metrics, decoding figures, vLLM engine and completion rows, empty."""
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
        return {name: scored_mean(values) for name, values in merged.items()}

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
    # Stage 1: the method's `stage_one` (`a2po.stage_one.StageOne`), the same public face on both trainers

    @property
    def samples_stage_one(self) -> bool:
        """Whether training needs stage 1: A*-PO always, GRPO only to select prompts by pass rate
        (`a2po.settings.samples_stage_one`)."""
        return samples_stage_one(self._method, self.args)

    @property
    def value_tables(self) -> dict[str, Dataset]:
        """The V* tables estimated (or read) so far, by split."""
        return self.stage_one.tables

    def value_fingerprint(self) -> str:
        """What the stage-1 samples depend on (not beta1: V* is recomputed from the stored rewards)."""
        return self.stage_one.fingerprint()

    def set_optimal_values(self, records: Dataset | Sequence[dict[str, Any]], split: str = "train") -> None:
        """Give stage 1 rows it already has (e.g. from a database), with their rewards and completions: those
        prompts are not sampled again, and V* is recomputed from the rewards with this run's beta1."""
        self.stage_one.set_known(records, split)

    def estimate_optimal_values(self, dataset: Dataset | None = None, split: str = "train") -> Dataset:
        """Stage 1: the V* table (see `a2po.values.VALUE_COLUMNS`) for `dataset` (default: the train set).

        Rows with a `v_star` value, or already in `values_path` or this run's saved table, are not sampled again.
        Under several processes each samples its shard and every process gets the whole table.
        """
        return self.stage_one.estimate(dataset, split)

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
            metrics.update(evaluate_split(self, prepared, split, prefix, context))
        self.control.should_training_stop = stop_before
        metrics[f"{metric_key_prefix}_runtime"] = round(time.time() - start, 4)
        counters = self.run_counters
        counters.eval_seconds += time.time() - start
        # Where on the run's clock this evaluation stands: comparisons draw accuracy against these.
        metrics.update(counters.clock_metrics())
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
            logs = {**logs, **averaged, **self.run_counters.clock_metrics(), "peak_memory_gb": round(peak, 4)}
            self._metrics.clear()
        logs = {k: (v if not isinstance(v, float) or math.isfinite(v) else float("nan")) for k, v in logs.items()}
        super().log(logs, start_time)
        if "loss" in logs and self.args.log_completions:
            self._write_completions()


def _finite_or_none(value: torch.Tensor) -> float | None:
    """A reward as stored: None where the function did not apply (NaN)."""
    number = float(value)
    return number if math.isfinite(number) else None


def _identity_collator(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return rows
