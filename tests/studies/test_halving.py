"""Sweeps that stop weak points early (issue 44): successive halving on Optuna's rule, rung by rung from the stored
runs, under a compute budget.

The rule and the rungs (`a2po.sweep`, `app.studies.sweeps`) against hand-made values; then the real thing: a studio's
scheduler and gate running a halving sweep of the tiny model to its end, a restarted studio that neither reruns nor
brings back a pruned point, and the study's table marking the pruned points as such."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from a2po.sweep import GridError, Halving, promoted, rung_share, rung_value
from app.access.auth import LOCAL_USER
from app.access.gate import Services
from app.access.policy import Policy
from app.runtime.scheduler import Scheduler
from app.studies import summary
from app.studies.comparison import store_timeline
from app.studies.protocols import StudyError
from app.studies.sweeps import halving_rungs, next_rung, sweep_specs
from storage import Store
from tests.helpers import wait_for
from tests.web.test_app_api import tiny_spec

pytestmark = pytest.mark.slow  # starts a studio, a worker or a command-line process


ROOT = Path(__file__).resolve().parents[2]


def test_optunas_rule_keeps_the_best_third_whatever_order_the_values_came_in():
    values = {f"p{i}": v for i, v in enumerate([0.5, 0.1, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6])}
    assert promoted(values, 3) == {"p2", "p6", "p4"}
    assert promoted(dict(reversed(values.items())), 3) == {"p2", "p6", "p4"}
    # A point without a value (its run failed) counts among the competitors and never goes on.
    assert promoted({"a": 0.2, "b": None, "c": 0.1, "d": 0.3}, 2) == {"d", "a"}
    assert promoted({"a": 0.2, "b": 0.1}, 3) == {"a"}  # at least one goes on


def test_ties_are_broken_by_the_curve_then_the_grid_order():
    same_final = {"early": rung_value([0.5], [[0.4, 0.5]], 1), "late": rung_value([0.5], [[0.0, 0.5]], 0)}
    assert promoted(same_final, 2) == {"early"}
    flat = {f"p{i}": rung_value([0.0], [[0.0]], i) for i in range(4)}
    assert promoted(flat, 2) == {"p0", "p1"}  # exactly n // 2, never every tied point
    assert rung_value([], [], 0) is None
    assert rung_value([0.2, 0.6, 0.4], [[0.1], [0.2], [0.3]], 0) == pytest.approx(0.4, abs=1e-3)  # the median


def test_the_budget_shares_and_the_most_runs_a_halving_can_make():
    halving = Halving()
    assert [halving.share(r) for r in range(3)] == pytest.approx([1 / 9, 1 / 3, 1.0])
    assert [halving.kept(24, r) for r in range(3)] == [24, 8, 2]
    assert halving.max_runs(24, 3) == 24 + 8 + 2 * 3
    assert rung_share({"halving": halving.to_dict(), "rung": 1}) == pytest.approx(1 / 3)
    assert rung_share({"kind": "seeds"}) == rung_share(None) == 1.0


@pytest.mark.parametrize("value, message", [
    ({"reduction_factor": 1}, "give 2 to 8"), ({"rungs": 9}, "give 2 to 4"), ({"search": "tpe"}, "grid, random"),
    ({"search": "random"}, "give both"), ({"eta": 3}, "'eta' is not a setting of halving"),
    ({"rungs": "3"}, "rungs takes a whole number"), ([3], "give a mapping"),
])
def test_a_bad_halving_is_refused_naming_the_setting(value, message):
    with pytest.raises(GridError, match=message):
        Halving.parse(value)


def test_a_random_search_draws_the_same_points_each_time():
    grid = {"learning_rate": [1e-5, 2e-5, 3e-5, 5e-5], "per_device_train_batch_size": [8, 16, 32]}
    drawn = Halving.parse({"search": "random", "trials": 5}).points(grid)
    assert len(drawn) == 5 and len({repr(p) for p in drawn}) == 5
    assert drawn == Halving.parse({"search": "random", "trials": 5}).points(grid)
    assert drawn != Halving.parse({"search": "random", "trials": 5, "sampler_seed": 7}).points(grid)


def budgeted(model: str, name: str = "h", **config) -> dict:
    spec = tiny_spec(model, name, **{"max_steps": -1, "num_train_epochs": 20.0, "max_train_flops": 4e9, **config})
    spec["config"].pop("eval_steps", None)
    return spec


def test_rung_zero_trains_each_point_once_on_the_budgets_grid(tiny_model_dir):
    specs = sweep_specs(budgeted(tiny_model_dir), {"learning_rate": [1e-3, 2e-3, 3e-3]}, [0, 1, 2],
                        halving=Halving(reduction_factor=3, rungs=2))
    assert [s["config"]["seed"] for s in specs] == [0, 0, 0]
    assert [s["study"]["rung"] for s in specs] == [0, 0, 0] and specs[0]["study"]["seed_list"] == [0, 1, 2]
    assert all(s["config"]["eval_every_flops"] == pytest.approx(4e9 / 8) for s in specs)
    assert specs[0]["name"] == "h-learning_rate=0.001-r0"


@pytest.mark.parametrize("spec_change, grid, message", [
    ({"max_train_flops": None}, {"learning_rate": [1e-3, 2e-3]}, "give the base spec one, max_train_flops"),
    ({}, {"method": ["a2po", "grpo"]}, "sweep each method on its own"),
])
def test_a_sweep_that_cannot_be_halved_is_refused(tiny_model_dir, spec_change, grid, message):
    spec = budgeted(tiny_model_dir)
    spec["config"].update(spec_change)
    with pytest.raises(StudyError, match=message):
        sweep_specs(spec, grid, [0], halving=Halving())


def _stored(specs: list[dict], first_id: int, status: str = "finished") -> list[dict]:
    return [{"id": first_id + i, "status": status, "config": spec, "name": spec["name"]}
            for i, spec in enumerate(specs)]


def test_the_next_rung_is_made_once_its_rung_ended_from_the_best_points_with_every_seed(tiny_model_dir):
    grid = {"learning_rate": [1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3]}
    rung0 = _stored(sweep_specs(budgeted(tiny_model_dir), grid, [4, 5], halving=Halving(rungs=2)), 1)
    finals = {run["id"]: (acc, [acc]) for run, acc in zip(rung0, [0.2, 0.6, 0.1, 0.5, 0.3, 0.4], strict=True)}
    assert next_rung(rung0[:5] + [{**rung0[5], "status": "running"}], finals) == []  # the rung has not ended
    made = next_rung(rung0, finals)
    assert [(s["study"]["point"]["learning_rate"], s["config"]["seed"], s["study"]["rung"]) for s in made] == [
        (2e-3, 4, 1), (2e-3, 5, 1), (4e-3, 4, 1), (4e-3, 5, 1)]  # the best 6 // 3 = 2, each seed at the last rung
    assert made[0]["name"] == "h-learning_rate=0.002-r1-s4" and made[0]["config"]["max_train_flops"] == 4e9
    done = rung0 + _stored(made, 100)
    assert next_rung(done, finals) == []  # the last rung: nothing after it
    rungs = halving_rungs(done, finals)
    assert rungs[0].promoted == {"learning_rate=0.002", "learning_rate=0.004"}


# ---------------------------------------------------------------------------------------------------------------
# The real thing


def test_a_studio_halves_a_sweep_to_its_end_and_a_restart_neither_reruns_nor_unprunes(tmp_path, tiny_model_dir):
    data_dir = tmp_path / "data"
    store = Store(data_dir / "studio.db")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    policy = Policy(data_dir, model_roots=[Path(tiny_model_dir).parent])
    grid = {"learning_rate": [1e-3, 3e-3, 1e-2]}

    def ended() -> bool:
        return all(r["status"] in ("finished", "failed") for r in store.list_runs())

    manager = Scheduler(store, data_dir, poll_interval=0.1, worker_env=env)
    services = Services(store, manager, data_dir, policy=policy)
    manager.after_pass = services.advance_studies
    try:
        first = services.launch_sweep(budgeted(tiny_model_dir, "halve"), LOCAL_USER, grid, [0, 1],
                                      halving={"reduction_factor": 3, "rungs": 2})
        assert len(first) == 3
        manager.start()
        wait_for(lambda: len(store.list_runs()) == 5 and ended(), timeout=600, what="both rungs to end")
    finally:
        manager.close()
    runs = sorted(store.list_runs(), key=lambda r: r["id"])
    assert all(r["status"] == "finished" for r in runs), [(r["id"], r["error"]) for r in runs]
    lines = {r["id"]: store_timeline(store, r) for r in runs}
    rung0 = runs[:3]
    # The point that went on is the one Optuna's rule picks from the stored rung-0 values.
    finals = {i: (t.final_accuracy, [p.accuracy for p in t.points[1:]]) for i, t in lines.items()}
    values = halving_rungs(runs, finals)[0].values
    kept = promoted(values, 3)
    assert {f"learning_rate={r['config']['study']['point']['learning_rate']:g}" for r in runs[3:]} == kept
    assert sorted(r["config"]["config"]["seed"] for r in runs[3:]) == [0, 1]
    # Rung 0 stopped on a third of the training part; the last rung spent the budget; both on one compute grid.
    for run in rung0:
        line = lines[run["id"]]
        assert line.flops_with_stage1 < 4e9 and line.flops_with_stage1 >= line.stage1_flops
    for run in runs[3:]:
        assert lines[run["id"]].flops_with_stage1 >= 4e9
    winner = next(r for r in rung0 if f"learning_rate={r['config']['study']['point']['learning_rate']:g}" in kept)
    seed0 = next(r for r in runs[3:] if r["config"]["config"]["seed"] == 0)
    assert [p.accuracy for p in lines[winner["id"]].points] == \
        [p.accuracy for p in lines[seed0["id"]].points][:len(lines[winner["id"]].points)]  # a prefix, step for step

    # A restarted studio reads the same decisions from the stored runs: no run is made again, none unpruned.
    again = Services(store, Scheduler(store, data_dir, poll_interval=0.1, worker_env=env), data_dir, policy=policy)
    assert again.advance_studies() == [] and len(store.list_runs()) == 5
    found = summary.summarize(runs, [lines[r["id"]] for r in runs])
    states = {row.label: row.state for row in found.rows}
    assert sorted(states.values()) == ["finished all 2 rungs", "pruned at rung 0 of 2", "pruned at rung 0 of 2"]
    assert found.best is not None and found.best.label in kept and len(found.best.run_ids) == 2
    assert all(row.table_row(False)["halving"] for row in found.rows)


def test_the_command_line_halves_a_sweep_marks_the_pruned_and_skips_what_it_ran(tmp_path, tiny_model_dir):
    import json
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "sweep"
    args = [sys.executable, "-m", "a2po", "sweep", "--model", tiny_model_dir, "--grid",
            "learning_rate=0.001,0.003,0.01", "--seeds", "0", "1", "--halving", '{"reduction_factor": 3, "rungs": 2}',
            "--num_prompts", "8", "--eval_size", "4", "--num_value_samples", "2", "--max_completion_length", "4",
            "--per_device_train_batch_size", "4", "--max_train_flops", "4e8", "--num_train_epochs", "20",
            "--use_cpu", "true", "--save_strategy", "no", "--filter_all_incorrect", "false", "--output_dir", str(out),
            "--run_name", "cli"]
    result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines()]
    assert [(r["rung"], r["seed"]) for r in rows] == [(0, 0)] * 3 + [(1, 0), (1, 1)]
    finals = {r["point_label"]: (r["final_accuracy"], r["curve"]) for r in rows[:3]}
    kept = promoted({label: rung_value([f], [c], i) for i, (label, (f, c)) in enumerate(finals.items())}, 3)
    assert {r["point_label"] for r in rows[3:]} == kept
    assert rows[3]["compute_flops"] >= 4e8 > rows[0]["compute_flops"]  # rung 0 spent a third of the training part
    table = json.loads((out / "summary.json").read_text())
    assert sorted(r["state"] for r in table) == ["pruned at rung 0", "pruned at rung 0", "rung 1"]
    assert "pruned at rung 0" in result.stdout and "rung 0: 1 of 3 points go on" in result.stdout
    again = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count("done earlier") == 5  # nothing run again, nothing unpruned
