"""The A*-PO vs GRPO comparison from stored rows (`app.studies.comparison`), the protocols and studies
(`app.studies.protocols`) and the accuracy figures: plain rows in, figures and sentences out."""

from __future__ import annotations

import pytest

from app.studies import comparison, summary
from app.studies.protocols import StudyError, pair_specs, parse_seeds, planned_steps, study_specs
from app.web import charts


def rows(method: str, points: list[tuple[int, float, float]], stage1: float = 0.0, tokens_per_step: int = 10,
         status: str = "finished", run_id: int = 1, name: str | None = None, eval_size: int = 64,
         stage: str | None = None, eval_steps: float | None = None) -> comparison.Timeline:
    """A timeline from evaluation rows at (step, training seconds, accuracy), with the run's clock in each
    evaluation's metrics as the trainer logs it, and metric rows like a trainer's."""
    name = name or method
    config = {"eval_steps": eval_steps} if eval_steps else {}
    spec = {"name": name, "config": config, "dataset": {"eval_size": eval_size}}
    if method != "a2po":
        spec["method"] = method
    run = {"id": run_id, "name": name, "status": status, "config": spec, "stage": stage}
    # Wall times far apart (a pause, a restart): the clock, not the wall, is what counts.
    evaluations = [{"step": s, "split": "eval", "created_at": 1000.0 + 7 * t + 300 * i,
                    "metrics": {"eval_accuracy": a, "train_seconds": t, "completion_tokens": s * tokens_per_step,
                                "eval_runtime": 5.0}}
                   for i, (s, t, a) in enumerate(points)]
    metrics = [{"step": 1, "name": "peak_memory_gb", "value": 1.5}, {"step": 2, "name": "peak_memory_gb", "value": 2.0}]
    if stage1:
        metrics += [{"step": 0, "name": "values/train/runtime", "value": stage1 / 2},  # after the first batch
                    {"step": 0, "name": "values/train/runtime", "value": stage1},
                    {"step": 0, "name": "values/train/completion_tokens", "value": 500},
                    {"step": 0, "name": "values/eval/runtime", "value": 1.0}]
    return comparison.timeline(run, evaluations, metrics)


def test_times_are_the_runs_clock_not_the_wall_between_evaluations():
    a2po = rows("a2po", [(0, 0, 0.05), (2, 40, 0.30), (4, 112, 0.41)], stage1=20.0)
    assert [p.seconds for p in a2po.points] == [0, 40, 112] and [p.tokens for p in a2po.points] == [0, 20, 40]
    # Stage 1's cost is the train split's whole (largest cumulative) figure; the held-out split's is evaluation.
    assert a2po.stage1_seconds == 20.0 and a2po.stage1_tokens == 500 and a2po.peak_memory_gb == 2.0


def test_rows_from_before_the_clock_fall_back_to_wall_time_less_evaluations():
    run = {"id": 1, "name": "a", "status": "finished", "config": {"name": "a", "config": {}}}
    evaluations = [{"step": step, "split": "eval", "created_at": 1000.0 + wall,
                    "metrics": {"eval_accuracy": 0.5, "eval_runtime": runtime}}
                   for step, wall, runtime in [(0, 0.0, 6.0), (4, 28.0, 12.0), (8, 53.0, 11.0)]]
    assert [p.seconds for p in comparison.timeline(run, evaluations, []).points] == [0.0, 16.0, 30.0]


GRID = " Held-out evaluations: A\\*-PO every 2 steps, {a} points; GRPO every 2 steps, {g} points."
A_RISES = [(0, 0, 0.05), (2, 40, 0.30), (4, 112, 0.41), (6, 150, 0.45)]
G_RISES = [(0, 0, 0.05), (2, 200, 0.20), (4, 370, 0.41), (6, 500, 0.41)]

VERDICTS = [
    # (case, A*-PO (status, points, extra), GRPO (status, points, extra), expected text, or a part of it)
    ("both finished, A*-PO reached GRPO's final",
     ("finished", A_RISES, {"stage1": 20.0}), ("finished", G_RISES, {}),
     "A\\*-PO reached GRPO's final 41% in 2m 12s (step 4) with its stage 1 (1m 52s without; stage 1: 20s); GRPO "
     "reached it in 6m 10s (step 4; its whole run: 8m 20s). A\\*-PO took 0.36x GRPO's time with its stage 1."
     + GRID.format(a=4, g=4)),
    ("A*-PO running, not there yet",
     ("running", [(0, 0, 0.05), (2, 40, 0.30)], {"stage1": 10.0}), ("finished", G_RISES, {}),
     "A\\*-PO has not reached GRPO's final 41% (A\\*-PO is running: its latest point, step 2, stands in for its end): "
     "its best is 30% in 50s (step 2) with its stage 1 (40s without); GRPO reached it in 6m 10s (step 4; its whole "
     "run: 8m 20s). GRPO was at 41%, at or past A\\*-PO's best, in 6m 10s (step 4)." + GRID.format(a=2, g=4)),
    ("GRPO stopped: its latest stands in",
     ("finished", A_RISES, {"stage1": 20.0}), ("stopped", G_RISES[:3], {}),
     "(GRPO is stopped: its latest point, step 4, stands in for its end)"),
    ("GRPO failed after some points", ("finished", A_RISES, {}), ("failed", G_RISES[:2], {}),
     "(GRPO failed: its latest point, step 2, stands in for its end)"),
    ("GRPO interrupted", ("finished", A_RISES, {}), ("interrupted", G_RISES[:3], {}), "GRPO is interrupted"),
    ("GRPO never rose (finished)", ("finished", A_RISES, {}), ("finished", [(0, 0, 0.1), (2, 30, 0.1)], {}),
     "GRPO's held-out accuracy did not rise above its start (10%; 10% at step 2), so there is no accuracy of its to "
     "reach. A\\*-PO went from 5% to 45%." + GRID.format(a=4, g=2)),
    ("GRPO fell (running): not 'reached in 0s'", ("finished", A_RISES, {}),
     ("running", [(0, 0, 0.2), (2, 30, 0.0)], {}), "has not risen above its start (20%; 0% at step 2)"),
    ("GRPO still at step 0", ("finished", A_RISES, {}), ("running", [(0, 0, 0.2)], {}), "has not risen above"),
    ("A*-PO queued", ("queued", [], {}), ("finished", G_RISES, {}),
     "No held-out accuracy yet: #1 a2po (A\\*-PO) is queued."),
    ("A*-PO in stage 1: no blame on the eval set", ("running", [], {"stage": "values"}), ("queued", [], {}),
     "No held-out accuracy yet: #1 a2po (A\\*-PO) is in stage 1 (V\\*); its first held-out accuracy comes right "
     "before its first training step; #2 grpo (GRPO) is queued."),
    ("GRPO starting", ("finished", A_RISES, {}), ("running", [], {"stage": "train"}), "is starting"),
    ("A*-PO failed before any point", ("failed", [], {}), ("finished", G_RISES, {}),
     "failed before its first held-out evaluation (its Logs say why)"),
    ("A*-PO stopped before any point", ("stopped", [], {}), ("finished", G_RISES, {}),
     "is stopped before its first held-out evaluation; resume it to go on"),
    ("no held-out set, said once", ("finished", [], {"eval_size": 0}), ("finished", [], {"eval_size": 0}),
     "#1 a2po (A\\*-PO) and #2 grpo (GRPO) hold no prompts out (eval_size 0), and the verdict compares held-out "
     "accuracy: launch with eval_size > 0."),
    ("names are escaped", ("queued", [], {"name": "my_*run*"}), ("finished", G_RISES, {}),
     "#1 my\\_\\*run\\* (A\\*-PO) is queued"),
    ("a coarser grid says 'at the latest'", ("finished", [(0, 0, 0.0), (4, 30, 0.5), (8, 60, 0.7)], {}),
     ("finished", [(0, 0, 0.0), (26, 200, 0.75), (52, 400, 0.8)], {}),
     "GRPO reached it by 6m 40s at the latest (step 52)"),
]


@pytest.mark.parametrize("case, a2po, grpo, expected", VERDICTS, ids=[v[0] for v in VERDICTS])
def test_the_verdict_is_right_in_every_state(case, a2po, grpo, expected):
    a = rows("a2po", a2po[1], status=a2po[0], run_id=1, **a2po[2])
    g = rows("grpo", grpo[1], status=grpo[0], run_id=2, **grpo[2])
    line = comparison.verdict(a, g)
    if expected.endswith(".") and expected[0].isupper():
        assert line == expected
    else:
        assert expected in line, line
    assert "in 0s" not in line and "needs an eval set" not in line


def test_the_verdict_reads_grpos_final_less_a_margin():
    a2po = rows("a2po", [(0, 0, 0.0), (4, 30, 0.78), (8, 60, 0.80)], stage1=10.0)
    grpo = rows("grpo", [(0, 0, 0.0), (4, 300, 0.50), (8, 600, 0.81)], run_id=2)
    line = comparison.verdict(a2po, grpo, margin=0.03)
    assert line.startswith("A\\*-PO reached GRPO's final 81% less 3 points (78%) in 40s (step 4)")


def test_accuracy_figures_draw_a2po_with_and_without_stage_1_and_against_steps():
    a2po = rows("a2po", [(0, 0, 0.1), (2, 60, 0.3)], stage1=30.0, run_id=1)
    grpo = rows("grpo", [(0, 0, 0.1), (2, 120, 0.2)], run_id=2)
    by_time, by_tokens, memory, by_steps, _ = charts.accuracy_figures([a2po, grpo])
    traces = {t.name: t for t in by_time.data}
    assert list(traces["#1 a2po (A*-PO) with stage 1"].x) == [0.5, 1.5]  # + 30 s of stage 1, in minutes
    assert list(traces["#1 a2po (A*-PO) without stage 1"].x) == [0.0, 1.0]
    assert list(traces["#2 grpo (GRPO)"].x) == [0.0, 2.0]
    tokens = {t.name: list(t.x) for t in by_tokens.data}
    assert tokens["#1 a2po (A*-PO) with stage 1"] == [500, 520] and tokens["#2 grpo (GRPO)"] == [0, 20]
    bars = memory.data[0]  # horizontal, each bar named by its run in full, its value written on it
    assert bars.orientation == "h" and list(bars.x) == [2.0, 2.0]
    assert list(bars.y) == ["#1 a2po (A*-PO)", "#2 grpo (GRPO)"] and list(bars.text) == ["2.00 GB", "2.00 GB"]
    assert memory.layout.yaxis.automargin is True
    assert {t.name: list(t.x) for t in by_steps.data} == {"#1 a2po (A*-PO)": [0, 2], "#2 grpo (GRPO)": [0, 2]}


def test_a_study_of_seeds_reads_as_medians_with_their_spread_and_a_table():
    seeds = {0: [(0, 0, 0.0), (4, 40, 0.5), (8, 80, 0.7)], 1: [(0, 0, 0.0), (4, 60, 0.3), (8, 100, 0.6)],
             2: [(0, 0, 0.1), (4, 50, 0.4), (8, 90, 0.8)]}
    runs, lines = [], []
    for i, (seed, points) in enumerate(seeds.items()):
        for method in ("a2po", "grpo"):
            line = rows(method, [(s, t * (5 if method == "grpo" else 1), a) for s, t, a in points],
                        stage1=12.0 + seed if method == "a2po" else 0.0, run_id=1 + 2 * i + (method == "grpo"))
            spec = {"config": {"seed": seed}, "study": {"id": "s1", "kind": "pair", "protocol": "paper",
                                                         "seed": seed}}
            runs.append({"id": line.run_id, "name": line.name, "config": spec})
            lines.append(line)
    view = comparison.study_view(runs, lines)
    assert view.protocol == "paper" and set(view.medians) == {"a2po", "grpo"}
    median = view.medians["a2po"]
    assert [p.accuracy for p in median.points] == [0.0, 0.4, 0.7] and [p.seconds for p in median.points] == [0, 50, 90]
    assert median.points[1].spread == (0.3, 0.5) and median.stage1_seconds == 13.0 and median.seeds == 3
    table = [(r["method"], r["seed"], r["final accuracy"], r["training time"]) for r in view.rows]
    assert table[:4] == [("A*-PO", "0", "70%", "1m 32s"), ("A*-PO", "1", "60%", "1m 53s"),
                         ("A*-PO", "2", "80%", "1m 44s"), ("A*-PO", "median", "70% (60%–80%)", "1m 43s")]
    a, g = view.pair()
    assert (a.label, g.label) == ("A*-PO median of 3", "GRPO median of 3")
    assert comparison.verdict(a, g).endswith("GRPO every 4 steps, 3 points. Medians of 3 seeds.")
    figures = charts.accuracy_figures(view.timelines, list(view.medians.values()))
    bands = [t for t in figures[0].data if (t.meta or {}).get("band") == "low"]
    assert len(bands) == 2 and list(bands[0].y) == [0.0, 0.3, 0.6]


SPEC = {"name": "demo", "action": "train", "model": "m", "rewards": [{"name": "exact_match", "weight": 1.0}],
        "dataset": {"source": "arithmetic", "num_prompts": 256, "eval_size": 128},
        "config": {"num_value_samples": 8, "beta1": 0.5, "beta2": 1e-3, "learning_rate": 1e-5, "max_steps": -1,
                   "num_train_epochs": 4.0, "lr_scheduler_type": "constant", "per_device_train_batch_size": 8,
                   "max_completion_length": 12, "seed": 1, "eval_steps": None, "filter_all_incorrect": True}}


def test_the_papers_protocol_trains_both_over_every_prompt_on_one_grid():
    assert planned_steps(SPEC) == 128  # 256 prompts / 8 per step x 4 epochs
    a2po, grpo = pair_specs(SPEC)
    assert (a2po["name"], grpo["name"], grpo["method"]) == ("demo-a2po", "demo-grpo", "grpo") and "method" not in a2po
    assert a2po["config"]["filter_all_incorrect"] is False  # as the authors' scripts run it
    assert a2po["config"]["eval_steps"] == grpo["config"]["eval_steps"] == 16  # 8 points on one absolute grid
    assert grpo["config"]["num_generations"] == 8 and grpo["config"]["per_device_train_batch_size"] == 64
    for key in ("learning_rate", "num_train_epochs", "lr_scheduler_type", "max_completion_length", "seed", "max_steps"):
        assert grpo["config"][key] == a2po["config"][key], key
    assert not {"num_value_samples", "beta1", "beta2", "filter_all_incorrect"} & set(grpo["config"])
    assert grpo["dataset"] == a2po["dataset"] and grpo["model"] == a2po["model"] and grpo["rewards"] == a2po["rewards"]
    assert SPEC["config"]["eval_steps"] is None and SPEC["config"]["filter_all_incorrect"]  # the caller's is kept


def test_trls_protocol_filters_and_equal_time_shares_a_budget():
    a2po, grpo = pair_specs(SPEC, "trl")
    # The grid is GRPO's steps over every prompt: A*-PO's shorter run is read at the same absolute steps.
    assert a2po["config"]["filter_all_incorrect"] is True and a2po["config"]["eval_steps"] == grpo["config"][
        "eval_steps"] == 16
    a2po, grpo = pair_specs(SPEC, "time", budget_seconds=600)
    for config in (a2po["config"], grpo["config"]):
        assert (config["max_train_seconds"], config["eval_every_seconds"], config["eval_steps"]) == (600, 75, None)
        assert config["num_train_epochs"] == 20.0  # epochs enough for the budget, not the epochs, to end them
    with pytest.raises(StudyError, match="budget"):
        pair_specs(SPEC, "time")


@pytest.mark.parametrize("change, message", [
    ({"method": "grpo"}, "starts from an A\\*-PO spec, and this one's method is 'grpo'"),
    ({"config": {**SPEC["config"], "num_value_samples": 1}}, "N \\(num_value_samples\\) >= 2.*N is 1"),
    ({"dataset": {**SPEC["dataset"], "eval_size": 0}}, "eval_size"),
    ({"action": "values"}, "set the action to \"train\""),
])
def test_a_pair_refuses_what_it_cannot_compare(change, message):
    with pytest.raises(StudyError, match=message):
        pair_specs({**SPEC, **change})


def test_seeds_make_one_study_with_tagged_runs():
    runs = study_specs(SPEC, parse_seeds("0, 1, 2"), pair=True, study_id="abc")
    assert [r["name"] for r in runs] == ["demo-a2po-s0", "demo-grpo-s0", "demo-a2po-s1", "demo-grpo-s1",
                                         "demo-a2po-s2", "demo-grpo-s2"]
    assert [r["config"]["seed"] for r in runs] == [0, 0, 1, 1, 2, 2]
    assert {r["study"]["id"] for r in runs} == {"abc"} and runs[3]["study"] == {
        "id": "abc", "name": "demo", "kind": "pair", "seed": 1, "seeds": 3, "protocol": "paper"}
    assert all(r["dataset"] == SPEC["dataset"] for r in runs)  # the same prompts and held-out set for every seed
    alone = study_specs(SPEC, [4, 5], pair=False)
    assert [(r["name"], r["config"]["seed"], r["study"]["kind"]) for r in alone] == [("demo-s4", 4, "seeds"),
                                                                                    ("demo-s5", 5, "seeds")]
    for bad, message in (("0, x", "not a whole number"), ("1 1", "each seed once"), (list(range(11)), "at most")):
        with pytest.raises(StudyError, match=message):
            parse_seeds(bad)


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


def test_the_launch_page_plans_a_pair_before_it_starts():
    """Under the "A*-PO vs GRPO" button: the runs, their steps and evaluations, and each method's training time at
    the rates of finished runs (A*-PO: 0.25 s a sequence, 0.1 s a stage-1 sample; GRPO: 1 s a completion trained)."""
    from app.web.pages.launch.plans import pair_plan_text

    done_a2po = {**SPEC, "config": {**SPEC["config"], "max_steps": 20}}
    done_grpo = {**SPEC, "method": "grpo", "config": {"max_steps": 10, "per_device_train_batch_size": 64}}
    history = [(done_a2po, {"train_seconds": 40.0, "step": 20.0, "values/train/runtime": 204.8}),
               (done_grpo, {"train_seconds": 640.0, "step": 10.0})]
    # 128 steps: A*-PO 128 x 8 x 0.25 + 256 x 8 x 0.1 = 460.8 s; GRPO 128 x 64 x 1 = 8192 s.
    # The first paragraph; the second, the batch figures, is tests/a2po/test_batch_figures.py's.
    assert pair_plan_text(SPEC, "paper", "", None, history).split("\n\n")[0] == (
        "**This pair:** 2 runs (1 seed x A*-PO and GRPO), one after another: 128 optimizer steps each; 9 evaluations "
        "of 128 held-out prompts each. Training time per seed, from this studio's finished runs: A*-PO about 7m 41s "
        "(stage 1 included); GRPO about 2h 16m; evaluations and loading add to it.")
    assert pair_plan_text(SPEC, "paper", "0, 1, 2", None, history).split("\n\n")[0].endswith(
        "evaluations and loading add to it. All 6 runs: about 7h 12m.")  # each seed samples its own stage 1
    fresh = pair_plan_text(SPEC, "paper", "0, 1", None, history[:1])
    assert fresh.startswith("**This pair:** 4 runs (2 seeds x A*-PO and GRPO)")
    assert "GRPO: no estimate yet (no finished GRPO run of this model on this studio)" in fresh
    assert pair_plan_text(SPEC, "time", "0, 1, 2", 10, []).split("\n\n")[0] == (
        "**This pair:** 6 runs (3 seeds x A*-PO and GRPO), one after another, each stopped after 10m 00s of training "
        "(A*-PO's stage 1 included): about 1h 00m in all, plus evaluations and loading.")
    assert pair_plan_text(SPEC, "time", "", None, []).startswith("⚠ The equal-time protocol needs a budget")
    assert pair_plan_text(SPEC, "paper", "0, x", None, []).startswith("⚠ seeds:")


# ---------------------------------------------------------------------------------------------------------------
# Medians over seeds (issue 35, item 7): ends from each run's last point, curves aligned by step or clock, failed
# runs counted and left out


def _seed_line(run_id: int, method: str, accuracies: list[float], status: str = "finished", every: float = 10.0,
               clock: bool = False) -> comparison.Timeline:
    points = [comparison.Point(4 * i, every * i, 100 * i, a) for i, a in enumerate(accuracies)]
    return comparison.Timeline(run_id, f"r{run_id}", method, status, points,
                               stage1_seconds=5.0 if method == "a2po" else 0.0,
                               eval_every=("seconds", every) if clock else None)


def _seed_run(line: comparison.Timeline, seed: int) -> dict:
    return {"id": line.run_id, "name": line.name, "config": {"config": {"seed": seed}, "study": {
        "id": "s", "kind": "sweep", "seed": seed, "protocol": "time", "point": {"beta2": 0.001}}}}


def test_a_medians_final_is_the_median_of_each_runs_last_point():
    lines = [_seed_line(1, "a2po", [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]),
             _seed_line(2, "a2po", [0.0, 0.3, 0.6, 0.9])]  # fewer evaluations, same end
    view = comparison.study_view([_seed_run(t, i) for i, t in enumerate(lines)], lines)
    median = view.medians["a2po"]
    assert median.final_accuracy == pytest.approx(0.85) and median.points[-1].spread == (0.8, 0.9)
    assert view.rows[-1]["final accuracy"] == "85% (80%–90%)"
    assert median.points[-1].step == 22  # the median of the runs' last steps, 32 and 12
    curve = summary.summarize([_seed_run(t, i) for i, t in enumerate(lines)], lines).rows[0].curve
    assert curve.final_accuracy == pytest.approx(0.85)


def test_equal_time_seeds_with_a_different_number_of_evaluations_are_aligned_by_clock():
    # Both stop at the 60 s budget; the second, with a longer stage 1, evaluated every 12 s of its training.
    lines = [_seed_line(1, "a2po", [0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8], clock=True),
             _seed_line(2, "a2po", [0.0, 0.2, 0.4, 0.5, 0.6, 0.75], every=12.0, clock=True)]
    runs = [_seed_run(t, i) for i, t in enumerate(lines)]
    for median in (comparison.study_view(runs, lines).medians["a2po"], summary.summarize(runs, lines).rows[0].curve):
        assert [p.seconds for p in median.points] == [0, 10, 12, 20, 24, 30, 36, 40, 48, 50, 60]
        # Each run's latest evaluation at that time: 10 s is the first run's 20% and the second's 0%, so 10%.
        assert [p.accuracy for p in median.points] == pytest.approx(
            [0.0, 0.1, 0.2, 0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.775])
        assert median.points[-1].spread == (0.75, 0.8)


def test_seeds_on_one_compute_grid_give_a_median_point_per_grid_point():
    # Three seeds evaluated every 1e12 FLOPs, each at its first step past the grid point (steps of 3e9-5e9 FLOPs):
    # what the recipe search's last rung stores. A median at each run's own position would read a partial median
    # (one run past the grid point, the others not yet) before the whole one: a stair on the Studies page.
    def line(run_id: int, offsets: list[float], accuracies: list[float]) -> comparison.Timeline:
        points = [comparison.Point(8 * i, 10.0 * i, 100 * i, a, flops=i * 1e12 + o)
                  for i, (o, a) in enumerate(zip(offsets, accuracies))]
        return comparison.Timeline(run_id, f"r{run_id}", "a2po", "finished", points, eval_every=("flops", 1e12))

    lines = [line(1, [0, 3e9, 4e9, 5e9], [0.0, 0.31, 0.67, 0.69]),
             line(2, [0, 4e9, 3e9, 3e9], [0.0, 0.0, 0.54, 0.70]),
             line(3, [0, 5e9, 5e9, 4e9], [0.0, 0.0, 0.0, 0.67])]
    runs = [_seed_run(t, i) for i, t in enumerate(lines)]
    for median in (comparison.study_view(runs, lines).medians["a2po"], summary.summarize(runs, lines).rows[0].curve):
        assert [p.flops for p in median.points] == [0, 1.005e12, 2.005e12, 3.004e12]
        assert [p.accuracy for p in median.points] == pytest.approx([0.0, 0.0, 0.54, 0.69])
        assert [p.spread for p in median.points][2] == (0.0, 0.67)


def test_a_failed_seed_is_counted_and_left_out_of_the_medians_and_the_verdict():
    a = [_seed_line(1, "a2po", [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]),
         _seed_line(3, "a2po", [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.9]),
         _seed_line(5, "a2po", [0.0, 0.05], status="failed")]
    g = [_seed_line(run_id, "grpo", [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.6]) for run_id in (2, 4, 6)]
    lines = [a[0], g[0], a[1], g[1], a[2], g[2]]
    runs = [_seed_run(t, t.run_id // 2) for t in lines]
    view = comparison.study_view(runs, lines)
    median_row = next(r for r in view.rows if r["method"] == "A*-PO" and r["seed"] == "median")
    assert (median_row["run"], median_row["final accuracy"]) == ("seeds: 2 of 3 (#5 failed left out)", "85% (80%–90%)")
    median = view.medians["a2po"]
    assert median.label == "A*-PO median of 2 of 3" and len(median.points) == 9
    text = comparison.verdict(*view.pair())
    assert text.startswith("A\\*-PO reached GRPO's final 60% in 1m 05s (step 24)")
    assert text.endswith("Medians of the finished seeds: A\\*-PO 2 of 3 (#5 failed left out); GRPO 3 of 3.")
    row = summary.summarize([runs[i] for i in (0, 2, 4)], a).rows[0]  # the Studies page's row of that point
    assert row.table_row(False)["seeds finished"] == "2 of 3" and row.final == pytest.approx(0.85)
    assert row.final_range == (0.8, 0.9) and len(row.curve.points) == 9


def test_a_median_never_falls_outside_its_own_range():
    import random

    rng = random.Random(7)
    for _ in range(200):
        clock = rng.random() < 0.5
        lines = [_seed_line(i, "a2po", [rng.random() for _ in range(rng.randint(1, 9))], every=rng.choice([10, 12]),
                            clock=clock, status=rng.choice(["finished", "finished", "failed"])) for i in range(3)]
        view = comparison.study_view([_seed_run(t, t.run_id) for t in lines], lines)
        median = view.medians.get("a2po")
        if median is None:  # none finished
            continue
        finals = [t.final_accuracy for t in lines if t.status == "finished"]
        assert min(finals) <= median.final_accuracy <= max(finals)
        assert all(p.spread[0] <= p.accuracy <= p.spread[1] for p in median.points)
        assert [p.step for p in median.points] == sorted(p.step for p in median.points)


def test_under_equal_time_the_grpo_side_may_take_its_own_learning_rate_and_batch_and_nothing_else():
    a2po, grpo = pair_specs(SPEC, "time", budget_seconds=240, grpo_recipe="dapo",
                            grpo_settings={"learning_rate": 3e-5, "per_device_train_batch_size": 32})
    assert (grpo["config"]["learning_rate"], grpo["config"]["per_device_train_batch_size"]) == (3e-5, 32)
    assert a2po["config"]["learning_rate"] == 1e-5 and grpo["config"]["num_generations"] == 8  # G = N still
    assert grpo["config"]["max_train_seconds"] == a2po["config"]["max_train_seconds"] == 240  # the shared budget
    assert grpo["config"]["loss_type"] == "dapo"
    runs = study_specs(SPEC, [0, 1], pair=True, protocol="time", budget_seconds=240,
                       grpo_settings={"learning_rate": 3e-5})
    assert runs[0]["study"]["grpo_settings"] == {"learning_rate": 3e-5}
    with pytest.raises(StudyError, match="only under equal time or compute"):
        pair_specs(SPEC, "paper", grpo_settings={"learning_rate": 3e-5})
    with pytest.raises(StudyError, match="'num_generations' is matched to the A\\*-PO run; the GRPO side may set "
                                         "only learning_rate, per_device_train_batch_size"):
        pair_specs(SPEC, "time", budget_seconds=240, grpo_settings={"num_generations": 4})


class AnswersStore:
    """What `paired_difference` reads of a store: each run's last evaluation and its held-out answers."""

    def __init__(self, answers: dict[int, list[float]]):
        self.answers = answers

    def get_evaluations(self, run_id):
        return [{"step": 1, "split": "eval"}, {"step": 9, "split": "eval"}]

    def step_samples(self, run_id, step, split="train", limit=None):
        assert (step, split) == (9, "eval")  # the run's last evaluation
        return [{"prompt_id": f"p{i}", "reward": r} for i, r in enumerate(self.answers[run_id])]


def duel_run(run_id: int, method: str, seed: int, status: str = "finished") -> dict:
    return {"id": run_id, "status": status, "config": {"method": method, "study": {"seed": seed}}}


def test_a_verdict_states_its_paired_bootstrap_interval_and_whether_it_is_noise():
    runs = [duel_run(1, "a2po", 0), duel_run(2, "grpo", 0), duel_run(3, "a2po", 1), duel_run(4, "grpo", 1)]
    clear = comparison.method_difference(AnswersStore({1: [1.0] * 40, 2: [0.0] * 40, 3: [1.0] * 40,
                                                       4: [0.0] * 40}), runs)
    assert (clear.points, clear.low, clear.high, clear.seeds, clear.prompts) == (100.0, 100.0, 100.0, 2, 40)
    assert not clear.within_noise and "the aim (A\\*-PO ahead by 3 points or more) is met" in clear.text()
    # The same answers but one: +1.25 points, and an interval that holds 0.
    close = comparison.method_difference(AnswersStore({1: [1.0] * 40, 2: [1.0] * 39 + [0.0], 3: [0.0] * 40,
                                                       4: [0.0] * 40}), runs)
    assert close.points == pytest.approx(1.25) and close.low <= 0 <= close.high and close.within_noise
    assert "within the noise" in close.text() and "not ruled out" in close.text()
    # A seed without its pair, or an unfinished run, is left out; no pair at all: no answer.
    assert comparison.method_difference(AnswersStore({1: [1.0], 2: [0.0]}), runs[:1] + [duel_run(2, "grpo", 5)]) \
        is None
    half = comparison.method_difference(AnswersStore({1: [1.0, 1.0], 2: [0.0, 1.0], 3: [1.0, 0.0], 4: [1.0, 1.0]}),
                                        runs[:3] + [duel_run(4, "grpo", 1, "failed")])
    assert (half.seeds, half.points) == (1, 50.0)


def test_under_equal_compute_the_verdict_counts_flops_and_the_timelines_read_them():
    # Each evaluation's training FLOPs come from its metrics; stage 1's from its cumulative metric.
    evaluations = [{"step": s, "split": "eval", "created_at": s,
                    "metrics": {"eval_accuracy": a, "train_seconds": 10 * s, "train_flops": 1e12 * s}}
                   for s, a in ((0, 0.0), (4, 0.5), (8, 0.8))]
    spec = {"config": {"eval_every_flops": 4e12, "method": "a2po"}}
    a2po = comparison.timeline({"id": 1, "name": "a", "status": "finished", "config": spec}, evaluations,
                               [{"name": "values/train/flops", "value": 2e12, "step": 0}])
    assert [p.flops for p in a2po.points] == [0.0, 4e12, 8e12] and a2po.stage1_flops == 2e12
    assert a2po.flops_with_stage1 == 1e13 and a2po.grid() == ("flops", 4e12)
    grpo = comparison.timeline({"id": 2, "name": "g", "status": "finished",
                                "config": {"method": "grpo", "config": {"eval_every_flops": 4e12}}},
                               [{**e, "metrics": {**e["metrics"], "eval_accuracy": a}}
                                for e, a in zip(evaluations, (0.0, 0.6, 0.7))], [])
    text = comparison.verdict(a2po, grpo)
    assert "A\\*-PO reached GRPO's final 70% at 10 TFLOP (step 8) with its stage 1 (8 TFLOP without" in text
    assert "GRPO reached it at 8 TFLOP (step 8)" in text and "1.25x GRPO's compute" in text
    assert "every 4 TFLOP of compute" in text
