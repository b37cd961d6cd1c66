"""Observer interface: how outside code (a dashboard, a logger, a test) watches an A*-PO or GRPO run.

`A2POCallback` is a `transformers.TrainerCallback` with A*-PO's extra events, `RunCounters` the run's own clock
(kept in checkpoints, continued on resume), `TimedCheckpoints` a checkpoint every so many seconds. Every event, its
arguments and the metrics each trainer logs: docs/callbacks.md.
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
                        batch_tokens: int = 0, flops: float = 0.0, batch_flops: float = 0.0, **kwargs):
        pass

    def on_values_end(self, args, state, control, *, split: str, values, summary: dict[str, float], **kwargs):
        pass

    def on_samples(self, args, state, control, *, samples: list[dict[str, Any]], **kwargs):
        pass

    def on_evaluate_batch(self, args, state, control, *, split: str, done: int, total: int, **kwargs):
        pass


class RunCounters(TrainerCallback, ExportableState):
    """The run's own clock and counters, which a resumed run continues: kept in each checkpoint's
    `trainer_state.json` (`stateful_callbacks`) and read back when training starts from one. What each counter
    counts: docs/callbacks.md, "The run's clock"."""

    def __init__(self, completion_tokens: int = 0) -> None:
        self.completion_tokens = completion_tokens
        self.train_seconds = 0.0
        self.eval_seconds = 0.0
        self.train_flops = 0.0
        self.values_seconds: dict[str, float] = {}
        self.values_tokens: dict[str, int] = {}
        self.values_flops: dict[str, float] = {}
        self.evaluation_due: int | None = None
        # The share of a budget's training part (what stage 1 leaves of it) this run may spend: a rung of a
        # successive-halving sweep stops early (`budget_share` < 1), its evaluations on the whole budget's grid.
        self.budget_share = 1.0
        self._step_started: float | None = None
        self._steps_timed = 0  # steps of this process timed so far
        self._steady_seconds = 0.0  # their seconds, the first one's left out
        self._step_flops = 0.0  # the compute of the step under way, for the evaluation grid of `eval_every_flops`

    @property
    def step_seconds(self) -> float | None:
        return self._steady_seconds / (self._steps_timed - 1) if self._steps_timed > 1 else None

    def state(self) -> dict[str, Any]:
        return {"args": {}, "attributes": {
            "completion_tokens": self.completion_tokens, "train_seconds": round(self.train_seconds, 4),
            "eval_seconds": round(self.eval_seconds, 4), "train_flops": self.train_flops,
            "values_seconds": dict(self.values_seconds), "values_tokens": dict(self.values_tokens),
            "values_flops": dict(self.values_flops), "evaluation_due": self.evaluation_due}}

    @classmethod
    def saved(cls, stateful_callbacks: dict[str, Any]) -> dict[str, Any]:
        """The counters kept in a checkpoint's trainer state (its `stateful_callbacks`; {} when it has none)."""
        saved = stateful_callbacks.get(cls.__name__, {})
        saved = saved[-1] if isinstance(saved, list) else saved
        return saved.get("attributes", {})

    def restored(self, stateful_callbacks: dict[str, Any]) -> RunCounters:
        """New counters holding what a checkpoint's trainer state kept (its `stateful_callbacks`), with this run's
        `budget_share`: what the run had spent at that checkpoint."""
        counters = RunCounters()
        counters.budget_share = self.budget_share
        state = type("SavedState", (), {"stateful_callbacks": dict(stateful_callbacks), "global_step": 1})()
        counters.load(state)
        return counters

    def restore_values(self, split: str, seconds: float, tokens: int, flops: float = 0.0) -> None:
        """What earlier starts of this run spent on `split`'s stage 1 (e.g. read back from a store), or what sampling
        the V* rows it reuses cost."""
        self.values_seconds[split] = max(self.values_seconds.get(split, 0.0), float(seconds))
        self.values_tokens[split] = max(self.values_tokens.get(split, 0), int(tokens))
        self.values_flops[split] = max(self.values_flops.get(split, 0.0), float(flops))

    def add_values(self, split: str, seconds: float, tokens: int, flops: float = 0.0) -> None:
        self.values_seconds[split] = self.values_seconds.get(split, 0.0) + seconds
        self.values_tokens[split] = self.values_tokens.get(split, 0) + int(tokens)
        self.values_flops[split] = self.values_flops.get(split, 0.0) + float(flops)

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
            self.train_flops = float(attributes.get("train_flops", 0.0))
            self.evaluation_due = attributes.get("evaluation_due")
            for split, seconds in (attributes.get("values_seconds") or {}).items():
                self.restore_values(split, seconds, (attributes.get("values_tokens") or {}).get(split, 0),
                                    (attributes.get("values_flops") or {}).get(split, 0.0))
        else:
            self.completion_tokens, self.train_seconds, self.eval_seconds, self.train_flops = 0, 0.0, 0.0, 0.0
            self.evaluation_due = None
        self._step_started, self._step_flops = None, 0.0
        self._steps_timed, self._steady_seconds = 0, 0.0
        # A checkpoint from before these counters has no entry, and the Trainer's save expects one.
        state.stateful_callbacks[type(self).__name__] = self.state()

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_started = time.perf_counter()

    def add_train_flops(self, flops: float) -> None:
        """The compute of the optimizer step under way (every process's; the trainer counts it)."""
        self.train_flops += flops
        self._step_flops += flops

    @property
    def clock(self) -> float:
        """The run's training time: the train split's stage 1 and the training steps."""
        return self.values_seconds.get("train", 0.0) + self.train_seconds

    @property
    def compute(self) -> float:
        """The run's compute in FLOPs (`a2po.compute`): the train split's stage 1 and the training steps."""
        return self.values_flops.get("train", 0.0) + self.train_flops

    def clock_metrics(self) -> dict[str, float]:
        """The run's clock as the trainers log it with every training log and evaluation."""
        clock = {"completion_tokens": self.completion_tokens, "train_seconds": round(self.train_seconds, 4),
                 "eval_seconds": round(self.eval_seconds, 4), "train_flops": self.train_flops,
                 "compute_flops": self.compute}
        if self.step_seconds is not None:
            clock["step_seconds"] = round(self.step_seconds, 4)
        return clock

    def budget_reached(self, args) -> bool:
        """Whether a budget of `args` (`max_train_seconds`, `max_train_flops`), or this run's share of it
        (`budget_share`: of what the train split's stage 1 leaves), is spent."""
        for budget, used, stage_one in ((getattr(args, "max_train_seconds", None), self.clock,
                                         self.values_seconds.get("train", 0.0)),
                                        (getattr(args, "max_train_flops", None), self.compute,
                                         self.values_flops.get("train", 0.0))):
            if budget and used >= stage_one + self.budget_share * max(budget - stage_one, 0.0):
                return True
        return False

    def on_step_end(self, args, state, control, **kwargs):
        if self._step_started is None:
            return
        before, computed = self.clock, self.compute - self._step_flops
        seconds = time.perf_counter() - self._step_started
        self.train_seconds += seconds
        self._step_started = None
        if self._steps_timed:
            self._steady_seconds += seconds
        self._steps_timed += 1
        for every, now, then in ((getattr(args, "eval_every_seconds", None), self.clock, before),
                                 (getattr(args, "eval_every_flops", None), self.compute, computed)):
            if every and math.floor(now / every) > math.floor(then / every):
                control.should_evaluate = True
        self._step_flops = 0.0
        if self.budget_reached(args):
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
