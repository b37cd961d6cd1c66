"""Observer interface: how outside code (a dashboard, a logger, a test) watches an A*-PO or GRPO run.

`A2POCallback` is a `transformers.TrainerCallback` with a few extra events. Pass instances in
`A2POTrainer(callbacks=[...])` or `GRPOTrainer(callbacks=[...])`. Standard Trainer events keep their usual meaning:

- `on_log(args, state, control, logs=...)`: training metrics every `logging_steps`, at step `state.global_step`.
  Both trainers log `loss, reward, reward_std, accuracy, completion_length, completion_clipped_frac, kl`,
  `rewards/<func>`, `frac_nonfinite_loss` (the share of the window's micro-batches whose loss was NaN or inf, which
  the Trainer's `logging_nan_inf_filter` hides from `loss`), `completion_tokens` (completion tokens sampled in
  training so far, stage 1 not counted; a resumed run continues the count), the run's clock `train_seconds` and
  `eval_seconds` (`RunCounters`: time in training steps and in evaluations, continued by a resumed run; loading and
  pauses never count) and `peak_memory_gb` (the process's
  peak RSS in GiB on a CPU, the CUDA allocator's peak on a GPU). A*-PO adds `v_star, advantage, implicit_reward,
  log_ratio` (its `kl` is the mean sequence log-ratio log pi/pi_ref, GRPO's the per-token estimate of TRL) and
  stage-1 summaries as `values/<split>/...` (with `runtime` and `completion_tokens`); GRPO adds
  `frac_reward_zero_std` and `clip_ratio/...` (TRL's names), and logs `kl` only when beta > 0.
- `on_evaluate(args, state, control, metrics=...)`: `eval_accuracy`, `eval_reward`, `eval_completion_length`,
  and for A*-PO `eval_loss`, `eval_v_star`, ...; with the run's clock at that moment (`completion_tokens`,
  `train_seconds`, `eval_seconds`), so accuracy can be drawn against training time or tokens.
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
- `on_values_batch(split, records, done, total, seconds, completion_tokens, batch_seconds, batch_tokens)`: one
  stage-1 batch finished (of every process); `records` holds one dict per prompt with the keys of `VALUE_COLUMNS`
  (see `a2po.values`): `prompt_id`, `prompt`, `prompt_text`, `v_star`, `rewards` (N floats), `completions` (N
  strings), `num_correct`, `filtered`; `seconds` and `completion_tokens` are what the split's stage 1 has cost so
  far (`RunCounters`), earlier starts included when the caller restored them; `batch_seconds` and `batch_tokens`
  what this batch cost.
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

import math
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
                        total: int, seconds: float = 0.0, completion_tokens: int = 0, batch_seconds: float = 0.0,
                        batch_tokens: int = 0, **kwargs):
        pass

    def on_values_end(self, args, state, control, *, split: str, values, summary: dict[str, float], **kwargs):
        pass

    def on_samples(self, args, state, control, *, samples: list[dict[str, Any]], **kwargs):
        pass

    def on_evaluate_batch(self, args, state, control, *, split: str, done: int, total: int, **kwargs):
        pass


class RunCounters(TrainerCallback, ExportableState):
    """The run's own clock and counters, which a resumed run continues: kept in each checkpoint's
    `trainer_state.json` (`stateful_callbacks`, saved by the Trainer with every checkpoint) and read back when
    training starts from one.

    - `completion_tokens`: completion tokens sampled in stage 2 (training).
    - `train_seconds`: seconds spent in stage-2 optimizer steps (sampling, scoring, forward, backward, update), from
      each step's `on_step_begin` to its `on_step_end`: loading, start-up, checkpoints, evaluations and any pause
      between a stop and a resume are not in it.
    - `eval_seconds`: seconds spent in evaluations (`evaluate()`).
    - `step_seconds`: the mean seconds of this process's steps after its first (None before the second): the
      steady rate, without the first step's one-off costs (allocations, kernel selection), for estimates of the
      time left. Not kept in checkpoints: each start has its own first step.
    - `values_seconds[split]`, `values_tokens[split]`: A*-PO's stage 1, seconds spent sampling and scoring reference
      completions and their tokens, per split. Rows found already stored cost nothing and add nothing; a caller that
      resumes a stage 1 from stored rows hands in what its earlier starts spent (`restore_values`), and a caller
      that reuses rows another run sampled hands in what sampling them cost, so equal time stays equal.
    - `evaluation_due`: the step whose evaluation was asked for (every `eval_steps`, on the time grid, at the end of
      the budget) and has not run: a checkpoint saved then (a chunk that left the evaluation for the next one) says
      so, and a caller that resumes from it can have that evaluation run first (`evaluate_on_resume`).

    Together they are the run's training time, as comparisons read it: `values_seconds["train"] + train_seconds`.
    """

    def __init__(self, completion_tokens: int = 0) -> None:
        self.completion_tokens = completion_tokens
        self.train_seconds = 0.0
        self.eval_seconds = 0.0
        self.values_seconds: dict[str, float] = {}
        self.values_tokens: dict[str, int] = {}
        self.evaluation_due: int | None = None
        self._step_started: float | None = None
        self._steps_timed = 0  # steps of this process timed so far
        self._steady_seconds = 0.0  # their seconds, the first one's left out

    @property
    def step_seconds(self) -> float | None:
        return self._steady_seconds / (self._steps_timed - 1) if self._steps_timed > 1 else None

    def state(self) -> dict[str, Any]:
        return {"args": {}, "attributes": {
            "completion_tokens": self.completion_tokens, "train_seconds": round(self.train_seconds, 4),
            "eval_seconds": round(self.eval_seconds, 4), "values_seconds": dict(self.values_seconds),
            "values_tokens": dict(self.values_tokens), "evaluation_due": self.evaluation_due}}

    @classmethod
    def saved(cls, stateful_callbacks: dict[str, Any]) -> dict[str, Any]:
        """The counters kept in a checkpoint's trainer state (its `stateful_callbacks`; {} when it has none)."""
        saved = stateful_callbacks.get(cls.__name__, {})
        saved = saved[-1] if isinstance(saved, list) else saved
        return saved.get("attributes", {})

    @staticmethod
    def saved_clock(attributes: dict[str, Any]) -> float:
        """`clock` as kept in a checkpoint (`saved`)."""
        return float((attributes.get("values_seconds") or {}).get("train", 0.0)) + float(
            attributes.get("train_seconds", 0.0))

    def restore_values(self, split: str, seconds: float, tokens: int) -> None:
        """What earlier starts of this run spent on `split`'s stage 1 (e.g. read back from a store)."""
        self.values_seconds[split] = max(self.values_seconds.get(split, 0.0), float(seconds))
        self.values_tokens[split] = max(self.values_tokens.get(split, 0), int(tokens))

    def add_values(self, split: str, seconds: float, tokens: int) -> None:
        self.values_seconds[split] = self.values_seconds.get(split, 0.0) + seconds
        self.values_tokens[split] = self.values_tokens.get(split, 0) + int(tokens)

    def on_train_begin(self, args, state, control, **kwargs):
        self.load(state)

    def load(self, state) -> None:
        """Continue from the counters saved in `state` (a `TrainerState` read from a checkpoint), or start training's
        counters at 0 for a fresh run (global step 0); stage 1's are kept either way."""
        attributes = self.saved(state.stateful_callbacks)
        if state.global_step > 0:  # resumed from a checkpoint; a fresh run starts at 0 (a second `train()` too)
            self.completion_tokens = int(attributes.get("completion_tokens", 0))
            self.train_seconds = float(attributes.get("train_seconds", 0.0))
            self.eval_seconds = float(attributes.get("eval_seconds", 0.0))
            self.evaluation_due = attributes.get("evaluation_due")
            for split, seconds in (attributes.get("values_seconds") or {}).items():
                self.restore_values(split, seconds, (attributes.get("values_tokens") or {}).get(split, 0))
        else:
            self.completion_tokens, self.train_seconds, self.eval_seconds = 0, 0.0, 0.0
            self.evaluation_due = None
        self._step_started = None
        self._steps_timed, self._steady_seconds = 0, 0.0
        # A checkpoint from before these counters has no entry, and the Trainer's save expects one.
        state.stateful_callbacks[type(self).__name__] = self.state()

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_started = time.perf_counter()

    @property
    def clock(self) -> float:
        """The run's training time: the train split's stage 1 and the training steps."""
        return self.values_seconds.get("train", 0.0) + self.train_seconds

    def on_step_end(self, args, state, control, **kwargs):
        if self._step_started is None:
            return
        before = self.clock
        seconds = time.perf_counter() - self._step_started
        self.train_seconds += seconds
        self._step_started = None
        if self._steps_timed:
            self._steady_seconds += seconds
        self._steps_timed += 1
        budget, every = getattr(args, "max_train_seconds", None), getattr(args, "eval_every_seconds", None)
        if every and math.floor(self.clock / every) > math.floor(before / every):
            control.should_evaluate = True
        if budget and self.clock >= budget:
            control.should_training_stop = True
            control.should_evaluate = True  # the accuracy at the end of the budget
            control.should_save = True
        # Callbacks after this one may still leave the evaluation out (a chunk near its deadline); `on_evaluate`
        # clears it when it runs, so a checkpoint saved after this step tells whether it did.
        self.evaluation_due = state.global_step if control.should_evaluate else None

    def on_evaluate(self, args, state, control, **kwargs):
        self.evaluation_due = None


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
