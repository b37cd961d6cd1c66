"""Observer interface: how outside code (a dashboard, a logger, a test) watches an A*-PO run.

`A2POCallback` is a `transformers.TrainerCallback` with four extra events. Pass instances in
`A2POTrainer(callbacks=[...])`. Standard Trainer events keep their usual meaning:

- `on_log(args, state, control, logs=...)`: training metrics every `logging_steps`
  (`loss`, `reward`, `v_star`, `advantage`, `implicit_reward`, `log_ratio`, `completion_length`, ...),
  at step `state.global_step`; stage-1 summaries are logged as `values/<split>/...`.
- `on_evaluate(args, state, control, metrics=...)`: `eval_accuracy`, `eval_loss`, `eval_reward`, ...
- `on_step_end`: progress of stage 2 is `state.global_step / state.max_steps`.
- `on_save`: a checkpoint was written under `args.output_dir`.
- Setting `control.should_training_stop = True` from any event stops stage 2 after the current step, and
  stage 1 after the current batch (then `estimate_optimal_values` raises `StageInterrupted`; the values
  estimated so far were already delivered through `on_values_batch`).
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
- `on_samples(samples)`: the stage-2 completions of one training step, one dict per prompt with `step`,
  `prompt_id`, `prompt_text` (what the model saw), `question` (what the user asked: the last user message),
  `completion`, `reward`, `v_star`, `advantage`, `implicit_reward`,
  `completion_length`, and `split` ("train" or "eval").
"""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback


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
