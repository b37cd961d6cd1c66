"""The remaining-time estimate (`app.web.remaining.estimate_remaining`) on hand-computed run rows: stage 1 of both
splits, training steps and the evaluations to come, each from the rate the run's clock measured; "–" or a lower
bound where a rate is not measured yet. Also the Runs list's and the Run page's times, and /status's clock."""

from __future__ import annotations

import time

import pytest

from app.web.api import clock_summary
from app.web.pages.run.header import header
from app.web.pages.runs import runs_frame
from app.web.remaining import Remaining, clock_from_metrics, estimate_remaining, stage1_seconds, training_seconds


def row(stage: str | None = "train", progress: float = 0.0, counts: dict | None = None, status: str = "running",
        action: str = "train", method: str = "a2po", dataset: dict | None = None, **config) -> dict:
    """A run row as `Store.get_run` returns it."""
    spec = {"action": action, "dataset": {"source": "arithmetic", "num_prompts": 100, "eval_size": 20,
                                          **(dataset or {})}, "config": config}
    if method != "a2po":
        spec["method"] = method
    return {"id": 1, "name": "r", "action": action, "status": status, "stage": stage, "progress": progress,
            "value_counts": counts or {}, "config": spec, "started_at": time.time() - 100, "finished_at": None,
            "model": "m", "dataset": "d", "created_at": time.time() - 120, "owner": None, "run": None}


def test_stage_one_of_both_splits_at_the_measured_rate():
    # 40 of 100 train prompts in 20 s: 0.5 s a prompt for the 60 left and the 20 held-out ones (no rate of their
    # own yet); training has no measured rate: a lower bound, not a guess.
    run = row("values", 0.4, {"train": 40}, max_steps=50)
    estimate = estimate_remaining(run, {"values/train/runtime": 20.0})
    assert estimate == Remaining(stage1=40.0, training=None, evaluations=None)
    assert estimate.seconds is None and estimate.text() == "≥ 40s"
    # The held-out split, 10 of 20 done in 2 s: its own rate, 0.2 s a prompt.
    run = row("values", 0.5, {"train": 100, "eval": 10}, max_steps=50)
    assert estimate_remaining(run, {"values/train/runtime": 50.0, "values/eval/runtime": 2.0}).stage1 == \
        pytest.approx(2.0)


def test_training_and_evaluations_from_the_step_and_the_clock():
    # Step 10 of 50 in 20 s: 2 s a step, 40 steps left = 80 s. Evaluations every 10 steps: done at 0 and 10 (6 s,
    # 3 s each); to come at 20, 30, 40 and the final one at 50 = 12 s.
    run = row("train", 0.2, {"train": 100, "eval": 20}, max_steps=50, eval_steps=10)
    clock = {"values/train/runtime": 50.0, "values/eval/runtime": 4.0, "train_seconds": 20.0, "eval_seconds": 6.0,
             "step": 10.0}
    for evaluations in (2, None):  # counted by the caller, or from the plan
        estimate = estimate_remaining(run, clock, evaluations)
        assert estimate == Remaining(0.0, pytest.approx(80.0), pytest.approx(12.0))
        assert estimate.seconds == pytest.approx(92.0) and estimate.text() == "1m 32s"


def test_epochs_planned_from_the_logged_epoch_and_the_runs_list_from_progress_alone():
    # 2 epochs; step 6 at epoch 0.25: 24 steps an epoch, 48 planned, 42 left at 2 s = 84 s. Evaluations every
    # quarter of the run (every 12 steps): at 12, 24, 36 and the final one, 1.5 s each (the step-0 one took 1.5 s).
    run = row("train", 6 / 48, {"train": 100, "eval": 20}, num_train_epochs=2.0, eval_steps=0.25)
    clock = {"values/train/runtime": 50.0, "train_seconds": 12.0, "eval_seconds": 1.5}
    on_page = estimate_remaining(run, {**clock, "step": 6.0, "epoch": 0.25})
    assert (on_page.training, on_page.evaluations) == (pytest.approx(84.0), pytest.approx(6.0))
    # The Runs list reads no step: 12 s for 1/8 of the run, 7/8 to go; the same quarters of the run to evaluate.
    in_list = estimate_remaining(run, clock)
    assert (in_list.training, in_list.evaluations) == (pytest.approx(84.0), pytest.approx(6.0))
    # Every 5 steps with the steps planned unknown: the evaluations to come are not known, training is.
    unknown = estimate_remaining(row("train", 6 / 48, {"train": 100}, eval_steps=5), clock)
    assert unknown.evaluations is None and unknown.text() == "≥ 1m 24s"


def test_a_time_budget_caps_training_and_adds_evaluations_on_its_grid():
    # 30 s of stage 1 and 40 s of steps used of a 100 s budget: 30 s left (the steps alone would need 360 s). The
    # clock passes 75 and 100 on the way (every 25 s): 2 evaluations, then the final one, 2 s each (4 s for 2).
    run = row("train", 0.1, {"train": 100, "eval": 20}, max_steps=200, max_train_seconds=100,
              eval_every_seconds=25)
    clock = {"values/train/runtime": 30.0, "train_seconds": 40.0, "eval_seconds": 4.0, "step": 20.0}
    estimate = estimate_remaining(run, clock, evaluations=2)
    assert (estimate.training, estimate.evaluations) == (pytest.approx(30.0), pytest.approx(6.0))


def test_grpo_has_no_stage_one_and_no_held_out_set_means_no_evaluations():
    run = row("train", 0.5, method="grpo", dataset={"eval_size": 0}, max_steps=20)
    estimate = estimate_remaining(run, {"train_seconds": 30.0, "step": 10.0})
    assert estimate == Remaining(0.0, pytest.approx(30.0), 0.0)


def test_grpo_with_a_pass_rate_band_has_a_stage_one_of_its_train_split():
    # 40 of 100 train prompts in 20 s: 30 s for the 60 left; the held-out split has no stage 1 in a GRPO run.
    run = row("values", 0.4, {"train": 40}, method="grpo", pass_rate_band=[0.125, 0.875], max_steps=20)
    estimate = estimate_remaining(run, {"values/train/runtime": 20.0})
    assert estimate.stage1 == pytest.approx(30.0) and estimate.training is None


def test_the_steady_step_rate_leaves_the_first_steps_one_off_costs_out():
    # 3 steps in 12 s, of which the first took 8 s: the steady rate is 2 s a step, so 17 steps left need 34 s, not
    # the 68 s that 12 s / 3 steps would say.
    run = row("train", 0.15, method="grpo", dataset={"eval_size": 0}, max_steps=20)
    estimate = estimate_remaining(run, {"train_seconds": 12.0, "step": 3.0, "step_seconds": 2.0})
    assert estimate.training == pytest.approx(34.0)


def test_the_counters_time_the_steady_rate_from_each_starts_second_step(monkeypatch):
    from transformers import TrainerControl, TrainerState

    from a2po.callbacks import RunCounters
    now = [0.0]
    monkeypatch.setattr("a2po.callbacks.time.perf_counter", lambda: now[0])
    counters, state, control = RunCounters(), TrainerState(), TrainerControl()
    counters.on_train_begin(None, state, control)
    for seconds in (8.0, 2.0, 3.0):
        counters.on_step_begin(None, state, control)
        now[0] += seconds
        counters.on_step_end(None, state, control)
        state.global_step += 1
    assert (counters.train_seconds, counters.step_seconds) == (13.0, 2.5)
    state.stateful_callbacks["RunCounters"] = counters.state()  # what a checkpoint keeps
    counters.load(state)  # a new start (resumed): its first step is a warm-up again, the total carries on
    assert counters.step_seconds is None
    counters.on_step_begin(None, state, control)
    now[0] += 6.0
    counters.on_step_end(None, state, control)
    assert (counters.train_seconds, counters.step_seconds) == (19.0, None)


def test_before_training_the_first_evaluation_and_the_rest_are_not_known():
    # The step-0 evaluation ran (train_seconds 0 at step 0): training has no rate yet.
    run = row("train", 0.0, {"train": 100, "eval": 20}, max_steps=50)
    estimate = estimate_remaining(run, {"values/train/runtime": 50.0, "train_seconds": 0.0, "eval_seconds": 2.0,
                                        "step": 0.0})
    assert estimate.training is None and estimate.evaluations == pytest.approx(2.0)  # the final one
    assert estimate.text() == "≥ 2s"


def test_ends_stages_and_runs_without_a_clock():
    assert estimate_remaining(row(status="finished")).seconds == 0.0
    assert estimate_remaining(row(status="stopped"), {"train_seconds": 5.0}).text() == "–"
    assert estimate_remaining(row("values", 0.5, status="queued")).text() == "–"  # nothing measured: no guess
    # A run from before the clock: its progress over wall time (100 s for half of it).
    assert estimate_remaining(row("train", 0.5)).seconds == pytest.approx(100.0, abs=1.0)
    # The final evaluation, under way: one evaluation's time.
    final = row("eval", 0.0, {"train": 100, "eval": 20}, max_steps=50)
    assert estimate_remaining(final, {"train_seconds": 9.0, "eval_seconds": 4.0, "step": 50.0}, 2).seconds == 2.0
    # A values run: its stage 1 only (30 of 100 train prompts in 15 s, then 20 held-out ones).
    values = row("values", 0.3, {"train": 30}, action="values")
    assert estimate_remaining(values, {"values/train/runtime": 15.0}).seconds == pytest.approx(45.0)


def test_clock_read_from_latest_metrics_and_its_sums():
    latest = {"train_seconds": {"step": 6, "value": 12.0}, "epoch": {"step": 6, "value": 0.25},
              "eval_seconds": {"step": 6, "value": 1.5}, "eval_runtime": {"step": 0, "value": 1.5},
              "values/train/runtime": {"step": 0, "value": 50.0}, "values/eval/runtime": {"step": 0, "value": 4.0},
              "values/train/completion_tokens": {"step": 0, "value": 900.0}, "loss": {"step": 6, "value": 0.1}}
    clock = clock_from_metrics(latest)
    assert clock == {"train_seconds": 12.0, "step": 6.0, "epoch": 0.25, "eval_seconds": 1.5, "eval_runtime": 1.5,
                     "values/train/runtime": 50.0, "values/eval/runtime": 4.0}
    assert (training_seconds(clock), stage1_seconds(clock)) == (62.0, 54.0)
    assert training_seconds({}) is None and stage1_seconds({}) is None
    run = row("train", 6 / 48, {"train": 100, "eval": 20}, num_train_epochs=2.0, eval_steps=0.25)
    assert clock_summary(run, clock) == {"stage1_seconds": 54.0, "train_seconds": 12.0, "eval_seconds": 1.5,
                                         "training_seconds": 62.0, "remaining_seconds": pytest.approx(90.0)}


def test_the_runs_list_and_the_run_header_show_the_clock():
    run = row("train", 6 / 48, {"train": 100, "eval": 20}, num_train_epochs=2.0, eval_steps=0.25)
    clock = {"values/train/runtime": 50.0, "train_seconds": 12.0, "eval_seconds": 1.5}
    frame = runs_frame([run], {1: clock})
    assert frame["training time"][0] == "1m 02s" and frame["remaining"][0] == "1m 30s"
    assert frame["wall time"][0] == "1m 40s"
    assert runs_frame([run])["remaining"][0] == "11m 40s"  # no clock (an old run): 1/8 done in 100 s of wall time
    text = header(run, [], {**clock, "step": 6.0, "epoch": 0.25})
    assert '<span id="run-remaining">remaining ≈ 1m 30s</span>' in text
    assert "training time 1m 02s" in text
    partial = header(row("values", 0.4, {"train": 40}, max_steps=50), [], {"values/train/runtime": 20.0})
    assert ">remaining ≥ 40s (training and evaluations not measured yet)<" in partial
