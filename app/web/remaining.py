"""What is left of a run: its clock (`training_seconds`, `stage1_seconds`, `clock_from_metrics`) and the time it
still needs by part (`estimate_remaining`), for the Runs list, the Run page and /status."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from a2po.settings import METHODS, config_default, samples_stage_one
from app.studies.comparison import format_duration
from app.web.common import elapsed_seconds
from storage.lifecycle import UNFINISHED


def training_seconds(clock: Mapping[str, float] | None) -> float | None:
    """The run's training time as comparisons count it: stage 1 of the train split plus the training steps
    (evaluations, loading and pauses left out); None before anything was measured."""
    clock = clock or {}
    parts = [clock.get("values/train/runtime"), clock.get("train_seconds")]
    return None if all(p is None for p in parts) else sum(p or 0.0 for p in parts)


def stage1_seconds(clock: Mapping[str, float] | None) -> float | None:
    """Seconds spent in stage 1 over every split (train and held-out); None when the run has none recorded."""
    spent = [v for k, v in (clock or {}).items() if k.startswith("values/") and k.endswith("/runtime")]
    return sum(spent) if spent else None


def clock_from_metrics(latest: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """A run's clock (the keys of `Store.run_clocks`) from its `Store.latest_metrics`, with what the Run page can
    afford to read besides: `step` (the step the latest `train_seconds` was logged at), `epoch` (at that step) and
    `eval_runtime` (the latest evaluation's seconds)."""
    clock = {name: float(row["value"]) for name, row in latest.items() if row.get("value") is not None and (
        name in ("train_seconds", "eval_seconds", "eval_runtime", "step_seconds")
        or name.startswith("values/") and name.endswith("/runtime"))}
    trained = latest.get("train_seconds")
    if trained is not None and trained.get("value") is not None:
        clock["step"] = float(trained["step"])
        epoch = latest.get("epoch") or {}
        if epoch.get("step") == trained["step"] and epoch.get("value") is not None:
            clock["epoch"] = float(epoch["value"])
    return clock


@dataclass(frozen=True)
class Remaining:
    """What a run still needs, in seconds of its own clock, by part: A*-PO's stage 1 (both splits), the training
    steps and the evaluations still to come. None: a part still to come whose rate nothing has measured yet."""

    stage1: float | None = 0.0
    training: float | None = 0.0
    evaluations: float | None = 0.0

    @property
    def seconds(self) -> float | None:
        """The whole of it, or None while a part is unknown."""
        parts = (self.stage1, self.training, self.evaluations)
        return None if None in parts else sum(parts)

    @property
    def known(self) -> float:
        """The parts measured so far: a lower bound of what is left."""
        return sum(p for p in (self.stage1, self.training, self.evaluations) if p is not None)

    @property
    def unknown(self) -> list[str]:
        return [name for name, p in (("stage 1", self.stage1), ("training", self.training),
                                     ("evaluations", self.evaluations)) if p is None]

    def text(self) -> str:
        """`3m 05s`; `≥ 30s` when some part is not measured yet (the parts that are); `–` when nothing is."""
        if self.seconds is not None:
            return format_duration(self.seconds)
        return f"≥ {format_duration(self.known)}" if round(self.known) > 0 else "–"


UNKNOWN = Remaining(None, None, None)


def estimate_remaining(run: Mapping[str, Any], clock: Mapping[str, float] | None = None,
                       evaluations: int | None = None) -> Remaining:
    """The time a run still needs, from the rates its own clock measured (`a2po.callbacks.RunCounters`).

    Args:
        run: the run's row (`Store.get_run`): `status`, `stage`, `progress`, `action`, `value_counts` and the spec
            in `config` (method, dataset sizes, steps, evaluation settings).
        clock: the keys of `Store.run_clocks` (`train_seconds`, `eval_seconds`, `values/<split>/runtime`), and when
            known (`clock_from_metrics`) `step` (the step `train_seconds` was logged at), `epoch` (at that step) and
            `eval_runtime` (the latest evaluation's seconds).
        evaluations: how many evaluations the run has done, when the caller read them.

    The parts, each measured rate times what is left of it:
    - stage 1 (A*-PO's; GRPO's with a pass-rate band, of the train split only): per split (train: the dataset's
      `num_prompts`; held out: `eval_size`), the prompts without a row (`value_counts`) times
      `values/<split>/runtime` per row done; the held-out split takes the train split's rate until it has one of
      its own.
    - training: the steady `step_seconds` (else `train_seconds / step`) times the steps left. The steps planned are
      `max_steps`, else `num_train_epochs` times the steps per epoch (`step / epoch`); without a step (the Runs list
      reads only the clock), `train_seconds * (1 - progress) / progress`. A `max_train_seconds` budget caps it at
      what is left of the budget (stage 1 of the train split counts in it).
    - evaluations: those still to come (the step-0 one, one every `eval_steps` steps (a fraction < 1: of the
      planned steps), one each time the clock passes a multiple of `eval_every_seconds`, and the final one) times
      `eval_seconds` per evaluation done (else the latest `eval_runtime`).

    A finished run needs 0; a stopped, failed or interrupted one is unknown. A run with no clock at all (from
    before the clock existed) falls back to its current stage's progress over wall time."""
    status = run.get("status")
    if status not in UNFINISHED:
        return Remaining() if status == "finished" else UNKNOWN
    clock = clock or {}
    plan = _Plan.of(run)
    if not clock:
        return _wall_time_estimate(run) if plan.stage == "train" else UNKNOWN
    # GRPO samples a stage 1 only to select its training prompts: of the train split alone.
    samples = samples_stage_one(plan.method, plan.config, plan.action)
    stage1 = _stage1_left(plan, clock, train_only=plan.method != "a2po") if samples else 0.0
    if plan.action == "values":
        return Remaining(stage1, 0.0, 0.0)
    if plan.action == "evaluate":
        return Remaining(stage1, 0.0, _per_evaluation(clock, evaluations) if plan.eval_size else 0.0)
    # What the clock will still count of stage 1 before training: the train split's.
    before = _stage1_left(plan, clock, train_only=True) if samples else 0.0
    training, steps = _training_left(plan, clock, before)
    return Remaining(stage1, training, _evaluations_left(plan, clock, evaluations, training, steps, before))


@dataclass(frozen=True)
class _Plan:
    """What a run's row and spec say about the work planned."""

    method: str
    action: str
    stage: str | None
    progress: float
    counts: dict[str, int]
    dataset: dict[str, Any]
    eval_size: int
    config: dict[str, Any]

    @classmethod
    def of(cls, run: Mapping[str, Any]) -> _Plan:
        spec = run.get("config") or {}
        dataset = spec.get("dataset") or {}
        method = spec.get("method", "a2po")
        return cls(method=method if method in METHODS else "a2po",
                   action=run.get("action") or spec.get("action") or "train", stage=run.get("stage"),
                   progress=float(run.get("progress") or 0.0),
                   counts={k: int(v or 0) for k, v in (run.get("value_counts") or {}).items()}, dataset=dataset,
                   eval_size=int(dataset.get("eval_size") or 0), config=spec.get("config") or {})

    def setting(self, name: str) -> Any:
        return self.config[name] if name in self.config else config_default(name, self.method)

    def total_steps(self, clock: Mapping[str, float]) -> int | None:
        """Optimizer steps planned: `max_steps`, else the epochs times the steps per epoch the Trainer logged."""
        max_steps = int(self.setting("max_steps") or -1)
        if max_steps > 0:
            return max_steps
        step, epoch = clock.get("step") or 0.0, clock.get("epoch") or 0.0
        if step > 0 and epoch > 0:
            return max(int(step), math.ceil(float(self.setting("num_train_epochs")) * step / epoch - 1e-6))
        return None


@dataclass(frozen=True)
class _Steps:
    """How far training is: the steps done and planned where known, else only the fraction done."""

    done: float = 0.0
    total: int | None = None
    fraction: float | None = None


def _wall_time_estimate(run: Mapping[str, Any]) -> Remaining:
    """A run in training without a clock (from before it existed): its progress over wall time, which is all
    there is (loading and evaluations count as training); unknown before 1% of it."""
    elapsed, progress = elapsed_seconds(dict(run)), float(run.get("progress") or 0.0)
    if elapsed is None or progress <= 0.01:
        return UNKNOWN
    return Remaining(0.0, elapsed * (1 - progress) / progress, 0.0)


def _stage1_left(plan: _Plan, clock: Mapping[str, float], train_only: bool = False) -> float | None:
    """Seconds of stage 1 left, over both splits (`train_only`: the train split's, which the clock counts)."""
    if plan.stage in ("train", "eval"):
        return 0.0  # stage 1 is over before training or evaluation starts
    sizes = {} if plan.action == "evaluate" else {"train": plan.dataset.get("num_prompts")}
    if plan.eval_size and not train_only:
        sizes["eval"] = plan.eval_size
    order = list(sizes)
    left = 0.0
    for i, (split, size) in enumerate(sizes.items()):
        done = plan.counts.get(split, 0)
        if size is None:  # a file or hub dataset read whole: its size shows only as its stage 1 goes
            if any(plan.counts.get(later) for later in order[i + 1:]):
                continue  # a later split started: this one is done
            if plan.stage != "values" or not done or plan.progress <= 0:
                return None
            size = round(done / plan.progress)
        todo = max(0, int(size) - done)
        if todo:
            rate = _stage1_rate(plan, clock, split) or _stage1_rate(plan, clock, "train")
            if rate is None:
                return None
            left += todo * rate
    return left


def _stage1_rate(plan: _Plan, clock: Mapping[str, float], split: str) -> float | None:
    """Seconds per prompt of a split's stage 1 so far (rows reused from a shared V* set count as done for free)."""
    spent, done = clock.get(f"values/{split}/runtime") or 0.0, plan.counts.get(split, 0)
    return spent / done if spent > 0 and done > 0 else None


def _training_left(plan: _Plan, clock: Mapping[str, float], stage1: float | None) -> tuple[float | None, _Steps]:
    """Seconds of training steps left, and how far training is (`stage1`: the train split's stage 1 still to
    run)."""
    spent, step = clock.get("train_seconds") or 0.0, clock.get("step") or 0.0
    total = plan.total_steps(clock)
    left: float | None = None
    if step > 0:
        steps = _Steps(step, total)
        # The steady rate where the clock has one: the first step's one-off costs would inflate every estimate made
        # early in a run.
        rate = clock.get("step_seconds") or (spent / step if spent > 0 else None)
        if rate and total is not None:
            left = rate * max(0.0, total - step)
    elif plan.stage == "train" and plan.progress > 0:  # no step known (the Runs list reads only the clock)
        fraction = plan.progress
        steps = _Steps(fraction * total, total) if total else _Steps(fraction=fraction)
        if spent > 0:
            left = spent * (1 - fraction) / fraction
    else:
        steps = _Steps(0.0, total)
    budget = plan.setting("max_train_seconds")
    if budget and stage1 is not None:  # the budget counts stage 1 of the train split too
        used = (clock.get("values/train/runtime") or 0.0) + spent + stage1
        left = max(0.0, float(budget) - used) if left is None else min(left, max(0.0, float(budget) - used))
    return left, steps


def _evaluations_left(plan: _Plan, clock: Mapping[str, float], evaluations: int | None, training: float | None,
                      steps: _Steps, stage1: float | None) -> float | None:
    if not plan.eval_size:
        return 0.0
    if plan.stage == "eval":
        return _per_evaluation(clock, evaluations)  # the final one, under way
    started = bool(clock.get("eval_seconds"))  # the step-0 evaluation (or a later one) ran
    on_start = bool(plan.config.get("eval_on_start", True))  # the studio's default with a held-out set
    periodic = _periodic_evaluations(plan, steps)
    if periodic is None:
        return None
    done, to_come = int(on_start and started) + periodic[0], int(on_start and not started) + periodic[1] + 1
    every = plan.setting("eval_every_seconds")
    if every:  # on a grid of the clock
        if training is None or stage1 is None:
            return None
        now = (clock.get("values/train/runtime") or 0.0) + (clock.get("train_seconds") or 0.0)
        done += math.floor(now / every)
        to_come += max(0, math.floor((now + stage1 + training) / every) - math.floor(now / every))
    per = _per_evaluation(clock, evaluations or max(done, int(started)))
    return None if per is None else to_come * per


def _periodic_evaluations(plan: _Plan, steps: _Steps) -> tuple[int, int] | None:
    """(done, to come) of the evaluations due every `eval_steps` steps (or every epoch) before the last step; None
    when that needs the steps planned and they are not known yet."""
    strategy = str(plan.config.get("eval_strategy") or ("steps" if plan.setting("eval_steps") else "no")).lower()
    if "step" not in strategy and "epoch" not in strategy:
        return 0, 0
    if "epoch" in strategy:
        fraction = 1.0 / float(plan.setting("num_train_epochs"))
    else:
        every = float(plan.setting("eval_steps") or plan.setting("logging_steps") or 1)
        fraction = every if every < 1 else 0.0
        if not fraction:
            return None if steps.total is None else _every(int(every), steps.done, steps.total)
    if steps.total is not None:  # the Trainer evaluates every ceil(fraction * steps planned) steps
        return _every(max(1, math.ceil(fraction * steps.total)), steps.done, steps.total)
    planned = math.floor((1 - 1e-9) / fraction)
    done = min(planned, math.floor((steps.fraction or 0.0) / fraction + 1e-9))
    return done, planned - done


def _every(k: int, done: float, total: int) -> tuple[int, int]:
    """(done, to come) of the evaluations at multiples of `k` steps below `total`, `done` steps in."""
    past = int(done) // k
    return past, max(0, (total - 1) // k - past)


def _per_evaluation(clock: Mapping[str, float], evaluations: int | None) -> float | None:
    """Seconds of one evaluation: `eval_seconds` over the evaluations done, else the latest one's runtime."""
    spent = clock.get("eval_seconds") or 0.0
    if spent > 0 and evaluations:
        return spent / evaluations
    return clock.get("eval_runtime") or None
