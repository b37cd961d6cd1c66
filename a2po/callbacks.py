"""Observer interface: how outside code (a dashboard, a logger, a test) watches an A*-PO or GRPO run.

`A2POCallback` is a `transformers.TrainerCallback` with a few extra events. Pass instances in
`A2POTrainer(callbacks=[...])` or `GRPOTrainer(callbacks=[...])`. Standard Trainer events keep their usual meaning:

- `on_log(args, state, control, logs=...)`: training metrics every `logging_steps`, at step `state.global_step`.
  Both trainers log `loss, reward, reward_std, accuracy, completion_length, completion_clipped_frac, kl`,
  `rewards/<func>`, `frac_nonfinite_loss` (the share of the window's micro-batches whose loss was NaN or inf, which
  the Trainer's `logging_nan_inf_filter` hides from `loss`), `completion_tokens` (completion tokens sampled in
  training so far, stage 1 not counted; a resumed run continues the count) and `peak_memory_gb` (the process's
  peak RSS in GiB on a CPU, the CUDA allocator's peak on a GPU). A*-PO adds `v_star, advantage, implicit_reward,
  log_ratio` (its `kl` is the mean sequence log-ratio log pi/pi_ref, GRPO's the per-token estimate of TRL) and
  stage-1 summaries as `values/<split>/...` (with `runtime` and `completion_tokens`); GRPO adds
  `frac_reward_zero_std` and `clip_ratio/...` (TRL's names), and logs `kl` only when beta > 0.
- `on_evaluate(args, state, control, metrics=...)`: `eval_accuracy`, `eval_reward`, `eval_completion_length`,
  and for A*-PO `eval_loss`, `eval_v_star`, ...
- `on_step_end`: progress of stage 2 is `state.global_step / state.max_steps`.
- `on_save`: a checkpoint was written under `args.output_dir`.
- Setting `control.should_training_stop = True` from any event stops stage 2 after the current step, stage 1
  after the current batch (then `estimate_optimal_values` raises `StageInterrupted`; the values estimated so far
  were already delivered through `on_values_batch`), and evaluation after the current batch (then `evaluate`
  raises `StageInterrupted`).
- Under several processes (`accelerate launch`) every process has its callbacks and they see the same events
  and data: `on_values_batch` and `on_samples` carry the rows of every process (gathered), and a stop (or a
  checkpoint, a log, an evaluation) asked by the callbacks of any one process happens on all of them at the same
  batch or step. A recorder that writes somewhere should write from the main process only.

A*-PO events (all arguments are keyword arguments; the library never imports a database or UI):

- `on_values_begin(split, num_prompts, num_pending)`: stage 1 starts for `split` ("train", "eval", or the
  name of an eval set); `num_pending` prompts still need sampling (the others carried a V* already).
- `on_values_batch(split, records, done, total)`: one stage-1 batch finished (of every process); `records` holds
  one dict per prompt with the keys of `VALUE_COLUMNS` (see `a2po.values`): `prompt_id`, `prompt`, `prompt_text`,
  `v_star`, `rewards` (N floats), `completions` (N strings), `num_correct`, `filtered`.
- `on_values_end(split, values, summary)`: `values` is the full table (`datasets.Dataset`) for the split;
  `summary` holds `num_prompts`, `num_filtered`, `mean_v_star`, `pass_at_1`, `pass_at_n`, `num_value_samples`.
- `on_samples(samples)`: the completions of one training step (or evaluation), one dict per completion with
  `step`, `split` ("train" or the eval split), `prompt_id`, `sample_index` (0 for A*-PO and evaluation; 0..G-1
  for GRPO's G completions of a prompt), `prompt_text` (what the model saw), `question` (what the user asked: the
  last user message), `completion`, `reward`, `advantage`, `completion_length`, and `v_star`, `implicit_reward`
  (A*-PO's; None for GRPO).
- `on_evaluate_batch(split, done, total)`: one evaluation batch finished: `done` of `total` prompts of `split`.
"""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState


class StageInterrupted(RuntimeError):
    """Raised when a callback asked to stop during stage 1; what was estimated so far is kept."""


class A2POCallback(TrainerCallback):
    """Base class for observers of an A*-PO run. Override only the events you need."""

    def on_values_begin(self, args, state, control, *, split: str, num_prompts: int, num_pending: int, **kwargs):
        pass

    def on_values_batch(self, args, state, control, *, split: str, records: list[dict[str, Any]], done: int,
                        total: int, **kwargs):
        pass

    def on_values_end(self, args, state, control, *, split: str, values, summary: dict[str, float], **kwargs):
        pass

    def on_samples(self, args, state, control, *, samples: list[dict[str, Any]], **kwargs):
        pass

    def on_evaluate_batch(self, args, state, control, *, split: str, done: int, total: int, **kwargs):
        pass


class RunCounters(TrainerCallback, ExportableState):
    """Counters a resumed run continues from: kept in each checkpoint's `trainer_state.json` (`stateful_callbacks`,
    saved by the Trainer with every checkpoint) and read back when training starts from one."""

    def __init__(self, completion_tokens: int = 0) -> None:
        self.completion_tokens = completion_tokens

    def state(self) -> dict[str, Any]:
        return {"args": {}, "attributes": {"completion_tokens": self.completion_tokens}}

    def on_train_begin(self, args, state, control, **kwargs):
        saved = state.stateful_callbacks.get(type(self).__name__, {})
        saved = saved[-1] if isinstance(saved, list) else saved
        resumed = state.global_step > 0  # a fresh run starts at 0 (a second `train()` call too)
        self.completion_tokens = saved.get("attributes", {}).get("completion_tokens", 0) if resumed else 0
        # A checkpoint from before this counter has no entry, and the Trainer's save expects one.
        state.stateful_callbacks[type(self).__name__] = self.state()


class TimedCheckpoints(TrainerCallback):
    """Save a checkpoint whenever `seconds` of training passed since the last save (or the start), on top of
    `save_steps`: a run killed at any moment loses at most that much work, however long its steps are.
    `A2POTrainer` adds it when `A2POConfig.save_every_seconds` is set."""

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"seconds must be > 0, got {seconds}.")
        self.seconds = seconds
        self._last = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self._last = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() - self._last >= self.seconds:
            control.should_save = True

    def on_save(self, args, state, control, **kwargs):
        self._last = time.monotonic()
