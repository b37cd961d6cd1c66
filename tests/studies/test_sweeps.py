"""Sweeps (issue 29): a grid of settings and run seeds as one study, stage 1 sampled once for all of it.

The grid and its runs (`a2po.sweep`, `app.studies.sweeps`) and the study's table (`app.studies.summary`) are checked
against hand-made values; then the real thing: `/launch_study` on `python -m app` with the tiny model (2 x 1 grid
points x 2 seeds), its Studies page read back in Chromium, a two-device scheduler that lets the second run wait for
the first one's stage 1 instead of sampling it beside it, and `python -m a2po sweep`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import gradio as gr
import playwright.sync_api as playwright
import pytest
from gradio_client import Client

from a2po.runspec import RunSpec, SpecError, with_defaults
from a2po.sweep import grid_points, parse_grid, show_value, summarize_sweep
from app.access.gate import Services
from app.access.policy import Policy
from app.runtime.scheduler import Scheduler
from app.studies import summary
from app.studies.comparison import Point, Timeline, store_timeline
from app.studies.protocols import StudyError, pair_specs, planned_steps
from app.studies.sweeps import estimate_seconds, grid_from_text, shared_stage_one, sweep_specs
from app.web.api import register_api
from app.web.pages.launch.page import build_launch_page
from storage import Store
from tests.browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, open_tab, shoot
from tests.helpers import wait_for
from tests.web.test_app_api import free_port, start_app, stop_app, tiny_spec

pytestmark = pytest.mark.slow  # starts a studio, a worker or a command-line process


ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------------------------
# The grid and the runs it makes


@pytest.mark.parametrize("grid, message", [
    ({"beta3": [1]}, "'beta3' is not a setting of A*-PO's or GRPO's config. Did you mean beta"),
    ({"seed": [1, 2]}, "seed cannot be swept: give run seeds"),
    ({"beta2": "x, y"}, "beta2 takes numbers, e.g. 1e-5, 2e-5 (got 'x')"),
    ({"method": ["ppo"]}, "method takes a2po, grpo (got 'ppo')"),
    ({"beta2": [0.1, 0.1]}, "each value of beta2 once"),
    ({"beta2": []}, "give beta2 a list of one or more values"),
    ({"filter_all_incorrect": ["maybe"]}, "filter_all_incorrect takes true or false"),
    ([1, 2], "give a mapping of settings to lists of values"),
])
def test_a_bad_grid_is_refused_naming_the_setting_and_the_fix(grid, message):
    with pytest.raises(ValueError) as refused:
        parse_grid(grid)
    assert message in str(refused.value)


def test_grid_values_are_read_by_the_fields_type_and_combined_in_order():
    grid = parse_grid({"beta2": "1e-3, 1e-2", "num_value_samples": ["4", 8], "filter_all_incorrect": "true false",
                       "learning_rate": [1]})
    assert grid == {"beta2": [0.001, 0.01], "num_value_samples": [4, 8], "filter_all_incorrect": [True, False],
                    "learning_rate": [1.0]}
    points = grid_points({"a": [1, 2], "b": ["x", "y", "z"]})
    assert len(points) == 6 and points[0] == {"a": 1, "b": "x"} and points[3] == {"a": 2, "b": "x"}
    assert grid_points({}) == [{}]
    assert grid_from_text("beta2: 0.001, 0.01\n\n# a comment\nlearning_rate = 1e-5 2e-5") == {
        "beta2": " 0.001, 0.01", "learning_rate": " 1e-5 2e-5"}
    for bad in ("beta2 0.001", "beta2: 1\nbeta2: 2"):
        with pytest.raises(StudyError):
            grid_from_text(bad)


def test_a_sweep_makes_one_run_per_point_and_seed_on_one_stage_one_and_one_evaluation_grid():
    base = with_defaults({"name": "lr", "config": {"seed": 7}})
    runs = sweep_specs(base, {"learning_rate": [1e-5, 2e-5], "num_train_epochs": [1, 2]}, [0, 1])
    assert [r["name"] for r in runs[:3]] == ["lr-learning_rate=1e-05-num_train_epochs=1-s0",
                                             "lr-learning_rate=1e-05-num_train_epochs=1-s1",
                                             "lr-learning_rate=1e-05-num_train_epochs=2-s0"]
    assert len(runs) == 8 and len({r["study"]["id"] for r in runs}) == 1
    assert [r["config"]["seed"] for r in runs] == [0, 1] * 4
    # Every run samples stage 1 with the base's seed: one V* set for the whole study.
    assert {r["config"]["values_seed"] for r in runs} == {7}
    assert len({RunSpec.from_dict(r).value_fingerprint() for r in runs}) == 1
    assert shared_stage_one(runs) == {"value_sets": 1, "a2po_runs": 8, "saved_runs": 7}
    # 256 prompts, 8 per step: 32 steps per epoch; the longest run (64 steps) sets one grid of 8 points for all.
    assert {r["config"]["eval_steps"] for r in runs} == {8}
    assert runs[0]["study"]["point"] == {"learning_rate": 1e-05, "num_train_epochs": 1}
    assert runs[0]["study"]["grid"] == {"learning_rate": [1e-05, 2e-05], "num_train_epochs": [1, 2]}
    RunSpec.from_dict(runs[0])  # the study's label is a valid part of a spec
    with pytest.raises(SpecError):
        RunSpec.from_dict({**runs[0], "study": {"grid": {"x": [[[1]]]}}})
    with pytest.raises(StudyError, match="a study has at most 64"):
        sweep_specs(base, {"learning_rate": [1e-5, 2e-5, 3e-5, 4e-5, 5e-5, 6e-5, 7e-5, 8e-5, 9e-5]}, list(range(8)))


def test_method_in_the_grid_matches_grpo_under_the_papers_protocol_once_per_its_own_settings():
    base = with_defaults({"name": "duel"})
    runs = sweep_specs(base, {"method": ["a2po", "grpo"], "beta2": [1e-3, 1e-2], "learning_rate": [1e-5, 2e-5]}, [])
    a2po = [r for r in runs if r.get("method", "a2po") == "a2po"]
    grpo = [r for r in runs if r.get("method") == "grpo"]
    # beta2 is A*-PO's: GRPO runs once per learning rate, not once per (beta2, learning rate).
    assert len(a2po) == 4 and len(grpo) == 2
    assert [r["study"]["point"] for r in grpo] == [{"method": "grpo", "learning_rate": 1e-5},
                                                 {"method": "grpo", "learning_rate": 2e-5}]
    assert all(r["config"]["filter_all_incorrect"] is False for r in a2po)  # the paper's protocol
    assert all(r["config"]["num_generations"] == 8 and r["config"]["per_device_train_batch_size"] == 64 for r in grpo)
    assert {r["config"]["eval_steps"] for r in runs} == {32}  # 256 steps, 8 points: one grid for both methods
    with pytest.raises(StudyError, match="beta is not a setting of a2po runs, and this sweep runs only a2po"):
        sweep_specs(base, {"beta": [0.0, 0.04]}, [])
    with pytest.raises(StudyError, match="starts from an A\\*-PO spec"):
        sweep_specs(with_defaults({"method": "grpo"}), {"method": ["a2po", "grpo"]}, [])


def test_method_in_the_grid_gives_every_a2po_point_its_own_matched_grpo_run():
    base = with_defaults({"name": "duel"})
    for setting, values in (("num_value_samples", [4, 8]), ("per_device_train_batch_size", [8, 16])):
        runs = sweep_specs(base, {"method": ["a2po", "grpo"], setting: values}, [])
        a2po = {r["study"]["point"][setting]: r for r in runs if r.get("method", "a2po") == "a2po"}
        grpo = {r["study"]["point"][setting]: r for r in runs if r.get("method") == "grpo"}
        assert sorted(a2po) == sorted(grpo) == values, (setting, [r["study"]["point"] for r in runs])
        for value, run in a2po.items():
            config, match = run["config"], grpo[value]["config"]
            assert match["num_generations"] == config["num_value_samples"]  # G = N
            assert match["per_device_train_batch_size"] // match["num_generations"] == \
                config["per_device_train_batch_size"]  # the same prompts per step
            assert match == pair_specs(run, "paper")[1]["config"]  # the pair protocol's own match
            # One grid for the pair, from its own steps: A*-PO is evaluated along the way, not only at both ends.
            assert match["eval_steps"] == config["eval_steps"] and planned_steps(run) // config["eval_steps"] >= 4
    with pytest.raises(StudyError, match="num_generations of a GRPO run is matched to its A\\*-PO run"):
        sweep_specs(base, {"method": ["a2po", "grpo"], "num_generations": [4, 8]}, [])


def test_an_equal_time_sweep_keeps_its_grid_of_seconds():
    # Runs of 8 and 64 prompts per step on one grid of steps would be read at very different times.
    budget = {"max_train_seconds": 240.0, "eval_every_seconds": 30.0, "max_steps": -1, "num_train_epochs": 20.0}
    base = with_defaults({"name": "clock", "config": budget})
    runs = sweep_specs(base, {"per_device_train_batch_size": [8, 64]}, [0])
    assert [(r["config"].get("eval_steps"), r["config"]["eval_every_seconds"]) for r in runs] == [(None, 30.0)] * 2
    assert {r["config"]["max_train_seconds"] for r in runs} == {240.0}


EIGHT_FIELDS = ["learning_rate", "beta1", "beta2", "warmup_steps", "weight_decay", "max_grad_norm", "top_p",
                "temperature"]
HUGE_GRID = {name: [round(0.01 * (i + 1), 3) for i in range(12)] for name in EIGHT_FIELDS}  # 12^8 = 430 M points


def refused_cheaply(call) -> str:
    """What `call` answered, after checking it took well under a second and allocated next to nothing."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        answer = call()
    finally:
        seconds = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert seconds < 0.5 and peak < 1_000_000, (seconds, peak)
    return answer


def test_a_grid_past_the_run_limit_is_refused_before_any_run_is_made():
    base = with_defaults({"name": "big"})
    sweep_specs(base, {"beta2": [0.001]}, [])  # the config classes are loaded once, outside the measure

    def refused() -> str:
        with pytest.raises(StudyError) as error:
            sweep_specs(base, HUGE_GRID, [])
        return str(error.value)

    assert "429981696 grid points x 1 seeds" in refused_cheaply(refused)


@pytest.fixture(scope="module")
def handlers(tmp_path_factory, tiny_model_dir) -> Iterator[dict[str, object]]:
    """The API's endpoints and the Launch page's handlers by name, called as Gradio calls them, without a server: the
    studio's Services on SQLite, its queue never started."""
    data_dir = tmp_path_factory.mktemp("handlers")
    store = Store(data_dir / "studio.db")
    scheduler = Scheduler(store, data_dir)
    services = Services(store, scheduler, data_dir, policy=Policy(data_dir, model_roots=[tiny_model_dir]))
    with gr.Blocks() as demo:
        register_api(services)
        build_launch_page(services)
    found: dict[str, object] = {}
    for block_fn in demo.fns.values():
        found.setdefault(getattr(block_fn.fn, "__name__", ""), block_fn)
    try:
        yield found
    finally:
        scheduler.close()


def test_the_launch_pages_sweep_plan_refuses_a_huge_grid_at_no_cost(handlers):
    plan = handlers["plan_sweep"]
    grid_box = next(c for c in plan.inputs if c.elem_id == "sweep-grid")

    def planned(text: str) -> str:
        return plan.fn({c: text if c is grid_box else c.value for c in plan.inputs})

    assert planned("beta2: 0.001, 0.01").startswith("**2 runs**")
    text = "\n".join(f"{name}: " + ", ".join(map(str, values)) for name, values in HUGE_GRID.items())
    assert "429981696 grid points" in refused_cheaply(lambda: planned(text))


def test_the_launch_pages_sweep_plan_says_what_halving_makes_and_needs(handlers):
    plan = handlers["plan_sweep"]
    boxes = {c.elem_id: c for c in plan.inputs}

    def planned(budget: float | None) -> str:
        values = {c: c.value for c in plan.inputs}
        values.update({boxes["sweep-grid"]: "learning_rate: 1e-5, 2e-5, 3e-5, 5e-5, 1e-4, 2e-4",
                       boxes["sweep-halving"]: True, boxes["field-max_train_flops"]: budget,
                       boxes["field-num_train_epochs"]: 20})
        return plan.fn(values)

    assert "halving stops points at shares of a budget" in planned(None)
    assert planned(2e13).startswith("**Halving:** 6 points at rung 0") and "at most 9 runs" in planned(2e13)


@pytest.mark.parametrize("endpoint, arguments, message", [
    ("launch_study", {"grid": {"beta2": [0.001], " beta2 ": [0.01]}}, "grid: 'beta2' is given twice"),
    ("launch_study", {"grid": {"beta2": [0.001]}, "seeds": [True, False]}, "seeds: True is not a whole number"),
    ("launch_pair", {"seeds": [10**400]}, "seeds: about 10\\*\\*400 is not a whole number from 0 to 4294967295"),
    ("launch_pair", {"seeds": [0, True]}, "seeds: True is not a whole number"),
    ("launch_pair", {"protocol": "time", "budget_minutes": [1]}, "budget_minutes: give each run's training time"),
    ("launch_pair", {"protocol": "time", "budget_minutes": "abc"}, "budget_minutes: .* \\(got 'abc'\\)"),
    ("launch", {"seeds": [1, False]}, "seeds: False is not a whole number"),
], ids=["grid-keys-trimmed-first", "bool-seeds-sweep", "huge-seed", "bool-seed-pair", "budget-list", "budget-text",
        "bool-seed-launch"])
def test_a_study_input_the_studio_cannot_read_is_refused_naming_the_argument(handlers, tiny_model_dir, endpoint,
                                                                            arguments, message):
    spec = tiny_spec(tiny_model_dir, "inputs")
    with pytest.raises(gr.Error, match=message):
        handlers[endpoint].fn(spec=spec, request=None, **arguments)


def test_the_estimate_is_stage_one_once_plus_each_runs_steps_at_the_measured_rates():
    base = with_defaults({"name": "e", "config": {"max_steps": 10, "per_device_train_batch_size": 8}})
    specs = sweep_specs(base, {"beta2": [1e-3, 1e-2]}, [0, 1])
    done = dict(base, config={**base["config"], "max_steps": 20})
    # 20 steps of 8 sequences in 40 s: 0.25 s a sequence; stage 1: 256 prompts x 8 samples in 204.8 s: 0.1 s each.
    history = [(done, {"train_seconds": 40.0, "step": 20.0, "values/train/runtime": 204.8})]
    assert estimate_seconds(specs, history) == pytest.approx(204.8 + 4 * 10 * 8 * 0.25)
    assert estimate_seconds(specs, []) is None
    other_model = [(dict(done, model="another"), history[0][1])]
    assert estimate_seconds(specs, other_model) is None


# ---------------------------------------------------------------------------------------------------------------
# The study's table, by hand


def _run(run_id: int, point: dict, seed: int, method: str = "a2po", status: str = "finished",
         value_set: int = 1) -> dict:
    grid = {"beta2": [0.001, 0.01], "learning_rate": [1e-5, 2e-5]}
    return {"id": run_id, "name": f"r{run_id}", "status": status, "value_set_id": value_set,
            "config": {"method": method, "config": {"seed": seed, "values_seed": 0},  # a sweep's runs share stage 1
                       "study": {"id": "s", "name": "sw", "kind": "sweep", "seed": seed, "seeds": 2, "point": point,
                                 "grid": grid}}}


def _line(run_id: int, accuracies: list[float], stage1: tuple[float, int] = (0.0, 0), status: str = "finished",
          method: str = "a2po") -> Timeline:
    points = [Point(step=4 * i, seconds=10.0 * i, tokens=100 * i, accuracy=a) for i, a in enumerate(accuracies)]
    return Timeline(run_id, f"r{run_id}", method, status, points, stage1_seconds=stage1[0], stage1_tokens=stage1[1])


def test_the_table_holds_medians_over_seeds_the_best_point_and_the_heatmap():
    points = [{"beta2": b, "learning_rate": lr} for b in (0.001, 0.01) for lr in (1e-5, 2e-5)]
    finals = {0: (0.5, 0.7), 1: (0.6, 0.8), 2: (0.2, 0.3), 3: (0.9, 0.4)}  # per point: seed 0's and seed 1's
    runs, lines = [], []
    for i, point in enumerate(points):
        for seed in (0, 1):
            run_id = 10 * i + seed
            runs.append(_run(run_id, point, seed))
            stage1 = (30.0, 1000) if run_id == 0 else (0.0, 0)  # the first run sampled stage 1 for everyone
            lines.append(_line(run_id, [0.0, 0.95 if (i, seed) == (3, 0) else 0.1, finals[i][seed]], stage1))
    found = summary.summarize(runs, lines)
    assert [r.label for r in found.rows] == ["beta2=0.001, learning_rate=1e-05", "beta2=0.001, learning_rate=2e-05",
                                            "beta2=0.01, learning_rate=1e-05", "beta2=0.01, learning_rate=2e-05"]
    first = found.rows[0]
    assert first.final == pytest.approx(0.6) and first.final_range == (0.5, 0.7)
    assert first.training_seconds == pytest.approx(20.0 + 15.0)  # the median of 20 + 30 and 20 + 0
    assert found.rows[3].best == pytest.approx((0.95 + 0.4) / 2) and found.rows[3].best_step == pytest.approx(6.0)
    assert found.best is found.rows[1]  # the highest median final accuracy: 70%
    table = found.table()
    assert table[1][""] == "★" and table[1]["final accuracy (median, range)"] == "70.0% (60.0%–80.0%)"
    assert table[0]["seeds finished"] == "2 of 2"
    # Points that share their fields get a column per field with the value alone, so a wide grid's row fits a page.
    assert [(row["beta2"], row["learning_rate"]) for row in table] == [("0.001", "1e-05"), ("0.001", "2e-05"),
                                                                       ("0.01", "1e-05"), ("0.01", "2e-05")]
    assert "grid point" not in table[0]
    assert found.heatmap.x_field == "learning_rate" and found.heatmap.y_field == "beta2"
    assert found.heatmap.z == [[pytest.approx(0.6), pytest.approx(0.7)], [pytest.approx(0.25), pytest.approx(0.65)]]
    assert found.stage_one == {"a2po_runs": 8, "value_sets": 1, "sampled_runs": 1, "saved_tokens": 7000.0,
                               "saved_seconds": 210.0}
    assert "saved 7,000 completion tokens and 3m 30s of sampling" in summary.savings_line(found)
    # A run still queued has no V* set yet: it counts in the set its spec samples, not as a set of its own.
    waiting = [dict(r, value_set_id=None, status="queued") if r["id"] == 31 else r for r in runs]
    assert summary.stage_one_savings(waiting, lines)["value_sets"] == 1
    # A point with a run still going is not the best yet.
    runs[2]["status"] = "running"
    lines[2] = _line(10, [0.0, 0.1], status="running")
    again = summary.summarize(runs, lines)
    assert again.best is again.rows[3] and again.table()[1]["seeds finished"] == "1 of 2"
    assert again.table()[1]["final accuracy (median, range)"] == "80.0%"  # one finished seed: no range to show


def test_the_cli_table_has_a_row_per_point_with_the_median_and_range():
    results = [{"point_label": "beta2=0.1", "final_accuracy": a, "best_accuracy": a, "best_step": 4,
                "training_seconds": 10.0, "completion_tokens": 100} for a in (0.2, 0.4, 0.3)]
    results.append({"point_label": "beta2=1", "final_accuracy": None, "best_accuracy": None, "best_step": None,
                    "training_seconds": None, "completion_tokens": None})
    table = summarize_sweep(results)
    assert table[0]["final_accuracy"] == pytest.approx(0.3) and (table[0]["final_min"], table[0]["final_max"]) == (
        0.2, 0.4) and table[0]["seeds"] == 3
    assert table[1]["final_accuracy"] is None


# ---------------------------------------------------------------------------------------------------------------
# The real thing: a studio, its API and its Studies page


@pytest.fixture(scope="module")
def swept(tmp_path_factory, tiny_model_dir) -> Iterator[tuple[str, Path, dict]]:
    """`/launch_study` on a studio with the tiny model: beta2 x learning_rate = 2 x 1 points, run seeds 0 and 1,
    every run finished."""
    data_dir = tmp_path_factory.mktemp("studio-sweep")
    proc = start_app(data_dir, port := free_port(), "--model-root", tiny_model_dir)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        spec = tiny_spec(tiny_model_dir, "sw", max_steps=2, learning_rate=1e-3)
        launched = client.predict(spec=spec, grid={"beta2": [0.001, 0.01], "learning_rate": [0.001]},
                                  seeds=[0, 1], api_name="/launch_study")
        for run in launched["runs"]:
            wait_for(lambda r=run: client.predict(run_id=r["run_id"], api_name="/status")["status"]
                     in ("finished", "failed"), timeout=600, what=f"run {run['name']} to end")
        yield f"http://127.0.0.1:{port}/", data_dir, launched
    finally:
        stop_app(proc)


def test_a_study_through_the_api_samples_stage_one_once(swept):
    _, data_dir, launched = swept
    assert [(r["point"], r["seed"]) for r in launched["runs"]] == [
        ({"beta2": 0.001, "learning_rate": 0.001}, 0), ({"beta2": 0.001, "learning_rate": 0.001}, 1),
        ({"beta2": 0.01, "learning_rate": 0.001}, 0), ({"beta2": 0.01, "learning_rate": 0.001}, 1)]
    assert launched["stage1"] == {"value_sets": 1, "a2po_runs": 4, "saved_runs": 3}
    store = Store(data_dir / "studio.db")
    runs = [store.get_run(r["run_id"]) for r in launched["runs"]]
    assert all(r["status"] == "finished" for r in runs), [(r["id"], r["status"], r["error"]) for r in runs]
    assert len({r["value_set_id"] for r in runs}) == 1  # every run's V* rows are those of one set
    lines = [store_timeline(store, r) for r in runs]
    tokens = [line.stage1_tokens for line in lines]
    # The first sampled; the others read its rows, and each is charged what sampling them cost (equal time).
    assert tokens[0] > 0 and tokens[1:] == [tokens[0]] * 3, tokens
    assert [line.stage1_reused_tokens for line in lines] == [0] + [tokens[0]] * 3
    for run in runs[1:]:
        assert any("0 of 8 prompts to sample" in log["message"] for log in store.get_logs(run["id"])), run["id"]
    found = summary.summarize(runs, [store_timeline(store, r) for r in runs])
    assert [len(r.run_ids) for r in found.rows] == [2, 2] and found.best is not None
    assert found.stage_one["sampled_runs"] == 1 and found.stage_one["saved_tokens"] == 3 * tokens[0]


READ_TABLE = """(id) => Array.from(document.querySelectorAll(`#${id} [role=row][aria-rowindex]`))
    .map(row => Array.from(row.querySelectorAll('[role=gridcell], [role=columnheader]'))
        .map(cell => cell.innerText.trim()))"""
READ_HEATMAP = """(id) => {
    const plot = document.querySelector(`#${id} .js-plotly-plot`);
    return plot ? plot.data.map(t => ({type: t.type, x: t.x, y: t.y, z: t.z, text: t.text})) : null;
}"""


def test_the_studies_page_shows_the_medians_and_the_heatmap(swept):
    url, data_dir, launched = swept
    store = Store(data_dir / "studio.db")
    runs = [store.get_run(r["run_id"]) for r in launched["runs"]]
    found = summary.summarize(runs, [store_timeline(store, r) for r in runs])
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.set_default_timeout(TIMEOUT_MS)
            playwright.expect.set_options(timeout=TIMEOUT_MS)
            page.goto(url, wait_until="load")
            page.wait_for_selector("#main-tabs")
            open_tab(page, "Studies")
            page.locator("#study-picker input").click()
            page.get_by_role("option", name="sw: sweep over beta2 x learning_rate", exact=False).click()
            playwright.expect(page.locator("#study-header")).to_contain_text("Sweep sw")
            playwright.expect(page.locator("#study-stage-one")).to_contain_text("stage 1 was sampled by 1 run")
            page.wait_for_function("() => document.querySelectorAll('#study-table [role=row][aria-rowindex]')"
                                   ".length >= 3")
            rows = page.evaluate(READ_TABLE, "study-table")
            header, body = [h.replace("\u200b", "") for h in rows[0]], rows[1:]  # names break at underscores
            column = header.index("final accuracy (median, range)")
            assert [(r[header.index("beta2")], r[header.index("learning_rate")]) for r in body] == [
                tuple(show_value(v) for v in row.point.values()) for row in found.rows]
            assert [r[column] for r in body] == [row.table_row(False)["final accuracy (median, range)"]
                                                 for row in found.rows]
            assert [r[header.index("seeds finished")] for r in body] == ["2 of 2", "2 of 2"]
            page.wait_for_selector("#study-heatmap .js-plotly-plot")
            traces = page.evaluate(READ_HEATMAP, "study-heatmap")
            assert traces[0]["type"] == "heatmap"
            assert traces[0]["y"] == ["0.001", "0.01"] and traces[0]["x"] == ["0.001"]
            assert [row[0] for row in traces[0]["z"]] == pytest.approx([row.final for row in found.rows])
            playwright.expect(page.locator("#study-best")).to_contain_text("Best point")
            shoot(page, "studies")

            # The best point kept as a preset of this studio, then loaded from the Launch page's preset list.
            best = found.best
            page.locator("#study-preset-name textarea, #study-preset-name input").first.fill("best-sw")
            page.locator("#study-save-preset").click()
            playwright.expect(page.locator("#study-message")).to_contain_text("Saved as preset 'best-sw'")
            assert json.loads((data_dir / "presets" / "best-sw.json").read_text())["config"]["beta2"] == \
                best.point["beta2"]
            page.locator("#study-clone-best").click()
            playwright.expect(page.locator("#launch-status")).to_contain_text(f"Cloned run #{best.run_ids[0]}")
            open_tab(page, "Runs")
            open_tab(page, "Launch")
            page.locator("#field-preset input").click()
            page.get_by_role("option", name="Saved: best-sw").click()
            playwright.expect(page.locator("#launch-status")).to_contain_text("Loaded preset best-sw")
            assert float(page.locator("#field-beta2 input").first.input_value()) == pytest.approx(best.point["beta2"])
        finally:
            browser.close()


# ---------------------------------------------------------------------------------------------------------------
# Two devices: the second run waits for the first one's stage 1


def test_on_two_devices_a_run_waits_for_the_stage_one_it_shares_instead_of_sampling_it_too(tmp_path, tiny_model_dir):
    from app.runtime.devices import Devices
    from app.runtime.scheduler import Scheduler

    data_dir = tmp_path / "data"
    store = Store(data_dir / "studio.db")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    manager = Scheduler(store, data_dir, devices=Devices(gpus=("0", "1")), poll_interval=0.1, worker_env=env)
    try:
        specs = sweep_specs(tiny_spec(tiny_model_dir, "two", max_steps=2, num_value_samples=8), {"beta2": [1e-3, 1e-2]},
                            [])
        ids = [manager.submit(spec) for spec in specs]
        manager.start()
        for run_id in ids:
            wait_for(lambda i=run_id: store.get_run(i)["status"] in ("finished", "failed"), timeout=300,
                     what=f"run {run_id} to end")
        first, second = (store.get_run(i) for i in ids)
        assert first["status"] == second["status"] == "finished", (first["error"], second["error"])
        sampled = [log["created_at"] for log in store.get_logs(first["id"]) if "Stage 1 (eval) done" in log["message"]]
        assert second["started_at"] >= sampled[0] - 1.0, "the second run started while the first was sampling"
        assert any("0 of 8 prompts to sample" in log["message"] for log in store.get_logs(second["id"]))
        paid, charged = store_timeline(store, first), store_timeline(store, second)
        assert paid.stage1_reused_tokens == 0 and charged.stage1_reused_tokens == charged.stage1_tokens == \
            paid.stage1_tokens > 0
    finally:
        manager.close()


# ---------------------------------------------------------------------------------------------------------------
# The command line


def test_the_cli_sweep_shares_stage_one_prints_the_table_and_skips_what_it_ran(tmp_path, tiny_model_dir):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "sweep"
    args = [sys.executable, "-m", "a2po", "sweep", "--model", tiny_model_dir, "--grid", "beta2=0.001,0.01",
            "--seeds", "0", "1", "--num_prompts", "8", "--eval_size", "4", "--num_value_samples", "2",
            "--max_completion_length", "4", "--per_device_train_batch_size", "4", "--max_steps", "2", "--use_cpu",
            "true", "--save_strategy", "no", "--filter_all_incorrect", "false", "--output_dir", str(out),
            "--run_name", "cli"]
    result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[4/4] beta2=0.01, seed 1" in result.stdout
    lines = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines()]
    assert [(r["point_label"], r["seed"]) for r in lines] == [("beta2=0.001", 0), ("beta2=0.001", 1),
                                                           ("beta2=0.01", 0), ("beta2=0.01", 1)]
    assert lines[0]["stage1_tokens"] > 0 and [r["stage1_tokens"] for r in lines[1:]] == [0, 0, 0]
    assert all(r["final_accuracy"] is not None and r["steps"] == 2 for r in lines)
    table = json.loads((out / "summary.json").read_text())
    assert [(r["point"], r["seeds"]) for r in table] == [("beta2=0.001", 2), ("beta2=0.01", 2)]
    assert "stage 1 sampled for 1 V* set(s)" in result.stdout and "grid point" in result.stdout
    again = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count("done earlier") == 4, again.stdout[-2000:]
    refused = subprocess.run([*args[:4], "--grid", "seed=1,2"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode != 0 and "seed cannot be swept" in refused.stderr
