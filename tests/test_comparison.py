"""The A*-PO vs GRPO comparison from stored rows (`app.web.comparison`), the matched pair (`app.access.gate.
pair_specs`) and the accuracy figures: plain rows in, figures and sentences out."""

from __future__ import annotations

from app.access.gate import pair_specs
from app.web import charts, comparison


def rows(method: str, points: list[tuple[int, float, float]], stage1: float = 0.0, tokens_per_step: int = 10,
         status: str = "finished", run_id: int = 1) -> comparison.Timeline:
    """A timeline from evaluation rows at (step, seconds, accuracy) and metric rows like a trainer's."""
    spec = {"name": method, "config": {}} if method == "a2po" else {"name": method, "method": method, "config": {}}
    run = {"id": run_id, "name": method, "status": status, "config": spec}
    evaluations = [{"step": s, "split": "eval", "created_at": 1000.0 + t, "metrics": {"eval_accuracy": a}}
                   for s, t, a in points]
    metrics = [{"step": s, "name": "completion_tokens", "value": s * tokens_per_step} for s, _, _ in points if s]
    metrics += [{"step": 1, "name": "peak_memory_gb", "value": 1.5},
                {"step": 2, "name": "peak_memory_gb", "value": 2.0}]
    if stage1:
        metrics += [{"step": 0, "name": "values/train/runtime", "value": stage1},
                    {"step": 0, "name": "values/train/completion_tokens", "value": 500},
                    {"step": 0, "name": "values/eval/runtime", "value": 1.0}]
    return comparison.timeline(run, evaluations, metrics)


def test_verdict_says_when_a2po_reached_grpos_final_accuracy_with_and_without_stage_1():
    a2po = rows("a2po", [(0, 0, 0.05), (2, 40, 0.30), (4, 112, 0.41), (6, 150, 0.45)], stage1=20.0)
    grpo = rows("grpo", [(0, 0, 0.05), (2, 200, 0.20), (4, 370, 0.41), (6, 500, 0.41)], tokens_per_step=80)
    # Stage 1's cost is the train split's: the held-out split's V* (1 s here) is part of evaluating.
    assert a2po.stage1_seconds == 20.0 and a2po.stage1_tokens == 500 and a2po.peak_memory_gb == 2.0
    assert [p.tokens for p in grpo.points] == [0, 160, 320, 480]
    line = comparison.verdict(a2po, grpo)
    assert line == ("A*-PO reached GRPO's final 41% in 2m 12s (1m 52s without its stage 1 of 20s); GRPO took 6m 10s "
                    "(its run: 8m 20s).")


def test_verdict_says_when_grpo_learned_nothing_to_reach():
    a2po = rows("a2po", [(0, 0, 0.0), (2, 10, 0.25)], stage1=5.0)
    grpo = rows("grpo", [(0, 0, 0.0), (2, 30, 0.0)])
    assert comparison.verdict(a2po, grpo) == ("GRPO's held-out accuracy did not rise (0% at its start, 0% at its end), "
                                              "so there is no accuracy of its to reach; A*-PO went from 0% to 25%.")


def test_verdict_says_when_a2po_has_not_reached_it_or_a_run_is_not_finished():
    a2po = rows("a2po", [(0, 0, 0.05), (2, 40, 0.30), (4, 80, 0.25)], stage1=10.0, status="running")
    grpo = rows("grpo", [(0, 0, 0.05), (4, 300, 0.41)])
    line = comparison.verdict(a2po, grpo)
    assert line == ("A*-PO has not reached GRPO's final 41%, and is still running: its best is 30% at 50s "
                    "(40s without stage 1); GRPO took 5m 00s. GRPO was at 41%, past A*-PO's best, by 5m 00s (step 4).")
    # A*-PO finished lower, and in less time than GRPO's first evaluation: both ways round are said.
    shorter = comparison.verdict(rows("a2po", [(0, 0, 0.0), (4, 30, 0.36), (20, 130, 0.55)], stage1=70.0),
                                 rows("grpo", [(0, 0, 0.0), (26, 400, 0.75), (52, 800, 0.80), (128, 1900, 0.78)]))
    assert shorter == ("A*-PO has not reached GRPO's final 78%: its best is 55% at 3m 20s (2m 10s without stage 1); "
                       "GRPO took 13m 20s (its run: 31m 40s). GRPO was at 75%, past A*-PO's best, by 6m 40s "
                       "(step 26).")
    unfinished = comparison.verdict(rows("a2po", [(0, 0, 0.5)]), rows("grpo", [(0, 0, 0.1), (2, 30, 0.4)],
                                                                       status="running"))
    assert "GRPO is running: its latest accuracy is the target" in unfinished
    assert "needs an eval set" in comparison.verdict(rows("a2po", []), grpo)


def test_time_spent_evaluating_is_not_counted_as_training_time():
    """How often a run is measured is not its cost: each evaluation after the first takes its `eval_runtime` off
    the times of the points from it on (rows are written when their evaluation has ended)."""
    run = {"id": 1, "name": "a", "status": "finished", "config": {"name": "a", "config": {}}}
    evaluations = [{"step": step, "split": "eval", "created_at": 1000.0 + wall,
                    "metrics": {"eval_accuracy": 0.5, "eval_runtime": runtime}}
                   for step, wall, runtime in [(0, 0.0, 6.0), (4, 28.0, 12.0), (8, 53.0, 11.0)]]
    line = comparison.timeline(run, evaluations, [])
    assert [p.seconds for p in line.points] == [0.0, 16.0, 30.0]


def test_accuracy_figures_draw_a2po_with_and_without_stage_1():
    a2po = rows("a2po", [(0, 0, 0.1), (2, 60, 0.3)], stage1=30.0, run_id=1)
    grpo = rows("grpo", [(0, 0, 0.1), (2, 120, 0.2)], run_id=2)
    by_time, by_tokens, memory = charts.accuracy_figures([a2po, grpo])
    traces = {t.name: t for t in by_time.data}
    assert list(traces["#1 a2po (A*-PO) with stage 1"].x) == [0.5, 1.5]  # + 30 s of stage 1, in minutes
    assert list(traces["#1 a2po (A*-PO) without stage 1"].x) == [0.0, 1.0]
    assert list(traces["#2 grpo (GRPO)"].x) == [0.0, 2.0]
    tokens = {t.name: list(t.x) for t in by_tokens.data}
    assert tokens["#1 a2po (A*-PO) with stage 1"] == [500, 520] and tokens["#2 grpo (GRPO)"] == [0, 20]
    assert list(memory.data[0].y) == [2.0, 2.0]


def test_the_pair_is_matched():
    spec = {"name": "demo", "action": "train", "model": "m", "rewards": [{"name": "exact_match", "weight": 1.0}],
            "dataset": {"source": "arithmetic", "num_prompts": 256, "eval_size": 64},
            "config": {"num_value_samples": 8, "beta1": 0.5, "beta2": 1e-3, "learning_rate": 1e-5, "max_steps": -1,
                       "num_train_epochs": 4.0, "lr_scheduler_type": "constant", "per_device_train_batch_size": 8,
                       "max_completion_length": 12, "seed": 1, "eval_steps": None, "filter_all_incorrect": True}}
    a2po, grpo = pair_specs(spec)
    assert (a2po["name"], grpo["name"], grpo["method"]) == ("demo-a2po", "demo-grpo", "grpo") and "method" not in a2po
    # Each run evaluates every fifth of its own steps: A*-PO's are fewer once stage 1 has dropped prompts.
    assert a2po["config"]["eval_steps"] == grpo["config"]["eval_steps"] == 0.2
    assert grpo["config"]["num_generations"] == 8 and grpo["config"]["per_device_train_batch_size"] == 64
    for key in ("learning_rate", "num_train_epochs", "lr_scheduler_type", "max_completion_length", "seed", "max_steps"):
        assert grpo["config"][key] == a2po["config"][key], key
    assert not {"num_value_samples", "beta1", "beta2", "filter_all_incorrect"} & set(grpo["config"])
    assert grpo["dataset"] == a2po["dataset"] and grpo["model"] == a2po["model"] and grpo["rewards"] == a2po["rewards"]
    assert spec["config"]["eval_steps"] is None  # the caller's spec is left as it was


def test_the_cost_explanation_says_which_prompts_each_method_trains_on():
    """A*-PO's run is the shorter one when stage 1 drops prompts: the Explain page says why, from the runs' metrics."""
    a2po = comparison.timeline(
        {"id": 1, "name": "a2po", "status": "finished", "config": {"name": "a2po", "config": {}}},
        [{"step": step, "split": "eval", "created_at": 1000.0 + seconds, "metrics": {"eval_accuracy": accuracy}}
         for step, seconds, accuracy in [(0, 0, 0.0), (20, 130, 0.55)]],
        [{"step": 0, "name": "values/train/num_prompts", "value": 256},
         {"step": 0, "name": "values/train/num_filtered", "value": 215},
         {"step": 0, "name": "values/eval/num_prompts", "value": 64},
         {"step": 20, "name": "completion_tokens", "value": 1747}])
    grpo = rows("grpo", [(0, 0, 0.0), (128, 1900, 0.78)], run_id=2)
    grpo.zero_std_share = 0.25
    assert (a2po.prompts, a2po.prompts_kept) == (256, 41)
    text = comparison.cost_explanation(a2po, grpo, {"num_value_samples": 8}, {"num_generations": 8})
    assert ("- Prompts trained on: A\\*-PO 41 of 256 (stage 1 dropped the 215 that none of its N reference samples "
            "solved); GRPO every prompt of its dataset, though a group whose G rewards are all equal has zero "
            "advantage and teaches nothing: 25% of its groups on average (`frac_reward_zero_std`).") in text
    assert "A\\*-PO 20 steps, 1,747 completion tokens" in text and "GRPO 128 steps" in text
    # Without stage-1 figures (a GRPO run picked as "A*-PO", an old run) the bullet is left out, not guessed.
    assert "Prompts trained on" not in comparison.cost_explanation(rows("a2po", [(0, 0, 0.0)]), grpo, {}, {})


def test_grpo_s_share_of_groups_with_equal_rewards_is_read_from_its_metrics():
    run = {"id": 2, "name": "g", "status": "finished", "config": {"name": "g", "method": "grpo", "config": {}}}
    line = comparison.timeline(run, [], [{"step": 1, "name": "frac_reward_zero_std", "value": 0.5},
                                         {"step": 2, "name": "frac_reward_zero_std", "value": 0.25}])
    assert line.zero_std_share == 0.375 and line.prompts is None
